"""The route a joined client asks the coordinator for, with the tokenizer to use on it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from app import pieces_cache
from app.config import Route
from app.identity import Identity
from app.progress import print_progress
from coordinator.client.mirror import fetch_pieces
from coordinator.contract import manifest_path, pieces_path
from core.manifest import EMBEDDING


def route_avoiding(identity: Identity, avoid: tuple[str, ...], model: str = "default") -> Route:
    """The coordinator's route without the `avoid` nodes (a stage found dead mid-answer);
    CoordinatorError (NotFound) while the current plan still needs one of them."""
    answer = identity.client().route(model, avoid=avoid)
    return Route.from_dict(asdict(answer))


def fetch_route(identity: Identity, model: str = "default") -> tuple[Route, Path]:
    """The coordinator's current route, and a GGUF with the tokenizer (the embedding
    piece, downloaded and verified once)."""
    client = identity.client()
    answer = client.route(model)
    # Route.from_dict checks every address (ConfigError for one that cannot be dialled).
    route = Route.from_dict(asdict(answer))
    manifest = client.manifest(manifest_path(answer.model))
    pieces_dir = pieces_cache.pieces_dir(identity.directory, answer.model)
    (path,) = fetch_pieces(
        client.session,
        client.url(pieces_path(answer.model)),
        manifest.mirror,
        [manifest.piece(EMBEDDING)],
        pieces_dir,
        progress=print_progress(),
    ).paths
    return route, path
