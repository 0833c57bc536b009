"""The serving loop of one stage: frames in, batched engine steps, frames out at once.

The asyncio loop owns the network. The stage runtime (llama.cpp) runs in one engine
thread, so the network stays responsive while a batch computes. Each engine step takes
the queued rows of all sessions (core.scheduling), evaluates them in one llama_decode,
and forwards every session's output immediately: hidden states to the next stage, or,
on the last stage, sampled tokens straight to the client (push-forward; see
docs/architecture.md, "One token's trip").

Who owns a session, when a repeated OPEN resumes it, which steps were taken already and
when the stage refuses are decided by app.serving.rules.sessions (no IO); this loop carries out
the actions it returns. Imports no Qt: the CLI runs it headless and the tray app reuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

import numpy as np

from app.config import Hop, WorkerConfig, parse_address
from app.serving.links.downstream import Dialer, Downstream
from app.serving.links.ring import Ring
from app.serving.machine.row_budget import calibrated_row_budget
from app.serving.rules.node_limits import NodeLimits, NodeLimitsPolicy
from app.serving.rules.peers import StagePlan, idle_sessions, per_node_sessions
from app.serving.rules.resume import extend_history, rows_to_skip, trimmed
from app.serving.rules.sessions import Action as RuleAction
from app.serving.rules.sessions import (
    Begin,
    CancelGrace,
    Drain,
    End,
    Failed,
    FrameReceived,
    GraceExpired,
    LinkClosed,
    LinkLost,
    LinkReady,
    Looped,
    Refused,
    Release,
    Resent,
    Resumed,
    Send,
    SessionRules,
    Shutdown,
    Take,
    TokensReady,
)
from app.serving.rules.sessions import Event as RuleEvent
from app.serving.steps.batch import StageSteps, guess_checks, step_request
from app.serving.steps.engine_calls import EngineCalls
from app.serving.steps.mtp_guesses import (
    chosen_position,
    gate_offered,
    gate_open,
    gate_step,
    guess,
)
from app.serving.steps.replies import choose_tokens, onward_step, tokens_reply
from app.serving.worker_state import PendingStep, ServedSession, WorkerStats, guesses_of
from app.session.wire_values import sampling_from_wire
from core.admission import AdmissionLedger, AdmissionPolicy, Capacity
from core.errors import CoreError, PositionError
from core.guess_acceptance import Verdict
from core.sampling import make_rng
from core.scheduling import Queued, select_batch
from core.stage import Stage, StepFailure, StepResult
from core.step_profile import StepProfile
from net import wire
from net.channel import Channel, ChannelServer, NodeCredentials
from net.errors import ErrorCode, FrameError
from net.peer_limits import LinkLimits
from net.quic.links import QuicTuning
from net.rate import upload_throttle
from net.wire.tensors import WireDtype

log = logging.getLogger(__name__)


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
        self.stats = WorkerStats()
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
            Ring(creds, tuning, self._fail, dialer, config.relink_timeout)
            if self.is_last and not self.is_first
            else None
        )
        """Last stage: links to first stages, for sessions whose steps go round (ring)."""
        self._engine_calls = engine_calls or EngineCalls()
        self._replied_on: set[Channel] = set()
        spec = stage.spec
        self.admission = AdmissionLedger(
            admission or AdmissionPolicy(n_ctx=spec.n_ctx, max_sessions=spec.n_seq_max)
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
        self._rules: SessionRules[Channel] = SessionRules(
            self.is_last,
            self.admission,
            NodeLimits(limits, time.monotonic) if self.is_first else None,
            upstream_is_stage=not self.is_first,
            # Hand a session's KV to its replay only where the cache can be cut back and
            # nothing else is keyed by the session (resume_rules).
            history_of=(self._history_of if stage.mtp is None and not self._recurrent else None),
            first_layer=stage.spec.layers.start,
            plan=StagePlan(
                config.node_id,
                self.is_first,
                upstream=config.upstream_nodes,
                addresses=_own_addresses(config),
            ),
        )
        """Ownership, resume, de-duplication, admission: decided there, carried out here."""
        self._idle_sweep: asyncio.TimerHandle | None = None
        self._sessions: dict[str, ServedSession] = {}
        self._pending: list[PendingStep] = []
        self._wake = asyncio.Event()
        self._engine_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.address: tuple[str, int] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> tuple[str, int]:
        if self.config.calibrate_budget:
            self.row_budget, self.step_samples = await self._engine_calls.run(
                calibrated_row_budget, self.stage
            )
            log.info("row budget %d from step times %s", self.row_budget, self.step_samples)
        self.address = await self._server.listen(*self.config.listen)
        if self._rules.plan is not None and self.config.listen[1] == 0:
            # Port 0: the stage's own address is the one the socket got.
            plan = self._rules.plan
            self._rules.plan = replace(plan, addresses=plan.addresses | {self.address})
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
        """How often the path to the next stage was replaced while sessions were running."""
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
    def session_count(self) -> int:
        return len(self._sessions)

    @property
    def capacity(self) -> Capacity:
        """Sessions and KV reserved against this stage's budget (heartbeats, status)."""
        return self.admission.capacity()

    async def drain(self, timeout: float) -> int:
        """Take no new sessions and wait up to `timeout` s for the running ones to end.

        Pausing a volunteer's PC this way lets conversations finish instead of breaking
        them. Returns how many sessions were still open (`stop` ends those)."""
        self._feed(Drain())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return len(self._sessions)

    async def stop(self) -> None:
        if self._idle_sweep is not None:
            self._idle_sweep.cancel()
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
        try:
            self._feed(FrameReceived(channel, channel.peer.node_id, frame, channel.peer.role))
        except FrameError as exc:  # a check of the worker's own (shape, dtype, ...)
            session = getattr(frame, "session", "")
            self._feed(Refused(channel, session, exc.code, exc.message))

    def _downstream_frame(self, _channel: Channel, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Error) and frame.session in self._rules:
            # An error further down the chain: pass it back towards the client.
            self._fail(frame.session, frame.code, frame.message, forward_close=False)

    def _downstream_lost(self, reason: str) -> None:
        for name in self._rules.sessions:
            self._fail(name, ErrorCode.STAGE_ERROR, reason, forward_close=False)

    # ------------------------------------------------------------ carrying out the rules

    def _apply(self, actions: list[RuleAction[Channel]]) -> None:
        for action in actions:
            match action:
                case Send(link, frame):
                    self._send(link, frame)
                case Release(link, session):
                    link.release(session)
                case Begin(frame, adopt, kept):
                    self._begin(frame, adopt, kept)
                case Take(step, opened):
                    self._take(step, opened)
                case Resent():
                    self.stats.resent_steps += 1  # resent after a resume; handled already
                case Looped(session, last):
                    log.debug("session %s goes round: its steps come from %s", session, last)
                case Resumed(session, owner):
                    self.stats.sessions_resumed += 1
                    log.info("session %s resumed by %s over a new link", session, owner)
                case LinkLost(session, reason, arm_grace):
                    if arm_grace:
                        self._arm_grace(session)
                    log.info(
                        "a link of session %s was lost (%s); waiting for a resume", session, reason
                    )
                case CancelGrace(session):
                    self._cancel_grace(session)
                    log.info("session %s has all its links again", session)
                case End(session, forward_close, reason, failed):
                    if failed:
                        self.stats.errors += 1
                    self._end(session, forward_close=forward_close, reason=reason)

    def _feed(self, event: RuleEvent[Channel]) -> None:
        self._apply(self._rules.handle(event))

    # ------------------------------------------------------------ frames

    def _history_of(self, name: str) -> list[int] | None:
        session = self._sessions.get(name)
        return None if session is None or not session.history_known else session.history

    def _begin(self, frame: wire.Open, adopt: str = "", kept: int = 0) -> None:
        session = ServedSession(frame)
        if self.is_last:
            session.params = sampling_from_wire(frame.sampling)
            session.rng = make_rng(session.params)
        if self._ring is not None:
            self._ring.open(frame)  # dialled now, while the prompt computes
        if adopt:
            self._adopt(session, adopt, kept)
            return
        self._sessions[frame.session] = session
        self._idle.clear()
        future = asyncio.wrap_future(self._engine_calls.submit(self.stage.open, frame.session))
        future.add_done_callback(lambda f: self._opened(frame.session, f))
        if self._downstream is not None:
            self._downstream.send(frame)
        self.stats.sessions_opened += 1

    def _adopt(self, session: ServedSession, old_name: str, kept: int) -> None:
        """Last stage: a replay continues `old_name`, whose first `kept` positions it
        holds (the rules checked owner and history): the KV moves to the new session."""
        name = session.open.session
        old = self._sessions.pop(old_name, None)
        if old is not None and old.expiry is not None:
            old.expiry.cancel()
        if self._ring is not None:
            self._ring.forget(old_name)
        self._pending = [p for p in self._pending if p.step.session != old_name]
        session.history = [] if old is None else old.history[:kept]
        session.kept = kept
        self._sessions[name] = session
        self._idle.clear()
        self.stats.sessions_opened += 1
        self.stats.sessions_adopted += 1
        self.stats.rows_reused += kept
        future = asyncio.wrap_future(
            self._engine_calls.submit(self.stage.adopt, old_name, name, kept)
        )
        future.add_done_callback(lambda f: self._adopted(old_name, name, kept, f))
        if self._downstream is not None:
            # The next stage takes the old session over too (the client named the layer
            # from which every stage may) or, as the OPEN comes over the link that owns
            # it, ends it (session_rules): no CLOSE for it, which would find it gone.
            self._downstream.send(session.open)
            self._downstream.forget(old_name)

    def _adopted(self, old_name: str, name: str, kept: int, future: asyncio.Future[None]) -> None:
        exc = future.exception()
        if exc is None:
            log.info("session %s continues %s here: %d positions kept", name, old_name, kept)
            return
        # The cache could not be handed over: the old session goes, and the replay's
        # typed error makes the client replay everything (nothing held is used).
        self._engine_calls.submit(self._close_on_stage, old_name)
        self._fail(name, ErrorCode.MISSING_POSITIONS, f"cannot continue {old_name}: {exc}")

    def _arm_grace(self, name: str) -> None:
        """A link of the session died (its path, or the peer): keep the session for
        `resume_grace` seconds, the peer may redial and resume it."""
        session = self._sessions.get(name)
        if session is not None:
            session.expiry = asyncio.get_running_loop().call_later(
                self.config.resume_grace, lambda: self._feed(GraceExpired(name))
            )

    def _cancel_grace(self, name: str) -> None:
        session = self._sessions.get(name)
        if session is not None and session.expiry is not None:
            session.expiry.cancel()
            session.expiry = None

    def _opened(self, name: str, future: asyncio.Future[None]) -> None:
        exc = future.exception()
        if exc is not None:
            self._fail(name, ErrorCode.OVERLOADED, str(exc))

    def _take(self, frame: wire.Step, opened: wire.Open) -> None:
        """A step the rules let through: check its rows against this stage, queue it."""
        if frame.wire_dtype != opened.wire_dtype and frame.hidden is not None:
            raise FrameError(ErrorCode.BAD_DTYPE, "rows in a dtype the session did not open with")
        held = self._sessions.get(frame.session)
        if held is not None:
            held.last_active = time.monotonic()
        skip = 0 if held is None else rows_to_skip(held.kept, frame.start, frame.n_rows)
        if skip:  # a replay's rows this stage kept from the session it continues
            if skip == frame.n_rows:
                return
            frame = trimmed(frame, skip)
        if frame.one_by_one:
            self.stats.rows_one_by_one += frame.n_rows
        request = step_request(frame, self.is_first, self.n_embd)
        self._pending.append(PendingStep(frame, request, time.perf_counter()))
        self._wake.set()

    # ------------------------------------------------------------ the engine

    async def _engine_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                queue = [
                    Queued(
                        p.request.n_rows,
                        is_prompt=p.request.n_rows > 1 and not p.step.guesses,
                        waited=p.waited,
                        session=p.request.session,
                    )
                    for p in self._pending
                ]
                chosen = select_batch(queue, self.row_budget)
                batch = [self._pending[i] for i in chosen]
                taken = set(chosen)
                self._pending = [p for i, p in enumerate(self._pending) if i not in taken]
                for p in self._pending:
                    p.waited += 1
                batch = [p for p in batch if p.request.session in self._sessions]
                if not batch:
                    continue
                rows = sum(p.request.n_rows for p in batch)
                started = time.perf_counter()
                checks = guess_checks(batch, self._sessions) if self.is_last else {}
                results, verdicts = await self._engine_calls.run(self._steps.run, batch, checks)
                compute_ms = (time.perf_counter() - started) * 1e3
                self.stats.batches += 1
                self.stats.last_compute_ms = compute_ms
                self._step_profile.observe(rows, compute_ms)
                self.stats.last_queue_ms = max((started - p.arrived) * 1e3 for p in batch)
                self.stats.rows += sum(p.request.n_rows for p in batch)
                for i, (p, result) in enumerate(zip(batch, results, strict=True)):
                    self._emit(p, result, compute_ms, (started - p.arrived) * 1e3, verdicts.get(i))
                self._flush_outputs()

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

    def _emit(
        self,
        p: PendingStep,
        result: StepResult | StepFailure,
        compute_ms: float,
        queue_ms: float,
        verdict: Verdict | None = None,
    ) -> None:
        session = self._sessions.get(p.step.session)
        if session is None:
            return  # closed while computing
        session.last_active = time.monotonic()
        if isinstance(result, StepFailure):
            # Rows that do not continue the cache (this stage restarted, its KV is gone):
            # a typed code the client answers by replaying, never a guess.
            missing = isinstance(result.error, PositionError)
            code = ErrorCode.MISSING_POSITIONS if missing else ErrorCode.STAGE_ERROR
            self._fail(p.step.session, code, str(result.error))
            return
        self.stats.steps += 1
        timing = wire.StageTiming(
            self.stage.spec.layers.start,
            compute_ms,
            queue_ms,
            (time.perf_counter() - p.arrived) * 1e3,
        )
        timings = (*p.step.timings, timing)
        if not self.is_last:
            assert result.hidden is not None and self._downstream is not None
            if session.history_known and self._rules.history_of is not None:
                session.history_known = extend_history(session.history, p.step)
            dtype = WireDtype(session.open.wire_dtype)
            self._downstream.send(onward_step(p.step, result.hidden, dtype, timings))
            return
        assert result.logits is not None
        self._sample_and_reply(session, p.step, result.logits, timings, verdict)

    def _sample_and_reply(
        self,
        session: ServedSession,
        step: wire.Step,
        logits: np.ndarray,
        timings: tuple[wire.StageTiming, ...],
        verdict: Verdict | None = None,
    ) -> None:
        chosen = choose_tokens(session, step, logits, verdict)
        if chosen is None:
            return  # an intermediate prompt chunk: nothing to say yet
        self.stats.tokens += len(chosen)
        reply = tokens_reply(session, step, chosen, logits, timings, self.config.return_logits)
        k = min(self.config.mtp_guesses, session.open.max_tokens - session.generated - 1)
        session.guess_gate = gate_step(session.guess_gate, bool(step.guesses))
        mtp = self.stage.mtp
        if mtp is not None and not reply.finished and k > 0 and gate_open(session.guess_gate):
            # The model's own guesses of the next tokens ride back with this reply.
            future = asyncio.wrap_future(self._engine_calls.submit(
                guess, mtp, step.session,
                chosen_position(step, reply.n_accepted), chosen[-1], k, self.config.mtp_p_min,
            ))  # fmt: skip
            future.add_done_callback(lambda f: self._reply_guessed(session, reply, f))
            return
        if self._ring is not None and self._rules.reply_linked(step.session):
            # The next step to the first stage, where it may; not while the client is
            # away (it may be gone for good: the session waits for it, as without ring).
            reply = self._ring.go_round(session, step, reply)
        self._feed(TokensReady(reply))  # to the client now, or when its link is back

    def _reply_guessed(
        self, session: ServedSession, reply: wire.Tokens, future: asyncio.Future[tuple[int, ...]]
    ) -> None:
        guesses = guesses_of(future)
        session.guess_gate = gate_offered(session.guess_gate, guesses)
        self._feed(TokensReady(replace(reply, guesses=guesses)))

    # ------------------------------------------------------------ ending sessions

    def _fail(
        self, name: str, code: ErrorCode, message: str, *, forward_close: bool = True
    ) -> None:
        self._feed(Failed(name, code, message, forward_close))

    def _end(self, name: str, *, forward_close: bool, reason: str) -> None:
        session = self._sessions.pop(name, None)
        if session is None:
            return
        if not self._sessions:
            self._idle.set()
        if session.expiry is not None:
            session.expiry.cancel()
        self._pending = [p for p in self._pending if p.step.session != name]
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
        """Close the sessions that stopped stepping (peer_rules.idle_sessions): a client
        that went away, or one holding slots it never uses, frees them and their KV."""
        idle_s = self.config.session_idle_s
        busy = {p.step.session for p in self._pending}
        last = {name: s.last_active for name, s in self._sessions.items()}
        for name in idle_sessions(last, busy, time.monotonic(), idle_s):
            self.stats.sessions_idle_closed += 1
            self._fail(name, ErrorCode.STAGE_ERROR, f"no step for {idle_s:g} s: session closed")
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
