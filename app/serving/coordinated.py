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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app import pieces_cache
from app.compute import stage_compute
from app.config import Hop, WorkerConfig, format_address, parse_address
from app.errors import ConfigError, PiecesError
from app.identity import Identity, default_identity_dir
from app.links.paths import (
    IceConfigSource,
    LinkDialer,
    advertised_candidates,
    node_router,
    serve_ice_offers,
)
from app.node_status import (
    NodeStatus,
    ServeState,
    StatusReport,
    plain_reason,
    swarm_answer,
)
from app.progress import print_progress
from app.serving import standby as standby_stage
from app.serving.machine.vram import check_within_cap
from app.serving.rules.beats import BeatPolicy, beat_delay
from app.serving.serve import LoadedStage, start_worker
from app.serving.worker import StageWorker
from coordinator.client.downloads import DownloadProgress
from coordinator.client.mirror import fetch_pieces
from coordinator.client.session import CoordinatorClient
from coordinator.contract import (
    Assignment,
    Heartbeat,
    HeartbeatAnswer,
)
from coordinator.errors import CoordinatorError
from coordinator.releases import update_notice
from core.admission import LLAMA_MAX_SEQ
from core.hardware import detect_hardware, memory_in_use
from core.types import LayerRange
from net import reach_probe
from net.quic.links import DEFAULT_LIBRARY, QuicTuning
from net.rate import Throttle, upload_throttle
from net.wire.versions import this_release

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
BEATS = BeatPolicy(every_s=HEARTBEAT_S)
STANDBY_BEAT_S = 0.5
"""A spare standing by asks this often: its promotion reaches it on its next heartbeat,
and a takeover should not wait most of a heartbeat period for it (spares are few)."""
MEMORY_EVERY_S = 30.0
"""How often a serving stage re-reads its memory for the heartbeat and the status window:
each read opens and closes NVML, which costs far more than the heartbeat itself on a PC
with an NVIDIA driver, and a loaded stage's memory hardly moves."""


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
    """The volunteer's cap on what this node's links send; 0: none."""
    available_until: float = 0.0
    """When the volunteer said this PC stops serving (Unix seconds; 0: not said): told to
    the coordinator, which keeps a spare ready for this stage first."""
    reproducible: bool = False
    """Each session's rows in a llama_decode of their own (WorkerConfig.reproducible):
    a greedy answer equals the one it gives alone, whatever else the stage batches."""
    row_budget: int = 0
    """Rows per engine step, as the volunteer set it (WorkerConfig.row_budget, not
    measured at start); 0: measured at start."""


def stage_sizing(assignment: Assignment, most: int) -> tuple[int, int]:
    """Sessions and KV positions of the stage, as the coordinator planned them (its
    assignment), so placement's memory count is what the worker allocates; `most` is the
    volunteer's own limit on sessions (0: none), llama.cpp's 256 the hard one."""
    sessions = min(assignment.max_sessions, most or LLAMA_MAX_SEQ, LLAMA_MAX_SEQ)
    sessions = max(1, sessions)
    return sessions, sessions * max(1, assignment.context_tokens)


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


def _beat(client: CoordinatorClient, report: Heartbeat) -> HeartbeatAnswer:
    return client.heartbeat(report)


FIRST_PROGRESS_BEAT_S = 0.5
"""The first heartbeat of a download comes this soon: its size is known by then, and the
operator's timeline shows a short download too."""


class _BeatsMeanwhile:
    """Heartbeats while a stage is downloaded and loaded (an async context): the
    coordinator's timeline and page show the progress, and a long download does not
    look like a dead node. `now` is the heartbeat to send next; the answers are not
    read (the assignment is read again once the stage serves)."""

    def __init__(self, client: CoordinatorClient, now: Heartbeat) -> None:
        self.client, self.now = client, now
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _BeatsMeanwhile:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(FIRST_PROGRESS_BEAT_S)
        while True:
            try:
                await loop.run_in_executor(None, _beat, self.client, self.now)
            except CoordinatorError as exc:  # said again at the next beat
                log.info("heartbeat failed: %s", exc)
            await asyncio.sleep(HEARTBEAT_S)


async def _wait_for_assignment(
    client: CoordinatorClient,
    report_beat: Heartbeat,
    stop: asyncio.Event,
    report: StatusReport,
    base: NodeStatus,
    prepare: Callable[[Assignment], Awaitable[object]] | None = None,
) -> tuple[Assignment | None, LoadedStage | None]:
    """The assignment, and the standby stage pre-loaded for it when it is that stage."""
    loop = asyncio.get_running_loop()
    ready: Assignment | None = None
    fetching: asyncio.Task[object] | None = None
    while not stop.is_set():
        try:
            doing = "waiting" if ready is None else "standby"
            asking = replace(report_beat, activity=doing)
            beat = await loop.run_in_executor(None, _beat, client, asking)
            if beat.assignment is not None:
                # The standby stage promoted: served as pre-loaded. Another stage: the
                # pre-load is freed (a download resumes later where it stopped).
                same = ready is not None and beat.assignment.layers == ready.layers
                return beat.assignment, await standby_stage.take(fetching, same)
            report(replace(base, state=ServeState.WAITING))
            if beat.standby is not None and beat.standby != ready and prepare is not None:
                # A warm spare: the stage most at risk gets its pieces now, beside the
                # heartbeats (a long download must not look like a dead node), so
                # taking that stage over costs a load, not a download. The last pre-load
                # (another stage: the risk moved) is stopped or freed first: a spare the
                # soak re-targeted eight times held every stage it had built (428 MB).
                standby_stage.free(await standby_stage.take(fetching, False))
                ready = beat.standby
                fetching = asyncio.ensure_future(_standby(prepare, ready))
        except CoordinatorError as exc:
            log.warning("coordinator: %s", exc)
            report(replace(base, state=ServeState.WAITING, error=plain_reason(exc)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S if ready is None else STANDBY_BEAT_S)
    standby_stage.free(await standby_stage.take(fetching, False))
    return None, None


async def _standby(prepare: Callable[[Assignment], Awaitable[object]], ready: Assignment) -> object:
    try:
        done = await prepare(ready)
    except (CoordinatorError, OSError, PiecesError) as exc:
        log.warning("could not get the standby stage's pieces ready: %s", exc)
        return None
    log.info("standing by for %s: pieces ready", LayerRange(*ready.layers))
    print(f"STANDBY {LayerRange(*ready.layers)}", flush=True)
    return done


async def prepare_pieces(
    identity: Identity,
    client: CoordinatorClient,
    assignment: Assignment,
    progress: Callable[[DownloadProgress], None] | None = None,
    download_bytes_per_s: int = 0,
    pieces_cap_bytes: int = 0,
) -> Path:
    """Download the assigned stage's pieces (verified) into the identity's cache, first
    evicting other stages' files to keep it under `pieces_cap_bytes` (PiecesCacheFull
    when it cannot); progress goes to `progress` (default: a line per finished piece on
    stderr)."""
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
    await loop.run_in_executor(
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
        ),
    )
    manifest.save(pieces_dir)
    return pieces_dir


async def serve_coordinated(
    options: CoordinatedOptions,
    stop: asyncio.Event,
    report: StatusReport = lambda _s: None,
    on_stopped: Callable[[StageWorker], None] | None = None,
) -> None:
    """The coordinated worker: heartbeat until assigned a stage, download its pieces,
    serve it, heartbeat (stats, RTT, renewal, revocations), and rebuild when the
    assignment changes; until `stop` is set. Each state goes to `report`; `on_stopped`
    sees each worker after it stopped. Used by `sangama worker --join` and the tray app.

    Before a stage is freed (stop, or another assignment) it takes no new sessions and
    lets the running ones finish for up to `options.drain_s`. Cancelling the task stops
    and frees the stage at once."""
    loop = asyncio.get_running_loop()
    identity = await loop.run_in_executor(None, Identity.load, options.identity_dir)
    identity = identity.with_coordinator(options.coordinator)
    base = NodeStatus(node_id=identity.node_id, coordinator=identity.coordinator)
    report(replace(base, state=ServeState.WAITING))
    client = identity.client()
    host, port = options.listen
    if port == 0:
        from app.ports import free_udp_port

        port = free_udp_port(host)  # kept across rebuilds: the coordinator knows this address
    address = options.advertise or format_address((host, port))
    capacity, hardware = await loop.run_in_executor(None, _capacity, options.vram_cap_bytes)
    report_beat = Heartbeat(
        address=address,
        capacity_bytes=capacity,
        vram_cap_bytes=options.vram_cap_bytes,
        hardware=hardware,
        available_until=options.available_until,
    )

    async def standby(ready: Assignment) -> LoadedStage | None:
        pieces = await prepare_pieces(
            identity,
            client,
            ready,
            lambda _p: None,
            options.download_bytes_per_s,
            pieces_cap_bytes=options.pieces_cap_bytes,
        )
        return await standby_stage.preload(stage_config(options, identity, port, ready, pieces))

    while not stop.is_set():
        # The coordinator places a node only once its address answered a probe
        # (net/reach_probe.py): answered from the port the stage will serve on, free
        # again before the stage binds it.
        responder = await reach_probe.open_responder(host, port)
        try:
            assignment, loaded = await _wait_for_assignment(
                client, report_beat, stop, report, base, standby
            )
        finally:
            if responder is not None:
                responder.close()
        if assignment is None:
            return
        layers = LayerRange(*assignment.layers)
        # Timestamped with -v: bench/spare_takeover.py splits a takeover at these lines.
        log.info("assigned %s (%s)", layers, "pre-loaded" if loaded else "to load")
        status = replace(
            base,
            state=ServeState.DOWNLOADING,
            layers=(layers.start, layers.stop),
            model=assignment.model,
            address=address,
        )
        report(status)

        meanwhile = _BeatsMeanwhile(client, replace(report_beat, activity="downloading"))

        def on_progress(
            p: DownloadProgress,
            status: NodeStatus = status,
            meanwhile: _BeatsMeanwhile = meanwhile,
        ) -> None:
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

        async with meanwhile:
            pieces_dir = await prepare_pieces(
                identity,
                client,
                assignment,
                on_progress,
                options.download_bytes_per_s,
                pieces_cap_bytes=options.pieces_cap_bytes,
            )
            if stop.is_set():  # paused while downloading: nothing to load
                standby_stage.free(loaded)
                return
            report(replace(status, state=ServeState.LOADING, progress=1.0))
            meanwhile.now = replace(report_beat, activity="loading")
            hop = assignment.next_hop
            config = stage_config(options, identity, port, assignment, pieces_dir)
            if loaded is not None and not loaded.fits(config):
                standby_stage.free(loaded)
                loaded = None
            if loaded is None:
                print(f"LOADING {layers}", flush=True)
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
        try:
            serve_ice_offers(router, worker.server, ice)
            router.start()
            hop_text = f"{hop.node_id} at {hop.address}" if hop else ""
            compute = stage_compute(worker.stage)
            # The plan kept within the cap; this checks what was really allocated.
            check_within_cap(
                compute, options.vram_cap_bytes, await loop.run_in_executor(None, memory_in_use)
            )
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
                **(compute.heartbeat_fields() if compute else {}),
            )
            # Tell the coordinator before anyone is told "serving": a long download and
            # load can outlast its dead-node timeout, and a client asking for a route the
            # moment this stage serves must find it there.
            try:
                await loop.run_in_executor(None, _beat, client, stage_beat)
            except CoordinatorError as exc:
                log.warning("heartbeat failed: %s", exc)
            report(serving)
            log.info(
                "serving %s as %s on %s (%s)",
                layers,
                identity.node_id,
                address,
                compute.backend if compute is not None else "backend not reported",
            )
            identity, serving = await _heartbeats(
                identity, client, worker, assignment, stage_beat, stop, report, serving
            )
            # Stopping or moving: running conversations end here first, not mid-answer.
            leaving = ServeState.PAUSING if stop.is_set() else ServeState.MOVING
            left = await _finish_sessions(
                worker, options.drain_s, report, replace(serving, state=leaving)
            )
            if left:
                log.warning(
                    "%d sessions still open after %.0f s; ending them", left, options.drain_s
                )
        finally:
            router.on_new_offer = None  # the router may live on for this node's chat
            await router.stop()
            await worker.stop()
            if on_stopped is not None:
                on_stopped(worker)


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
        listen=(options.listen[0], port),
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


async def _heartbeats(
    identity: Identity,
    client: CoordinatorClient,
    worker: StageWorker,
    assignment: Assignment,
    report_beat: Heartbeat,
    stop: asyncio.Event,
    report: StatusReport,
    serving: NodeStatus,
) -> tuple[Identity, NodeStatus]:
    """Heartbeat while serving; return (the identity, renewed or not, and the last
    status) when `stop` is set or the coordinator assigns something else."""
    loop = asyncio.get_running_loop()
    hop_text = serving.next_hop
    last_tokens, last_rows, last_t = 0, 0, time.monotonic()
    memory, memory_at = await loop.run_in_executor(None, memory_in_use), time.monotonic()
    while not stop.is_set():
        if await _until_next_beat(stop, worker, last_t):
            break
        stats = worker.stats
        identity = await _renew_if_due(identity, client, worker)
        rtt = await worker.next_hop_rtt()
        rtt_ms = next(iter(rtt.values()), None)
        rtt = {**await worker.ring_rtt(), **rtt}  # the ring's links back to first stages too
        if time.monotonic() - memory_at >= MEMORY_EVERY_S:
            memory, memory_at = await loop.run_in_executor(None, memory_in_use), time.monotonic()
        now = time.monotonic()
        capacity = worker.capacity
        beat_report = replace(
            report_beat,
            sessions=capacity.sessions,
            max_sessions=capacity.max_sessions,
            kv_budget_bytes=capacity.budget_bytes,
            kv_reserved_bytes=capacity.reserved_bytes,
            rtt_ms=rtt,
            step_ms=worker.step_times(),
            row_budget=worker.row_budget,
            path=worker.next_hop_path,
            tokens=stats.tokens - last_tokens,  # the coordinator sums these per period
            compute_ms=stats.last_compute_ms,
            stats={
                "compute_ms": stats.last_compute_ms,
                "steps": stats.steps,
                "sessions": stats.sessions_opened,
                "errors": stats.errors,
                "rtt_ms": rtt_ms,
                "relinks": worker.next_hop_relinks,
                "queue_ms": stats.last_queue_ms,
                "memory_bytes": memory.bytes,
                "memory_kind": memory.kind,
                "resumed": stats.sessions_resumed,
                "rows": stats.rows,
                "rows_reused": stats.rows_reused,
                "rows_one_by_one": stats.rows_one_by_one,
                "adopted": stats.sessions_adopted,
            },
        )
        serving = replace(
            serving,
            sessions=stats.sessions_opened,
            running=worker.session_count,
            steps=stats.steps,
            errors=stats.errors,
            throughput=(stats.rows - last_rows) / max(now - last_t, 1e-6),
            compute_ms=stats.last_compute_ms,
            queue_ms=stats.last_queue_ms,
            memory=memory.describe(),
            rtt_ms=rtt_ms,
            next_hop=f"{hop_text} ({worker.next_hop_path})" if hop_text else "",
        )
        report(serving)
        last_tokens, last_rows, last_t = stats.tokens, stats.rows, now
        try:
            beat = await loop.run_in_executor(None, _beat, client, beat_report)
        except CoordinatorError as exc:
            log.warning("heartbeat failed: %s", exc)
            continue
        worker.set_revoked(frozenset(int(s) for s in beat.revoked_serials))
        # Shown from the next report on (the tray's status window, `sangama status`).
        serving = replace(
            serving,
            swarm=swarm_answer(beat.can_answer, beat.answer_since, beat.answer_reason),
            update=update_notice(this_release(), beat.latest_release, beat.min_release),
        )
        if beat.assignment != assignment:
            moved = only_next_hop_moved(assignment, beat.assignment)
            if moved is not None and worker.retarget(moved):
                # Same layers, a spare where the next stage was: keep the loaded stage
                # (and the sessions' KV upstream of the gap) and forward to it.
                assert beat.assignment is not None
                assignment = beat.assignment
                hop_text = f"{moved.node_id} at {format_address(moved.address)}"
                log.info("next stage is now %s", hop_text)
                continue
            log.warning("assignment changed (%s -> %s); rebuilding", assignment, beat.assignment)
            break
    return identity, serving


async def _until_next_beat(stop: asyncio.Event, worker: StageWorker, last_beat: float) -> bool:
    """Wait until the next heartbeat is due (app.serving.rules.beats: sooner while sessions
    wait for the next stage); True when `stop` was set meanwhile."""
    while not stop.is_set():
        worker.hop_wanted.clear()  # before reading the state: a later change wakes us
        now, lost_at = time.monotonic(), worker.next_hop_lost_at
        lost_for = None if lost_at is None else now - lost_at
        delay = beat_delay(BEATS, now - last_beat, worker.next_hop_waiting, lost_for)
        if delay <= 0:
            return False
        waits = {asyncio.ensure_future(e.wait()) for e in (stop, worker.hop_wanted)}
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    return True


def only_next_hop_moved(old: Assignment, new: Assignment | None) -> Hop | None:
    """The new next hop when an assignment changed in nothing else, else None (pure)."""
    if new is None or old.next_hop is None or new.next_hop is None:
        return None
    if replace(new, next_hop=old.next_hop) != old:
        return None
    try:
        return Hop(new.next_hop.node_id, parse_address(new.next_hop.address))
    except ConfigError:
        return None  # an address that cannot be dialled: rebuild and report it there


async def _finish_sessions(
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


class _CliReport:
    """The headless worker's view of the states: the READY line tests and the demo parse,
    and lines on stderr for downloads and stage changes."""

    def __init__(self) -> None:
        self.last: ServeState | None = None
        self.tenths = -1

    def __call__(self, status: NodeStatus) -> None:
        tenths = int(status.progress * 10)
        if status.state is ServeState.DOWNLOADING and tenths != self.tenths:
            print(f"downloading: {tenths * 10}%", file=sys.stderr, flush=True)
            self.tenths = tenths
        if status.state is not self.last:
            if status.state is ServeState.SERVING and status.layers is not None:
                layers = LayerRange(*status.layers)
                print(f"READY {status.node_id} {status.address} {layers}", flush=True)
            elif status.state is ServeState.MOVING:
                print(
                    f"{status.node_id}: assignment changed; rebuilding the stage", file=sys.stderr
                )
            elif status.state is ServeState.PAUSING and status.finishing:
                print(
                    f"{status.node_id}: finishing {status.finishing} sessions before stopping",
                    file=sys.stderr,
                )
        self.last = status.state


CliReport = _CliReport
"""For the good-guest loop's headless report (app.serving.guest.loop)."""
