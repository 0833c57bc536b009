"""The serving loop of one stage: frames in, batched engine steps, frames out at once.

The asyncio loop owns the network. The stage runtime (llama.cpp) runs in one engine
thread, so the network stays responsive while a batch computes. Each engine step takes
the queued rows of all sessions (core.scheduling), evaluates them in one llama_decode,
and forwards every session's output immediately: hidden states to the next stage, or,
on the last stage, sampled tokens straight to the client (push-forward; see
docs/architecture.md, "One token's trip").

Every decision about a session, and its one record, is in the sans-IO
app.serving.rules.stage.StageCore; this shell feeds it frames, link events, its one
timer and the engine's results, and carries out the actions it returns (engine calls on
the engine thread, frames on links). Imports no Qt: the CLI runs it headless and the
tray app reuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from app.config import Hop, WorkerConfig, parse_address
from app.serving.links.downstream import Dialer, Downstream
from app.serving.links.ring import Ring
from app.serving.machine.row_budget import calibrated_row_budget
from app.serving.rules.node_limits import NodeLimits, NodeLimitsPolicy
from app.serving.rules.peers import StagePlan, per_node_sessions
from app.serving.rules.sessions import (
    CancelGrace,
    Drain,
    End,
    Failed,
    FrameReceived,
    LinkClosed,
    LinkLost,
    LinkReady,
    Looped,
    Release,
    Resumed,
    Send,
    Shutdown,
)
from app.serving.rules.stage import CoreAction, CoreEvent, StageCore, StageSetup
from app.serving.rules.work import (
    AdoptOnStage,
    CloseOnStage,
    DownstreamLost,
    DownstreamRefused,
    Flush,
    ForgetDownstream,
    Forward,
    Guess,
    Guessed,
    OpenOnStage,
    RingLost,
    RingOpen,
    RingRefused,
    RingSend,
    StageAdopted,
    StageOpened,
    StepsComputed,
    SweepIdle,
    TimerFired,
    Wake,
)
from app.serving.session_records import WorkerStats
from app.serving.steps.batch import StageSteps
from app.serving.steps.engine_calls import EngineCalls
from app.serving.steps.mtp_guesses import guess
from app.serving.steps.recompute import recompute
from coordinator.spot_checks import CheckDigests, CheckRecord
from core.admission import AdmissionLedger, AdmissionPolicy, Capacity
from core.errors import CoreError
from core.stage import Stage
from core.step_profile import StepProfile
from net import wire
from net.channel import Channel, ChannelServer, NodeCredentials
from net.errors import ErrorCode
from net.peer_limits import LinkLimits
from net.quic.links import QuicTuning
from net.rate import upload_throttle

if TYPE_CHECKING:  # the module itself only where a test sets TEST_LIE_ENV
    from app.serving.chaos_lies import Liar

log = logging.getLogger(__name__)

TEST_LIE_ENV = "SANGAMA_TEST_LIE"
"""Set only by tests: this worker changes the rows it sends on (app.serving.chaos_lies,
a module the installers do not ship, imported only then)."""


def _test_liar() -> Liar | None:
    """The test-only liar the environment asks for, None where it asks for none."""
    if not os.environ.get(TEST_LIE_ENV):
        return None
    from app.serving import chaos_lies

    settings = chaos_lies.settings_from_env(os.environ)
    log.warning("this worker lies on purpose (%s): for tests only", settings)
    return None if settings is None else chaos_lies.Liar(settings)


def _own_addresses(config: WorkerConfig) -> frozenset[tuple[str, int]]:
    """Where peers reach this stage: its listen address and the one it advertises."""
    found = {config.listen}
    if config.advertise:
        found.add(parse_address(config.advertise))
    return frozenset(found)


class StageWorker:
    def __init__(
        self,
        config: WorkerConfig,
        stage: Stage,
        creds: NodeCredentials,
        dialer: Dialer | None = None,
        admission: AdmissionPolicy | None = None,
        engine_calls: EngineCalls | None = None,
    ) -> None:
        """`engine_calls`: the thread that built `stage` (app.serving.serve.LoadedStage),
        to keep its steps on it; None: a thread of its own."""
        self.config = config
        self.stage = stage
        self.creds = creds
        self.is_first = stage.spec.is_first
        self.is_last = stage.spec.is_last
        self._recurrent = bool(getattr(stage.engine, "recurrent", False))
        self._steps = StageSteps(stage, config.exact_guesses, self._recurrent)
        self.n_embd = stage.engine.n_embd
        tuning = QuicTuning(
            max_datagram_size=config.max_datagram_size,
            library=config.quic_library,
            idle_timeout=config.idle_timeout,
            keepalive=config.idle_timeout / 4,
            send_throttle=upload_throttle(config.upload_bytes_per_s),
        )
        self._server = ChannelServer(
            creds,
            self._channel_ready,
            tuning,
            limits=LinkLimits(auth_timeout_s=config.auth_timeout),
        )
        self.hop_wanted = asyncio.Event()
        """Set when the link to the next stage dies or sessions start waiting for one:
        the heartbeat loop then asks the coordinator early whether it was replaced."""
        self._downstream = (
            Downstream(
                config.next_hop,
                creds,
                tuning,
                self._downstream_frame,
                self._downstream_lost,
                dialer=dialer,
                relink_timeout=config.relink_timeout,
                on_waiting=self.hop_wanted.set,
            )
            if config.next_hop is not None
            else None
        )
        self._ring = (
            Ring(
                creds,
                tuning,
                lambda node, error: self._feed(RingRefused(node, error)),
                lambda node, reason: self._feed(RingLost(node, reason)),
                dialer,
                config.relink_timeout,
            )
            if self.is_last and not self.is_first
            else None
        )
        """Last stage: links to first stages, for sessions whose steps go round (ring)."""
        self._engine_calls = engine_calls or EngineCalls()
        self._replied_on: set[Channel] = set()
        spec = stage.spec
        self.admission = AdmissionLedger(
            admission
            or AdmissionPolicy(
                n_ctx=spec.n_ctx, max_sessions=spec.n_seq_max, session_ctx=spec.session_ctx
            )
        )
        self.row_budget = config.row_budget
        """Rows per engine step: measured at start (calibrate_budget), at most n_batch."""
        self.step_samples: list[tuple[int, float]] = []
        self._step_profile = StepProfile()
        """Step time by rows as this stage serves: the heartbeat carries it."""
        # Per-node OPEN limits on the first stage only: further down, every session of the
        # chain comes from one upstream worker, and limiting it would limit everyone (only
        # that upstream may open sessions there: peer_rules).
        slots = self.admission.policy.max_sessions
        limits = NodeLimitsPolicy.for_stage(
            slots, per_node_sessions(slots, config.max_sessions_per_node)
        )
        setup = StageSetup(
            is_first=self.is_first,
            is_last=self.is_last,
            n_embd=self.n_embd,
            first_layer=spec.layers.start,
            has_next=self._downstream is not None,
            ring=self._ring is not None,
            # Hand a session's KV to its replay only where the cache can be cut back and
            # nothing else is keyed by the session (resume_rules).
            adopts=stage.mtp is None and not self._recurrent,
            mtp=stage.mtp is not None,
            mtp_guesses=config.mtp_guesses,
            mtp_p_min=config.mtp_p_min,
            return_logits=config.return_logits,
            resume_grace=config.resume_grace,
            session_idle_s=config.session_idle_s,
        )
        self.core: StageCore[Channel] = StageCore(
            setup,
            time.perf_counter,
            self.admission,
            NodeLimits(limits, time.monotonic) if self.is_first else None,
            StagePlan(
                config.node_id,
                self.is_first,
                upstream=config.upstream_nodes,
                addresses=_own_addresses(config),
            ),
        )
        """Every session of the stage and every decision about them; carried out here."""
        self._idle_sweep: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        """The core's next deadline, the one the timer is armed for."""
        self._wake = asyncio.Event()
        self._engine_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.address: tuple[str, int] | None = None
        self._liar = _test_liar()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> tuple[str, int]:
        if self.config.calibrate_budget:
            self.row_budget, self.step_samples = await self._engine_calls.run(
                calibrated_row_budget, self.stage
            )
            log.info("row budget %d from step times %s", self.row_budget, self.step_samples)
        self.address = await self._server.listen(*self.config.listen)
        rules = self.core.rules
        if rules.plan is not None and self.config.listen[1] == 0:
            # Port 0: the stage's own address is the one the socket got.
            rules.plan = replace(rules.plan, addresses=rules.plan.addresses | {self.address})
        self._engine_task = asyncio.get_running_loop().create_task(self._engine_loop())
        self._arm_idle_sweep()
        return self.address

    @property
    def server(self) -> ChannelServer:
        return self._server

    @property
    def next_hop_path(self) -> str:
        return "direct" if self._downstream is None else self._downstream.path

    @property
    def next_hop_waiting(self) -> bool:
        """Sessions wait for a link to the next stage (app.serving.rules.beats)."""
        return self._downstream is not None and self._downstream.waiting

    @property
    def next_hop_lost_at(self) -> float | None:
        """time.monotonic() when the link to the next stage died, while it stays down."""
        return None if self._downstream is None else self._downstream.lost_at

    @property
    def next_hop_relinks(self) -> int:
        """How often the path to the next stage was replaced while sessions ran."""
        return 0 if self._downstream is None else self._downstream.relinks

    def step_times(self) -> tuple[tuple[int, float], ...]:
        """(rows, ms) of this stage's steps as it serves; the start-up calibration's
        timings stand in for batch sizes no served step has had yet."""
        self._step_profile.seed(self.step_samples)
        return self._step_profile.points()

    async def ring_rtt(self) -> dict[str, float]:
        """Measured round trips to the first stages this last stage loops tokens to."""
        return {} if self._ring is None else await self._ring.measure_rtts()

    async def next_hop_rtt(self) -> dict[str, float]:
        """Measured round trip to the next stage, for the coordinator's placement."""
        if self._downstream is None:
            return {}
        ms = await self._downstream.measure_rtt()
        return {} if ms is None else {self._downstream.hop.node_id: ms}

    def retarget(self, hop: Hop) -> bool:
        """Forward to another next stage without reloading this one (the coordinator put
        a spare where the next stage was). Sessions that ran through the old one fail
        with a typed error (their client replays them on the new chain). False when this
        stage has no next hop to move (the caller rebuilds instead)."""
        if self._downstream is None:
            return False
        for name in self._downstream.retarget(hop):
            self._fail(name, ErrorCode.STAGE_ERROR, "next stage replaced", forward_close=False)
        return True

    def update_credentials(self, creds: NodeCredentials) -> None:
        """Serve and dial with a renewed certificate from now on."""
        self.creds = creds
        self._server.update_credentials(creds)
        if self._downstream is not None:
            self._downstream.update_credentials(creds)
        if self._ring is not None:
            self._ring.update_credentials(creds)

    def set_revoked(self, serials: frozenset[int]) -> None:
        """Refuse revoked nodes; close the links whose certificate is now revoked or expired."""
        self._server.revoked_serials = serials

    @property
    def stats(self) -> WorkerStats:
        return self.core.stats

    @property
    def session_count(self) -> int:
        return len(self.core)

    @property
    def capacity(self) -> Capacity:
        """Sessions and KV reserved against this stage's budget (heartbeats, status)."""
        return self.admission.capacity()

    # ------------------------------------------------------------ spot checks

    @property
    def checkable(self) -> bool:
        """Whether another node can recompute this stage's steps bit for bit: hidden rows
        sent on, and each session's numbers the same whatever shares its decodes (the
        default; not in the batch-variant builds kept for measurements)."""
        from core.backends import batch_variant  # the engine's library, loaded already

        return not self.is_last and not batch_variant()

    def check_sessions(self) -> tuple[tuple[str, int], ...]:
        """Sessions whose steps a spot check may ask for (StepLedger.offered); a last
        stage's are those it saw (StepLedger.witnessed): the coordinator samples a
        stage's checks from its neighbours' lists, which it cannot edit."""
        if self.is_last:
            return self.core.ledger.witnessed()
        return self.core.ledger.offered() if self.checkable else ()

    def check_record(self, session: str, steps: int) -> CheckRecord | None:
        record = self.core.ledger.check_record(session, steps)
        if record is not None:
            self.core.stats.check_bytes += sum(len(s.rows) for s in record.steps)
        return record

    async def recompute(self, record: CheckRecord, session: str) -> CheckDigests:
        """Another stage's record recomputed here, on the engine thread (recompute.py)."""
        if not self.checkable:
            return CheckDigests(refused="this stage does not recompute bit for bit")
        stats = self.core.stats
        stats.check_bytes += sum(len(s.rows) for s in record.steps)
        digests = await self._engine_calls.run(recompute, self._steps, record, session)
        stats.rows_recomputed += sum(s.n_rows for s in record.steps[: len(digests.digests)])
        return digests

    async def drain(self, timeout: float) -> int:
        """Take no new sessions and wait up to `timeout` s for the running ones to end.

        Pausing a volunteer's PC this way lets conversations finish instead of breaking
        them. Returns how many sessions were still open (`stop` ends those)."""
        self._feed(Drain())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return len(self.core)

    async def stop(self) -> None:
        if self._idle_sweep is not None:
            self._idle_sweep.cancel()
        if self._timer is not None:
            self._timer.cancel()
        if self._engine_task is not None:
            self._engine_task.cancel()
        self._feed(Shutdown("worker shutting down"))
        if self._downstream is not None:
            await self._downstream.close()
        if self._ring is not None:
            await self._ring.close()
        self._server.close()
        await asyncio.sleep(0.05)  # let CONNECTION_CLOSE datagrams leave
        await self._engine_calls.run(self.stage.shutdown)
        self._engine_calls.shutdown()

    # ------------------------------------------------------------ channels

    def _channel_ready(self, channel: Channel) -> None:
        assert channel.peer is not None
        channel.on_frame = self._upstream_frame
        channel.on_close = self._channel_closed
        self._feed(LinkReady(channel, channel.peer.node_id))

    def _channel_closed(self, channel: Channel, reason: str) -> None:
        self._feed(LinkClosed(channel, reason))

    def _upstream_frame(self, channel: Channel, frame: wire.Frame) -> None:
        assert channel.peer is not None
        if isinstance(frame, wire.Error):
            log.info("peer %s reports: %s", channel.peer, frame.message)
            return
        self._feed(FrameReceived(channel, channel.peer.node_id, frame, channel.peer.role))

    def _downstream_frame(self, _channel: Channel, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Error):
            self._feed(DownstreamRefused(frame))

    def _downstream_lost(self, reason: str) -> None:
        self._feed(DownstreamLost(reason))

    # ------------------------------------------------------------ carrying out the core

    def _feed(self, event: CoreEvent[Channel]) -> None:
        self._apply(self.core.handle(event))
        if len(self.core):
            self._idle.clear()
        else:
            self._idle.set()
        self._arm_timer()

    def _apply(self, actions: list[CoreAction[Channel]]) -> None:
        for action in actions:
            match action:
                case Send(link, frame):
                    self._send(link, frame)
                case Release(link, session):
                    link.release(session)
                case Forward(frame, taken):
                    assert self._downstream is not None
                    if self._liar is not None and isinstance(frame, wire.Step):
                        frame = self._liar.tamper(frame)
                    if taken is not None and isinstance(frame, wire.Step):
                        self.core.sent(taken, frame)  # as it goes: what the next stage gets
                    self._downstream.send(frame)
                case ForgetDownstream(session):
                    if self._downstream is not None:
                        self._downstream.forget(session)
                case OpenOnStage(session):
                    self._on_engine(self.stage.open, (session,), StageOpened(session))
                case AdoptOnStage(old, session, kept):
                    done = StageAdopted(old, session, kept)
                    self._on_engine(self.stage.adopt, (old, session, kept), done)
                case CloseOnStage(session):
                    self._engine_calls.submit(self._close_on_stage, session)
                case RingOpen(frame):
                    assert self._ring is not None
                    self._ring.open(frame)  # dialled now, while the prompt computes
                case RingSend(node, step):
                    assert self._ring is not None
                    self._ring.send(node, step)
                case Wake():
                    self._wake.set()
                case Guess(reply, position, token, k):
                    self._guess(reply, position, token, k)
                case Flush():
                    self._flush_outputs()
                case Looped(session, last):
                    log.debug("session %s goes round: its steps come from %s", session, last)
                case Resumed(session, owner):
                    log.info("session %s resumed by %s over a new link", session, owner)
                case LinkLost(session, reason):
                    log.info(
                        "a link of session %s was lost (%s); waiting for a resume", session, reason
                    )
                case CancelGrace(session):
                    log.info("session %s has all its links again", session)
                case End(session, forward_close, reason):
                    self._end(session, forward_close=forward_close, reason=reason)

    def _on_engine(
        self, fn: Callable[..., None], args: tuple[object, ...], done: StageOpened | StageAdopted
    ) -> None:
        """Run an engine call on the engine thread; feed `done` back, with the error's
        text if it raised."""
        future = asyncio.wrap_future(self._engine_calls.submit(fn, *args))

        def answer(f: asyncio.Future[None]) -> None:
            exc = f.exception()
            if isinstance(done, StageAdopted) and exc is None:
                log.info("session %s continues %s here: %d positions kept",
                         done.session, done.old, done.kept)  # fmt: skip
            self._feed(done if exc is None else replace(done, error=str(exc) or repr(exc)))

        future.add_done_callback(answer)

    def _guess(self, reply: wire.Tokens, position: int, token: int, k: int) -> None:
        """The MTP head's guesses after `token`, on the engine thread; the tokens go out
        with them, or without when guessing failed."""
        mtp = self.stage.mtp
        assert mtp is not None
        p_min = self.config.mtp_p_min
        future = asyncio.wrap_future(
            self._engine_calls.submit(guess, mtp, reply.session, position, token, k, p_min)
        )

        def answer(f: asyncio.Future[tuple[int, ...]]) -> None:
            failed = f.cancelled() or f.exception() is not None
            self._feed(Guessed(reply, () if failed else f.result()))

        future.add_done_callback(answer)

    def _arm_timer(self) -> None:
        """One timer for the whole stage, at the core's next deadline."""
        deadline = self.core.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            delay = max(0.0, deadline - time.perf_counter())
            self._timer = asyncio.get_running_loop().call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer, self._timer_at = None, None
        self._feed(TimerFired())

    def _fail(
        self, name: str, code: ErrorCode, message: str, *, forward_close: bool = True
    ) -> None:
        self._feed(Failed(name, code, message, forward_close))

    # ------------------------------------------------------------ the engine

    async def _engine_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (batch := self.core.take_batch(self.row_budget)) is not None:
                rows = batch.rows
                started = time.perf_counter()
                results, verdicts = await self._engine_calls.run(
                    self._steps.run, batch.items, batch.checks
                )
                finished = time.perf_counter()
                compute_ms = (finished - started) * 1e3
                self._step_profile.observe(rows, compute_ms)
                self._feed(StepsComputed(batch, results, verdicts, started, finished))

    def _flush_outputs(self) -> None:
        """A step's frames and replies leave now, ahead of the ACKs that this turn's
        links queued before them (those follow at the end of the turn)."""
        if self._ring is not None:
            self._ring.flush()
        if self._downstream is not None:
            self._downstream.flush()
        for channel in self._replied_on:
            if not channel.closed.done():
                channel.flush()
        self._replied_on.clear()

    # ------------------------------------------------------------ ending sessions

    def _end(self, name: str, *, forward_close: bool, reason: str) -> None:
        self._engine_calls.submit(self._close_on_stage, name)
        if self._ring is not None:
            self._ring.forget(name)
        if self._downstream is None:
            return
        if forward_close:
            self._downstream.end_session(name, reason)
        else:
            self._downstream.forget(name)

    def _arm_idle_sweep(self) -> None:
        # A few sweeps per idle period: a session is closed at most a quarter late.
        every = min(30.0, self.config.session_idle_s / 4)
        self._idle_sweep = asyncio.get_running_loop().call_later(every, self._sweep_idle)

    def _sweep_idle(self) -> None:
        self._feed(SweepIdle())
        self._arm_idle_sweep()

    def _close_on_stage(self, name: str) -> None:
        with contextlib.suppress(CoreError):  # never opened here (open failed): nothing to free
            self.stage.close(name)

    def _send(self, channel: Channel, frame: wire.Frame) -> None:
        if not channel.closed.done():
            if isinstance(frame, wire.Tokens):
                self._replied_on.add(channel)  # flushed after the step (_flush_outputs)
            try:
                channel.send(frame)
            except Exception as exc:  # a dying link must not take the worker down
                log.debug("could not send %s: %s", type(frame).__name__, exc)
