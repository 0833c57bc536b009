"""`sangama worker --join CODE` / `--identity DIR`: a worker the coordinator directs.

It joins (once), reports itself by heartbeat, waits for a stage assignment, downloads
only the pieces that stage needs, assembles its stage file, serves it with the next hop
the coordinator named, and keeps heartbeating (hardware, address, timings). When the
assignment changes, it rebuilds its stage. Headless: the tray app drives the same code.

What to do next is app.serving.plan's to say (a pure function of what the worker holds
and the coordinator's last answer); this module carries its actions out, with the
heartbeats of app.serving.heartbeats and the stage steps of app.serving.assigned_stage.
Each state goes to a `StatusReport` as a `NodeStatus`; the headless worker's lines are
a view of it (app.serving.cli_report).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from app.config import format_address
from app.errors import PiecesError
from app.identity import Identity
from app.node_status import NodeStatus, ServeState, StatusReport, plain_reason
from app.serving import standby as standby_stage
from app.serving.assigned_stage import (
    CoordinatedOptions,
    download_progress,
    finish_sessions,
    go_live,
    listen_address,
    prepare_pieces,
    stage_config,
    start_stage,
)
from app.serving.assigned_stage import capacity as offered_capacity
from app.serving.cli_report import CliReport
from app.serving.heartbeats import BeatsMeanwhile, ServingBeats, send_beat
from app.serving.piece_server import PieceServer, start_piece_server
from app.serving.plan import (
    HEARTBEAT_S,
    STANDBY_BEAT_S,
    BeatTimes,
    Download,
    Load,
    NodeState,
    Release,
    Retarget,
    Serve,
    Standby,
    Stop,
    Wait,
    plan,
)
from app.serving.serve import LoadedStage
from app.serving.worker import StageWorker
from coordinator.client.session import CoordinatorClient
from coordinator.contract import Assignment, Heartbeat, HeartbeatAnswer
from coordinator.errors import CoordinatorError
from core.types import LayerRange
from net import reach_probe

__all__ = [
    "HEARTBEAT_S",
    "STANDBY_BEAT_S",
    "CliReport",
    "CoordinatedOptions",
    "serve_coordinated",
    "stage_config",
]

log = logging.getLogger(__name__)


async def _wait_for_assignment(
    client: CoordinatorClient,
    report_beat: Heartbeat,
    stop: asyncio.Event,
    report: StatusReport,
    base: NodeStatus,
    prepare: Callable[[Assignment], Awaitable[object]] | None = None,
) -> tuple[Assignment | None, LoadedStage | None]:
    """Heartbeat with no stage, carrying out `plan`'s Wait and Standby, until it says
    Download: the assignment, and the standby stage pre-loaded for it when it is that
    stage. (None, None) when stopped."""
    times = BeatTimes(HEARTBEAT_S, STANDBY_BEAT_S)  # read now: tests shorten them
    waiting = replace(base, state=ServeState.WAITING)
    standby: Assignment | None = None
    fetching: asyncio.Task[object] | None = None

    def standing_by(ready: Assignment) -> None:
        nonlocal waiting
        waiting = replace(waiting, standby=ready.layers)
        report(waiting)

    while True:
        answer = None
        if not stop.is_set():
            try:
                answer = await _ask(client, report_beat, standby, waiting.standby)
            except CoordinatorError as exc:
                log.warning("coordinator: %s", exc)
                report(replace(waiting, error=plain_reason(exc)))
            else:
                if answer.assignment is None:
                    report(waiting)  # as it is now: a standby stage may have got ready
        action = plan(NodeState(stopping=stop.is_set(), standby=standby), answer, times)
        if isinstance(action, Download):
            # The standby stage promoted: served as pre-loaded. Another stage: the
            # pre-load is freed (a download resumes later where it stopped).
            return action.stage, await standby_stage.take(fetching, action.promote)
        if isinstance(action, Stop):
            break
        if isinstance(action, Standby):
            # A warm spare: the stage most at risk gets its pieces now, beside the
            # heartbeats (a long download must not look like a dead node), so
            # taking that stage over costs a load, not a download. The last pre-load
            # (another stage: the risk moved) is stopped or freed first: a spare the
            # soak re-targeted eight times held every stage it had built (428 MB).
            if prepare is not None:
                standby_stage.free(await standby_stage.take(fetching, False))
                standby = action.stage
                waiting = replace(waiting, standby=None)  # not ready yet
                report(waiting)
                fetching = asyncio.ensure_future(_standby(prepare, standby, standing_by))
            action = plan(NodeState(standby=standby), None, times)
        if isinstance(action, Wait):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), action.seconds)
    standby_stage.free(await standby_stage.take(fetching, False))
    return None, None


async def _ask(
    client: CoordinatorClient,
    report_beat: Heartbeat,
    standby: Assignment | None,
    ready: tuple[int, int] | None = None,
) -> HeartbeatAnswer:
    """A heartbeat of a node with no stage (a spare's says it stands by, and which
    layers' pieces it holds once they are `ready`, for peers to fetch)."""
    asking = replace(report_beat, activity="waiting" if standby is None else "standby")
    if ready is not None and standby is not None and report_beat.pieces_address:
        asking = replace(asking, pieces_layers=ready)
    return await asyncio.get_running_loop().run_in_executor(None, send_beat, client, asking)


async def _standby(
    prepare: Callable[[Assignment], Awaitable[object]],
    ready: Assignment,
    standing_by: Callable[[Assignment], None],
) -> object:
    try:
        done = await prepare(ready)
    except (CoordinatorError, OSError, PiecesError) as exc:
        log.warning("could not get the standby stage's pieces ready: %s", exc)
        return None
    log.info("standing by for %s: pieces ready", LayerRange(*ready.layers))
    standing_by(ready)
    return done


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
    host, port = await listen_address(options, identity.coordinator)
    options = replace(options, listen=(host, port))
    address = options.advertise or format_address((host, port))
    capacity, hardware = await loop.run_in_executor(None, offered_capacity, options.vram_cap_bytes)
    # Runs while this loop does: a paused node (its serve loop stopped) serves no pieces.
    shared = None
    if options.share_pieces:
        shared = await loop.run_in_executor(
            None, start_piece_server, identity, client, host, options.upload_bytes_per_s
        )
    report_beat = Heartbeat(
        address=address,
        capacity_bytes=capacity,
        vram_cap_bytes=options.vram_cap_bytes,
        hardware=hardware,
        available_until=options.available_until,
        pieces_address=shared.address if shared is not None else "",
    )
    try:
        await _serve_assigned(
            options, stop, report, on_stopped, identity, client, report_beat, shared
        )
    finally:
        if shared is not None:
            shared.stop()


async def _serve_assigned(
    options: CoordinatedOptions,
    stop: asyncio.Event,
    report: StatusReport,
    on_stopped: Callable[[StageWorker], None] | None,
    identity: Identity,
    client: CoordinatorClient,
    report_beat: Heartbeat,
    shared: PieceServer | None,
) -> None:
    """serve_coordinated's loop, with this node's piece server (or none)."""
    assert options.listen is not None
    host, port = options.listen
    address = report_beat.address
    base = NodeStatus(node_id=identity.node_id, coordinator=identity.coordinator)

    async def standby(ready: Assignment) -> LoadedStage | None:
        pieces = await prepare_pieces(
            identity,
            client,
            ready,
            lambda _p: None,
            options.download_bytes_per_s,
            pieces_cap_bytes=options.pieces_cap_bytes,
            shared=shared,
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

        meanwhile = BeatsMeanwhile(client, replace(report_beat, activity="downloading"))
        async with meanwhile:
            pieces_dir = await prepare_pieces(
                identity,
                client,
                assignment,
                download_progress(report, status, meanwhile),
                options.download_bytes_per_s,
                pieces_cap_bytes=options.pieces_cap_bytes,
                shared=shared,
            )
            config = stage_config(options, identity, port, assignment, pieces_dir)
            if loaded is not None and not loaded.fits(config):
                standby_stage.free(loaded)
                loaded = None
            preloaded = loaded is not None
            held = NodeState(stopping=stop.is_set(), pieces=assignment, preloaded=preloaded)
            action = plan(held, None)
            if isinstance(action, Stop):  # paused while downloading: nothing to load
                standby_stage.free(loaded)
                return
            assert isinstance(action, Load)
            report(replace(status, state=ServeState.LOADING, progress=1.0, preloaded=preloaded))
            meanwhile.now = replace(report_beat, activity="loading")
            started = await start_stage(options, identity, client, config, loaded)
        worker, router = started.worker, started.router
        try:
            serving, stage_beat = await go_live(
                started, client, assignment, report_beat, options.vram_cap_bytes, status, report
            )
            log.info(
                "serving %s as %s on %s (%s)",
                layers,
                identity.node_id,
                address,
                serving.compute.backend if serving.compute is not None else "backend not reported",
            )
            beats = await ServingBeats.start(identity, client, worker, stage_beat, report, serving)
            leaving = await _serve(beats, worker, assignment, stop)
            identity = beats.identity
            # Stopping or moving: running conversations end here first, not mid-answer.
            left = await finish_sessions(
                worker, options.drain_s, report, replace(beats.serving, state=leaving)
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


async def _serve(
    beats: ServingBeats, worker: StageWorker, assignment: Assignment, stop: asyncio.Event
) -> ServeState:
    """Heartbeat while serving, carrying out `plan`'s Serve and Retarget, until it says
    Release: how the stage is left (PAUSING when stopping, MOVING for another stage)."""
    refused = False
    answer: HeartbeatAnswer | None = None
    while True:
        held = NodeState(stopping=stop.is_set(), serving=assignment, retarget_refused=refused)
        action = plan(held, answer)
        refused = False
        if isinstance(action, Retarget):
            if worker.retarget(action.hop):
                # Same layers, a spare where the next stage was: keep the loaded stage
                # (and the sessions' KV upstream of the gap) and forward to it.
                assignment = action.stage
                beats.retargeted(action.hop.node_id, action.hop.address)
                answer = None
            else:
                refused = True  # asked again with the same answer: a rebuild
            continue
        if isinstance(action, Release):
            if action.leaving is ServeState.MOVING:
                log.warning(
                    "assignment changed (%s -> %s); rebuilding",
                    assignment,
                    None if answer is None else answer.assignment,
                )
            return action.leaving
        assert isinstance(action, Serve)
        answer = await beats.next(stop)
