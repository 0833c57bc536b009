"""Where a node keeps the model pieces it downloads (and the stage file made from them).

Pieces are a cache: verified against the manifest, fetched again when missing. The desktop
app's default identity keeps them in the user cache dir (~/.cache/sangama/pieces on Linux),
which is where installers/README.md says they are and what `apt purge` with
/etc/sangama/purge-user-data removes; settings and identity stay in the config dir. A node
started with its own identity directory (`--identity-dir`, several nodes on one machine,
tests) keeps its pieces inside that directory, so such nodes never share half-written files.

The model name comes from the coordinator (an assignment, a route): it must be one safe
path component (coordinator.names), or a coordinator could have files written anywhere.
"""

from __future__ import annotations

from pathlib import Path

from app.identity import default_identity_dir
from coordinator.names import check_name
from core.models import cache_dir


def pieces_dir(identity_dir: Path, model: str) -> Path:
    """The folder for `model`'s pieces of the node whose identity lives in `identity_dir`.
    UnsafeName (a CoordinatorError) when `model` is not one safe path component."""
    check_name(model, "model name")
    if identity_dir.resolve() == default_identity_dir().resolve():
        return cache_dir() / "pieces" / model
    return identity_dir / "pieces" / model
