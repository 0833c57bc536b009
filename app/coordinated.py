"""`sangama worker --join CODE` / `--identity DIR`: a worker the coordinator directs.

It joins (once), reports itself by heartbeat, waits for a stage assignment, downloads
only the pieces that stage needs, assembles its stage file, serves it with the next hop
the coordinator named, and keeps heartbeating (hardware, address, timings). When the
assignment changes, it rebuilds its stage. Headless: the tray app drives the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config import Hop, Route, WorkerConfig, format_address, parse_address
from app.identity import Identity, default_identity_dir, join_swarm
from app.links import (
    LinkDialer,
    SignalRouter,
    advertised_candidates,
    ice_config,
    serve_ice_offers,
)
from app.serve import report_stopped, start_worker, stop_event
from app.worker import StageWorker
from coordinator.client import CoordinatorClient
from coordinator.downloads import DownloadProgress, download_pieces, format_progress
from coordinator.errors import CoordinatorError
from core.hardware import detect_hardware
from core.manifest import EMBEDDING
from core.types import LayerRange
from net.quic import QuicTuning

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0


@dataclass(frozen=True)
class CoordinatedOptions:
    identity_dir: Path = field(default_factory=default_identity_dir)
    join_code: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 0)
    advertise: str | None = None
    """Address peers should use, if not the listen address (port forward, public IP)."""
    vram_cap_bytes: int = 0
    """0: offer what the hardware has."""
    threads: int = 1
    max_sessions: int = 8
    quic_library: str = "aioquic"
    relay_only: bool = False
    """Reach peers only through the swarm's relay (as the seeds ran): tests, odd networks."""


def _capacity(cap: int) -> tuple[int, dict[str, Any]]:
    hw = detect_hardware()
    usable = hw.usable_bytes
    hardware = {
        "gpus": [
            {"name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes}
            for g in hw.gpus
        ],
        "system_total_bytes": hw.system_total_bytes,
        "note": hw.note,
    }
    return (min(cap, usable) if cap > 0 else usable), hardware


def _print_progress() -> Callable[[DownloadProgress], None]:
    def show(p: DownloadProgress) -> None:
        if p.finished:
            print(format_progress(p), file=sys.stderr, flush=True)

    return show


RENEW_WHEN_LEFT = dt.timedelta(hours=8)


async def _renew_if_due(
    identity: Identity, client: CoordinatorClient, worker: StageWorker
) -> Identity:
    """Renew the node certificate by itself when a third of its life is left."""
    left = identity.certified.certificate.not_valid_after_utc - dt.datetime.now(dt.UTC)
    if left > RENEW_WHEN_LEFT:
        return identity
    loop = asyncio.get_running_loop()
    try:
        pem = await loop.run_in_executor(None, client.renew, identity.certified.private_key)
    except CoordinatorError as exc:
        log.warning("certificate renewal failed (will retry): %s", exc)
        return identity
    renewed = identity.save_certificate(pem)
    worker.update_credentials(renewed.credentials())
    log.info(
        "renewed the node certificate, valid until %s",
        renewed.certified.certificate.not_valid_after_utc,
    )
    return renewed


def _beat(client: CoordinatorClient, report: dict[str, Any]) -> dict[str, Any]:
    return client.heartbeat(**report)


async def _wait_for_assignment(
    client: CoordinatorClient, report: dict[str, Any], stop: asyncio.Event
) -> dict[str, Any] | None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            beat = await loop.run_in_executor(None, lambda: client.heartbeat(**report))
            if beat.get("assignment"):
                return dict(beat["assignment"])
        except CoordinatorError as exc:
            log.warning("coordinator: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
    return None


async def prepare_pieces(
    identity: Identity,
    client: CoordinatorClient,
    assignment: dict[str, Any],
    progress: Callable[[DownloadProgress], None] | None = None,
) -> Path:
    """Download the assigned stage's pieces (verified) into the identity's cache; progress
    goes to `progress` (default: a line per finished piece on stderr)."""
    loop = asyncio.get_running_loop()
    manifest = await loop.run_in_executor(None, client.manifest, assignment["manifest_url"])
    layers = LayerRange(*assignment["layers"])
    pieces_dir: Path = identity.directory / "pieces" / str(assignment["model"])
    pieces_dir.mkdir(parents=True, exist_ok=True)
    needed = manifest.pieces_for(layers)
    report = progress or _print_progress()
    await loop.run_in_executor(
        None,
        lambda: download_pieces(
            client.session, client.pieces_url(assignment), needed, pieces_dir, progress=report
        ),
    )
    manifest.save(pieces_dir)
    return pieces_dir


def fetch_route(identity: Identity, model: str = "default") -> tuple[Route, Path]:
    """The coordinator's current route, and a GGUF with the tokenizer (the embedding
    piece, downloaded and verified once)."""
    client = identity.client()
    doc = client.route(model)
    route = Route.from_dict({"model": doc["model"], "stages": doc["stages"]})
    base = f"/api/v1/models/{doc['model']}"
    manifest = client.manifest(f"{base}/manifest")
    pieces_dir = identity.directory / "pieces" / doc["model"]
    (path,) = download_pieces(
        client.session,
        f"{client.base_url}{base}/pieces",
        [manifest.piece(EMBEDDING)],
        pieces_dir,
        progress=_print_progress(),
    )
    return route, path


async def run(options: CoordinatedOptions) -> int:
    if options.join_code:
        identity = join_swarm(options.join_code, options.identity_dir)
        print(f"joined as {identity.node_id} ({identity.role})", file=sys.stderr, flush=True)
    else:
        identity = Identity.load(options.identity_dir)
    client = identity.client()
    stop = stop_event()
    host, port = options.listen
    if port == 0:
        from app.local_swarm import free_udp_port

        port = free_udp_port(host)
    address = options.advertise or format_address((host, port))
    capacity, hardware = _capacity(options.vram_cap_bytes)
    report: dict[str, Any] = {
        "address": address,
        "capacity_bytes": capacity,
        "vram_cap_bytes": options.vram_cap_bytes,
        "hardware": hardware,
    }
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        assignment = await _wait_for_assignment(client, report, stop)
        if assignment is None:
            break
        pieces_dir = await prepare_pieces(identity, client, assignment)
        hop = assignment.get("next_hop")
        config = WorkerConfig(
            node_id=identity.node_id,
            listen=(host, port),
            model=str(pieces_dir),
            layers=LayerRange(*assignment["layers"]),
            credentials=identity.directory,
            next_hop=Hop(hop["node_id"], parse_address(hop["address"])) if hop else None,
            threads=options.threads,
            max_sessions=options.max_sessions,
            quic_library=options.quic_library,
        )
        creds = identity.credentials()
        tuning = QuicTuning(library=options.quic_library)
        ice = await loop.run_in_executor(
            None, ice_config, client, advertised_candidates(options.advertise)
        )
        if options.relay_only:
            ice = ice.with_relay_only()
        router = SignalRouter(client)
        link_dialer = LinkDialer(creds, router, ice, tuning, direct=not options.relay_only)
        worker = await start_worker(config, creds, link_dialer.dial_with_path)
        serve_ice_offers(router, worker.server, ice)
        router.start()
        print(f"READY {identity.node_id} {address} {config.layers}", flush=True)
        last_tokens = 0
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
                    break
                except TimeoutError:
                    pass
                stats = worker.stats
                identity = await _renew_if_due(identity, client, worker)
                rtt = await worker.next_hop_rtt()
                beat_report = {
                    **report,
                    "rtt_ms": rtt,
                    "path": worker.next_hop_path,
                    "tokens": stats.tokens - last_tokens,
                    "compute_ms": stats.last_compute_ms,
                    "stats": {
                        "compute_ms": stats.last_compute_ms,
                        "steps": stats.steps,
                        "sessions": stats.sessions_opened,
                        "errors": stats.errors,
                        "rtt_ms": next(iter(rtt.values()), None),
                    },
                }
                last_tokens = stats.tokens
                try:
                    beat = await loop.run_in_executor(None, _beat, client, beat_report)
                except CoordinatorError as exc:
                    log.warning("heartbeat failed: %s", exc)
                    continue
                worker.set_revoked(frozenset(int(s) for s in beat.get("revoked_serials", [])))
                if beat.get("assignment") != assignment:
                    print(
                        f"{identity.node_id}: assignment changed; rebuilding the stage",
                        file=sys.stderr,
                    )
                    break
        finally:
            await router.stop()
            await worker.stop()
            report_stopped(worker)
    return 0


def run_coordinated(options: CoordinatedOptions) -> int:
    return asyncio.run(run(options))
