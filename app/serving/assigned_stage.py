"""The steps a coordinated worker takes with an assigned stage, each carrying out one of
app.serving.plan's actions: its pieces downloaded (`prepare_pieces`, Download), the
stage built and started (`start_stage`, Load), announced as serving (`go_live`), and
drained before it is freed (`finish_sessions`, Release). The worker's options and the
stage's sizing live here too, shared with the standby pre-load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app import pieces_cache
from app.compute import stage_compute
from app.config import Hop, WorkerConfig, parse_address
from app.identity import Identity, default_identity_dir
from app.links.paths import (
    IceConfigSource,
    LinkDialer,
    SignalRouter,
    advertised_candidates,
    node_router,
    serve_ice_offers,
)
from app.node_status import NodeStatus, ServeState, StatusReport
from app.ports import LOOPBACK, free_udp_port, outward_host
from app.progress import print_progress
from app.serving.heartbeats import BeatsMeanwhile, send_beat
from app.serving.machine.vram import check_within_cap
from app.serving.piece_server import PieceServer
from app.serving.serve import LoadedStage, start_worker
from app.serving.worker import StageWorker
from coordinator.client.downloads import DownloadProgress
from coordinator.client.mirror import FetchReport, fetch_pieces
from coordinator.client.peer_pieces import Peers, peers_of
from coordinator.client.session import CoordinatorClient
from coordinator.contract import Assignment, Heartbeat, PieceSource, SourceIncident
from coordinator.errors import CoordinatorError
from core.admission import LLAMA_MAX_SEQ
from core.hardware import detect_hardware, memory_in_use
from core.manifest import PieceInfo
from core.types import LayerRange
from net.quic.links import DEFAULT_LIBRARY, QuicTuning
from net.rate import Throttle, upload_throttle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoordinatedOptions:
    identity_dir: Path = field(default_factory=default_identity_dir)
    join_code: str | None = None
    listen: tuple[str, int] | None = None
    """Where the stage listens (UDP); None: this machine's address on its route to the
    coordinator (app.ports.outward_host: loopback for a coordinator on loopback, the LAN
    address behind a home router), on a free port."""
    advertise: str | None = None
    """Address peers should use, if not the listen address (port forward, public IP)."""
    vram_cap_bytes: int = 0
    """0: offer what the hardware has."""
    threads: int = 1
    cpus: str = ""
    """CPUs for the compute threads (WorkerConfig.cpus); "": the scheduler's choice."""
    max_sessions: int = 0
    """The volunteer's limit on sessions; 0: as many as the coordinator plans (<= 256)."""
    quic_library: str = DEFAULT_LIBRARY
    relay_only: bool = False
    """Reach peers only through the swarm's relay (as the seeds ran): tests, odd networks."""
    coordinator: str | None = None
    """Talk to this coordinator instead of the one stored with the identity (it moved)."""
    drain_s: float = 20.0
    """How long running sessions may take to finish before the stage is freed (stop, or a
    new assignment). Well under the coordinator's dead_after_s, which sees no heartbeat
    meanwhile."""
    download_bytes_per_s: int = 0
    """The volunteer's cap on piece downloads; 0: none."""
    pieces_cap_bytes: int = 0
    """The volunteer's cap on the pieces cache (app.pieces_cache.make_room); 0: the
    default share of the disk's free space."""
    upload_bytes_per_s: int = 0
    """The volunteer's cap on what this node's links send; 0: none. Its piece server
    sends within the same rate."""
    share_pieces: bool = True
    """Serve the pieces held to other swarm members (app.serving.piece_server) and
    fetch pieces from them first."""
    available_until: float = 0.0
    """When the volunteer said this PC stops serving (Unix seconds; 0: not said): told to
    the coordinator, which keeps a spare ready for this stage first."""
    reproducible: bool = False
    """Each session's rows in a llama_decode of their own (WorkerConfig.reproducible): no
    batching across sessions, for measuring what it gains."""
    row_budget: int = 0
    """Rows per engine step, as the volunteer set it (WorkerConfig.row_budget, not
    measured at start); 0: measured at start."""


def stage_sizing(assignment: Assignment, most: int) -> tuple[int, int]:
    """Sessions and KV positions of the stage, as the coordinator planned them (its
    assignment), so placement's memory count is what the worker allocates; `most` is the
    volunteer's own limit on sessions (0: none), llama.cpp's 256 the hard one. Positions
    are per session: each has a KV stream of its own."""
    sessions = min(assignment.max_sessions, most or LLAMA_MAX_SEQ, LLAMA_MAX_SEQ)
    sessions = max(1, sessions)
    return sessions, max(1, assignment.context_tokens)


def capacity(cap: int) -> tuple[int, dict[str, Any]]:
    """What this PC offers (bytes, within the volunteer's cap) and its hardware report."""
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


async def listen_address(options: CoordinatedOptions, coordinator: str) -> tuple[str, int]:
    """Where this node's stages listen, fixed once: kept across pauses and rebuilds, as
    the coordinator knows it. The host: `options.listen`'s, or this machine's address on
    its route to the coordinator; the port: `options.listen`'s, or a free one."""
    loop = asyncio.get_running_loop()
    if options.listen is None:
        toward = urlsplit(coordinator).hostname or LOOPBACK
        host, port = await loop.run_in_executor(None, outward_host, toward), 0
    else:
        host, port = options.listen
    return host, port or free_udp_port(host)


def stage_config(
    options: CoordinatedOptions,
    identity: Identity,
    port: int,
    assignment: Assignment,
    pieces_dir: Path,
) -> WorkerConfig:
    """The worker config of an assigned (or standby) stage."""
    hop = assignment.next_hop
    sessions, n_ctx = stage_sizing(assignment, options.max_sessions)
    return WorkerConfig(
        node_id=identity.node_id,
        listen=(options.listen[0] if options.listen else LOOPBACK, port),
        model=str(pieces_dir),
        layers=LayerRange(*assignment.layers),
        credentials=identity.directory,
        next_hop=Hop(hop.node_id, parse_address(hop.address)) if hop else None,
        threads=options.threads,
        cpus=options.cpus,
        max_sessions=sessions,
        n_ctx=n_ctx,
        quic_library=options.quic_library,
        device_cap_bytes=options.vram_cap_bytes,
        upload_bytes_per_s=options.upload_bytes_per_s,
        reproducible=options.reproducible,
        row_budget=options.row_budget or WorkerConfig.row_budget,
        calibrate_budget=options.row_budget == 0,
        # Where routes send clients (the heartbeat's address): a ring may point there.
        advertise=options.advertise or "",
    )


async def prepare_pieces(
    identity: Identity,
    client: CoordinatorClient,
    assignment: Assignment,
    progress: Callable[[DownloadProgress], None] | None = None,
    download_bytes_per_s: int = 0,
    pieces_cap_bytes: int = 0,
    shared: PieceServer | None = None,
) -> Path:
    """Download the assigned stage's pieces (verified) into the identity's cache, first
    evicting other stages' files to keep it under `pieces_cap_bytes` (PiecesCacheFull
    when it cannot); progress goes to `progress` (default: a line per finished piece on
    stderr). With `shared` (this node's piece server), pieces come from peers that hold
    them first, and once all are here `shared` serves them to the swarm."""
    loop = asyncio.get_running_loop()
    manifest = await loop.run_in_executor(None, client.manifest, assignment.manifest_url)
    layers = LayerRange(*assignment.layers)
    pieces_dir: Path = pieces_cache.pieces_dir(identity.directory, assignment.model)
    pieces_dir.mkdir(parents=True, exist_ok=True)
    needed = manifest.pieces_for(layers)
    await loop.run_in_executor(
        None,
        lambda: pieces_cache.make_room(
            identity.directory, assignment.model, manifest, layers, pieces_cap_bytes
        ),
    )
    report = progress or print_progress()
    fetched = await loop.run_in_executor(
        None,
        # Tensor bytes from the model's public mirror when the manifest names one (the
        # coordinator as fallback), from the coordinator otherwise.
        lambda: fetch_pieces(
            client.session,
            client.pieces_url(assignment),
            manifest.mirror,
            needed,
            pieces_dir,
            progress=report,
            throttle=Throttle(download_bytes_per_s) if download_bytes_per_s > 0 else None,
            peers=None if shared is None else _peers(identity, client, assignment.model),
        ),
    )
    manifest.save(pieces_dir)
    await loop.run_in_executor(None, report_incidents, client, fetched)
    if shared is not None:
        shared.offer(assignment.model, pieces_dir, manifest)
    return pieces_dir


MAX_INCIDENTS = 8
"""Bad sources one download tells the coordinator of, at most (the rest: in the log)."""


def report_incidents(client: CoordinatorClient, fetched: FetchReport) -> None:
    """The sources a download gave up on (the mirror, peers), to the operator's timeline;
    a coordinator that cannot take them loses nothing but the note."""
    found = [SourceIncident("mirror", fetched.demoted)] if fetched.demoted else []
    found += [SourceIncident(peer, why) for peer, why in fetched.peer_reasons]
    for incident in found[:MAX_INCIDENTS]:
        try:
            client.report_incident(incident)
        except CoordinatorError as exc:
            log.info("could not report the bad source %s: %s", incident.source, exc)


def _peers(identity: Identity, client: CoordinatorClient, model: str) -> Peers:
    def sources(piece: PieceInfo) -> tuple[PieceSource, ...]:
        return client.piece_sources(model, piece.file).sources

    return peers_of(identity.certified, identity.ca_pem, model, sources)


def download_progress(
    report: StatusReport, status: NodeStatus, meanwhile: BeatsMeanwhile
) -> Callable[[DownloadProgress], None]:
    """A download's progress, to the status and to the heartbeats sent meanwhile."""

    def on_progress(p: DownloadProgress) -> None:
        fraction = p.all_done_bytes / p.all_total_bytes if p.all_total_bytes else 1.0
        # Called on the download's thread: one attribute set, read by the beat task.
        meanwhile.now = replace(
            meanwhile.now,
            download_done_bytes=min(p.all_done_bytes, p.all_total_bytes),
            download_total_bytes=p.all_total_bytes,
        )
        report(
            replace(
                status,
                progress=min(1.0, fraction),
                downloaded_bytes=p.all_done_bytes,
                download_bytes=p.all_total_bytes,
            )
        )

    return on_progress


@dataclass(frozen=True)
class StartedStage:
    worker: StageWorker
    router: SignalRouter
    ice: IceConfigSource


async def start_stage(
    options: CoordinatedOptions,
    identity: Identity,
    client: CoordinatorClient,
    config: WorkerConfig,
    loaded: LoadedStage | None,
) -> StartedStage:
    """Start the stage's worker (on `loaded`, the stage a spare built ahead, if given),
    with links that reach peers directly, by ICE or through the relay."""
    loop = asyncio.get_running_loop()
    creds = identity.credentials()
    # Renews its relay credentials before they expire (they live under half an hour).
    ice = IceConfigSource(
        client, advertised_candidates(options.advertise), relay_only=options.relay_only
    )
    await loop.run_in_executor(None, ice.current)
    router = node_router(client)
    tuning = QuicTuning(
        library=options.quic_library,
        send_throttle=upload_throttle(options.upload_bytes_per_s),
    )
    link_dialer = LinkDialer(creds, router, ice, tuning, direct=not options.relay_only)
    log.info("starting the stage (%s)", "pre-loaded" if loaded else "loaded now")
    worker = await start_worker(config, creds, link_dialer.dial_with_path, loaded)
    log.info("stage started")
    return StartedStage(worker, router, ice)


async def go_live(
    started: StartedStage,
    client: CoordinatorClient,
    assignment: Assignment,
    report_beat: Heartbeat,
    vram_cap_bytes: int,
    status: NodeStatus,
    report: StatusReport,
) -> tuple[NodeStatus, Heartbeat]:
    """Take offers from peers, check the stage against the cap, and tell the coordinator,
    then the status, that it serves. The SERVING status and the stage's heartbeat."""
    loop = asyncio.get_running_loop()
    worker, router = started.worker, started.router
    serve_ice_offers(router, worker.server, started.ice)
    router.start()
    hop = assignment.next_hop
    hop_text = f"{hop.node_id} at {hop.address}" if hop else ""
    compute = stage_compute(worker.stage)
    # The plan kept within the cap; this checks what was really allocated.
    check_within_cap(compute, vram_cap_bytes, await loop.run_in_executor(None, memory_in_use))
    log.info("within the cap")
    serving = replace(
        status,
        state=ServeState.SERVING,
        progress=1.0,
        next_hop=hop_text,
        compute=compute,
    )
    # Fixed for the stage's life (the offload plan is made once, at load).
    stage_beat = replace(
        report_beat,
        activity="serving",
        # Its pieces are all here (it loaded them): served to peers, if it has a server.
        pieces_layers=assignment.layers if report_beat.pieces_address else (0, 0),
        **(compute.heartbeat_fields() if compute else {}),
    )
    # Tell the coordinator before anyone is told "serving": a long download and
    # load can outlast its dead-node timeout, and a client asking for a route the
    # moment this stage serves must find it there.
    try:
        await loop.run_in_executor(None, send_beat, client, stage_beat)
    except CoordinatorError as exc:
        log.warning("heartbeat failed: %s", exc)
    report(serving)
    return serving, stage_beat


async def finish_sessions(
    worker: StageWorker, timeout: float, report: StatusReport, leaving: NodeStatus
) -> int:
    """`worker.drain`, reporting how many sessions are still running as they end."""
    drain = asyncio.ensure_future(worker.drain(timeout))
    try:
        while True:
            report(replace(leaving, finishing=worker.session_count))
            done, _ = await asyncio.wait({drain}, timeout=0.5)
            if done:
                return drain.result()
    finally:
        drain.cancel()
