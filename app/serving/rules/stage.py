"""A stage without IO: frames, link events and the engine's answers in, actions out.

`StageCore` owns the one table of a stage's sessions (app.serving.session_records's
`SessionRecord`, one record per session) and makes every decision about them:
whom a frame belongs to and when an OPEN is refused (app.serving.rules.sessions, whose
table this is), whether a STEP's rows fit the stage (dtype, width, kind), which rows of a
replay are held already and skipped, which queued steps the engine evaluates next, what
goes on after a step (rows to the next stage; on the last stage the tokens chosen, the
MTP head's guesses where the client uses them, the step round the ring where it may go,
the TOKENS to the client), and when a session waiting for a link, or taking no step, is
ended. A refusal is a typed action (an ERROR sent, the session failed), never an
exception.

It is to `app.serving.worker.StageWorker` what aioquic's QuicConnection is to its
asyncio protocol: the worker feeds it frames, link events, timer ticks and the
engine's results (`handle`), carries out the actions (engine calls on the engine thread,
frames on links, one timer at `next_deadline`), and asks it for the next batch
(`take_batch`). tests/support/pump.py runs stages the same way in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic

import numpy as np

from app.serving.rules.events import (
    Action,
    Begin,
    CancelGrace,
    End,
    Event,
    Failed,
    FrameReceived,
    GraceExpired,
    L,
    LinkLost,
    Refused,
    Resent,
    Resumed,
    StepRejected,
    Take,
    TokensReady,
)
from app.serving.rules.node_limits import NodeLimits
from app.serving.rules.peers import StagePlan, idle_sessions
from app.serving.rules.resume import extend_history, rows_to_skip, trimmed
from app.serving.rules.ring_turns import RingGuesses, go_round
from app.serving.rules.sessions import SessionRules
from app.serving.rules.step_ledger import StepLedger, ledger_step
from app.serving.rules.work import (
    AdoptOnStage,
    Batch,
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
    StageAction,
    StageAdopted,
    StageOpened,
    StepsComputed,
    SweepIdle,
    TimerFired,
    Wake,
)
from app.serving.session_records import LinkState, PendingStep, SessionRecord, WorkerStats
from app.serving.steps.batch import guess_checks, step_request
from app.serving.steps.mtp_guesses import chosen_position, gate_offered, gate_open, gate_step
from app.serving.steps.replies import choose_tokens, onward_step, tokens_reply
from app.serving.steps.row_checks import check_rows
from app.session.rows_refusal import RowsRefusal, rows_refused_message
from app.session.wire_values import sampling_from_wire
from core.admission import AdmissionLedger
from core.errors import PositionError
from core.guess_acceptance import Verdict
from core.sampling import make_rng
from core.scheduling import Queued, select_batch
from core.stage import StepFailure, StepResult
from net import wire
from net.errors import ErrorCode, FrameError
from net.wire.tensors import WireDtype

CoreEvent = (
    Event[L]
    | StageOpened
    | StageAdopted
    | StepsComputed
    | Guessed
    | DownstreamRefused
    | DownstreamLost
    | RingRefused
    | RingLost
    | TimerFired
    | SweepIdle
)
CoreAction = Action[L] | StageAction


@dataclass(frozen=True)
class StageSetup:
    """What the core needs to know of its stage (frozen; the worker builds it once)."""

    is_first: bool
    is_last: bool
    n_embd: int
    first_layer: int = 0
    has_next: bool = False
    """A next stage to forward to (not the last stage)."""
    ring: bool = False
    """Last stage (not also first): steps may go round to the first stage (`Open.loop`)."""
    adopts: bool = True
    """A replay may take a session's KV over here (no MTP head, no recurrent layers:
    resume_rules); False: every replay computes everything."""
    mtp: bool = False
    """Last stage with an MTP head: its guesses ride back with the tokens."""
    mtp_guesses: int = 0
    mtp_p_min: float = 0.0
    return_logits: bool = False
    resume_grace: float = 30.0
    """Seconds a session whose link died waits for it to come back."""
    session_idle_s: float = 600.0
    """Seconds without a step after which a session is closed."""


class StageCore(Generic[L]):
    """Every session of one stage, its queued steps and its counters."""

    def __init__(
        self,
        setup: StageSetup,
        clock: Callable[[], float],
        admission: AdmissionLedger | None = None,
        node_limits: NodeLimits | None = None,
        plan: StagePlan | None = None,
    ) -> None:
        self.setup = setup
        self.clock = clock
        """The stage's clock (seconds, monotonic): arrivals, activity, grace deadlines."""
        self.rules: SessionRules[L] = SessionRules(
            setup.is_last,
            admission,
            node_limits,
            upstream_is_stage=not setup.is_first,
            history_of=self._history_of if setup.adopts else None,
            first_layer=setup.first_layer,
            plan=plan,
        )
        """Ownership, resume, de-duplication, admission; their table is the stage's."""
        self.stats = WorkerStats()
        self._pending: list[PendingStep] = []
        self._ring_guesses = RingGuesses()
        """Last stage: how a ring that guesses guesses (its state is in each record)."""
        self.ledger = StepLedger()
        """Recent sessions' steps as spot checks ask for them (a stage that sends hidden
        rows on: the last stage's answer depends on its sampling too)."""

    # ------------------------------------------------------------ reading

    @property
    def table(self) -> Mapping[str, SessionRecord[L]]:
        return self.rules.table

    @property
    def sessions(self) -> list[str]:
        return self.rules.sessions

    def __contains__(self, session: object) -> bool:
        return session in self.rules

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def next_deadline(self) -> float | None:
        """When the shell's timer must fire (`TimerFired`): the earliest grace end."""
        ends = [s.grace_until for s in self.table.values() if s.grace_until is not None]
        return min(ends, default=None)

    def _history_of(self, name: str) -> list[int] | None:
        session = self.table.get(name)
        return None if session is None or not session.history_known else session.history

    # ------------------------------------------------------------ events

    def handle(self, event: CoreEvent[L]) -> list[CoreAction[L]]:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            return handler(self, event)
        return self._after_rules(self.rules.handle(event))  # type: ignore[arg-type]

    def _after_rules(
        self, actions: Iterable[Action[L]], link: L | None = None
    ) -> list[CoreAction[L]]:
        """Carry out the rules' actions that are the core's own; pass the rest on."""
        out: list[CoreAction[L]] = []
        for action in actions:
            match action:
                case Take(step, opened):
                    assert link is not None  # a Take answers a frame from a link
                    out += self._take(link, step, opened)
                case Begin():
                    out += self._begin(action)
                case Resent():
                    self.stats.resent_steps += 1  # resent after a resume; handled already
                    out.append(action)
                case Resumed():
                    self.stats.sessions_resumed += 1
                    out.append(action)
                case LinkLost(session, _reason, arm_grace):
                    record = self.table.get(session)
                    if arm_grace and record is not None:
                        record.grace_until = self.clock() + self.setup.resume_grace
                    out.append(action)
                case CancelGrace(session):
                    record = self.table.get(session)
                    if record is not None:
                        record.grace_until = None
                    out.append(action)
                case End(session, _forward, _reason, failed):
                    if failed:
                        self.stats.errors += 1
                    self._drop_pending(session)
                    out.append(action)
                case _:
                    out.append(action)
        return out

    def _on_frame(self, ev: FrameReceived[L]) -> list[CoreAction[L]]:
        return self._after_rules(self.rules.handle(ev), ev.link)

    def _fail(
        self, name: str, code: ErrorCode, message: str, forward_close: bool = True
    ) -> list[CoreAction[L]]:
        return self._after_rules(self.rules.handle(Failed(name, code, message, forward_close)))

    # ------------------------------------------------------------ opening

    def _begin(self, begin: Begin) -> list[CoreAction[L]]:
        frame = begin.open
        name = frame.session
        record = self.table[name]
        record.last_active = self.clock()
        if self.setup.is_last:
            record.params = sampling_from_wire(frame.sampling)
            record.rng = make_rng(record.params)
        out: list[CoreAction[L]] = []
        if self.setup.ring and frame.loop is not None:
            record.ring_node = frame.loop.first_node
            out.append(RingOpen(frame))  # dialled now, while the prompt computes
        self.stats.sessions_opened += 1
        if not begin.adopt:
            out.append(OpenOnStage(name))
            if self.setup.has_next:
                out.append(Forward(frame))
            return out
        # A replay continues `adopt`, whose first `kept` positions this stage holds (the
        # rules checked owner and history, and gave the record its tokens): the KV moves.
        self.stats.sessions_adopted += 1
        self.stats.rows_reused += begin.kept
        self.ledger.refuse(name)  # its cache here is another session's: no prefix to check
        self._drop_pending(begin.adopt)
        out.append(AdoptOnStage(begin.adopt, name, begin.kept))
        if self.setup.has_next:
            # The next stage takes the old session over too (the client named the layer
            # from which every stage may) or, as the OPEN comes over the link that owns
            # it, ends it (rules.sessions): no CLOSE for it, which would find it gone.
            out += [Forward(frame), ForgetDownstream(begin.adopt)]
        return out

    def _on_opened(self, ev: StageOpened) -> list[CoreAction[L]]:
        if not ev.error:
            return []
        return self._fail(ev.session, ErrorCode.OVERLOADED, ev.error)

    def _on_adopted(self, ev: StageAdopted) -> list[CoreAction[L]]:
        if not ev.error:
            return []
        # The cache could not be handed over: the old session goes, and the replay's
        # typed error makes the client replay everything (nothing held is used).
        message = f"cannot continue {ev.old}: {ev.error}"
        return [CloseOnStage(ev.old), *self._fail(ev.session, ErrorCode.MISSING_POSITIONS, message)]

    # ------------------------------------------------------------ steps in

    def _take(self, link: L, frame: wire.Step, opened: wire.Open) -> list[CoreAction[L]]:
        """A step the rules let through: check its rows against this stage, skip what a
        replay's session holds already, queue the rest."""
        if frame.wire_dtype != opened.wire_dtype and frame.hidden is not None:
            message = "rows in a dtype the session did not open with"
            return self._refused(link, frame.session, ErrorCode.BAD_DTYPE, message)
        record = self.table[frame.session]
        record.last_active = self.clock()
        skip = rows_to_skip(record.kept, frame.start, frame.n_rows)
        if skip:  # a replay's rows this stage kept from the session it continues
            if skip == frame.n_rows:
                return []
            frame = trimmed(frame, skip)
        try:
            request = step_request(frame, self.setup.is_first, self.setup.n_embd)
        except FrameError as exc:
            return self._refused(link, frame.session, exc.code, exc.message)
        if request.hidden is not None:
            # Rows no model computes never reach the engine (the session's KV stays as
            # it was); the ERROR names the check and where the rows came in, so the
            # client suspects the stage that sent them (app.session.rows_refusal).
            bad = check_rows(request.hidden)
            if bad is not None:
                self.stats.rows_refused += 1
                refusal = RowsRefusal(bad.check.value, self.setup.first_layer)
                why = f"step {frame.step_id}: {bad.detail}"
                message = rows_refused_message(refusal, why)
                rejected = StepRejected(link, frame.session, ErrorCode.STAGE_ERROR, message)
                return self._after_rules(self.rules.handle(rejected))
        if frame.one_by_one:
            self.stats.rows_one_by_one += frame.n_rows
        wake = not self._pending
        self._pending.append(PendingStep(frame, request, self.clock()))
        return [Wake()] if wake else []

    def _refused(self, link: L, session: str, code: ErrorCode, message: str) -> list[CoreAction[L]]:
        return self._after_rules(self.rules.handle(Refused(link, session, code, message)))

    def take_batch(self, row_budget: int) -> Batch | None:
        """The queued steps the engine evaluates next (core.scheduling: decode rows
        first, then prompt chunks, up to `row_budget`), None when none wait."""
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
            chosen = select_batch(queue, row_budget)
            taken = set(chosen)
            batch = [self._pending[i] for i in chosen]
            self._pending = [p for i, p in enumerate(self._pending) if i not in taken]
            for p in self._pending:
                p.waited += 1
            batch = [p for p in batch if p.request.session in self.table]
            if batch:
                checks = guess_checks(batch, self.table) if self.setup.is_last else {}
                return Batch(batch, checks)
        return None

    def sent(self, taken: wire.Step, sent: wire.Step) -> None:
        """The shell sent a step's rows on (`Forward`): recorded as they went, so a spot
        check compares what the next stage received."""
        if sent.hidden is not None:
            self.ledger.record(taken.session, ledger_step(taken, sent.hidden, sent.wire_dtype))

    def _drop_pending(self, name: str) -> None:
        self._pending = [p for p in self._pending if p.step.session != name]

    # ------------------------------------------------------------ results out

    def _on_computed(self, ev: StepsComputed) -> list[CoreAction[L]]:
        batch = ev.batch.items
        compute_ms = (ev.finished - ev.started) * 1e3
        self.stats.batches += 1
        self.stats.last_compute_ms = compute_ms
        self.stats.last_queue_ms = max((ev.started - p.arrived) * 1e3 for p in batch)
        self.stats.rows += ev.batch.rows
        out: list[CoreAction[L]] = []
        for i, (p, result) in enumerate(zip(batch, ev.results, strict=True)):
            queue_ms = (ev.started - p.arrived) * 1e3
            out += self._emit(p, result, compute_ms, queue_ms, ev.verdicts.get(i))
        out.append(Flush())
        return out

    def _emit(
        self,
        p: PendingStep,
        result: StepResult | StepFailure,
        compute_ms: float,
        queue_ms: float,
        verdict: Verdict | None,
    ) -> list[CoreAction[L]]:
        session = self.table.get(p.step.session)
        if session is None:
            return []  # closed while computing
        now = self.clock()
        session.last_active = now
        if isinstance(result, StepFailure):
            # Rows that do not continue the cache (this stage restarted, its KV is gone):
            # a typed code the client answers by replaying, never a guess.
            missing = isinstance(result.error, PositionError)
            code = ErrorCode.MISSING_POSITIONS if missing else ErrorCode.STAGE_ERROR
            return self._fail(p.step.session, code, str(result.error))
        self.stats.steps += 1
        timing = wire.StageTiming(
            self.setup.first_layer, compute_ms, queue_ms, (now - p.arrived) * 1e3
        )
        timings = (*p.step.timings, timing)
        if not self.setup.is_last:
            assert result.hidden is not None and self.setup.has_next
            if session.history_known and self.setup.adopts:
                session.history_known = extend_history(session.history, p.step)
            dtype = WireDtype(session.open.wire_dtype)
            onward = onward_step(p.step, result.hidden, dtype, timings)
            self.stats.hidden_bytes_sent += len(onward.hidden or b"")
            return [Forward(onward, p.step)]
        assert result.logits is not None
        self.ledger.witness(p.step.session, p.step.start)
        return self._sample_and_reply(session, p.step, result.logits, timings, verdict)

    def _sample_and_reply(
        self,
        session: SessionRecord[L],
        step: wire.Step,
        logits: np.ndarray,
        timings: tuple[wire.StageTiming, ...],
        verdict: Verdict | None,
    ) -> list[CoreAction[L]]:
        chosen = choose_tokens(session, step, logits, verdict)
        if chosen is None:
            return []  # an intermediate prompt chunk: nothing to say yet
        self.stats.tokens += len(chosen)
        reply = tokens_reply(session, step, chosen, logits, timings, self.setup.return_logits)
        k = min(self.setup.mtp_guesses, session.open.max_tokens - session.generated - 1)
        session.guess_gate = gate_step(session.guess_gate, bool(step.guesses))
        if self.setup.mtp and not reply.finished and k > 0 and gate_open(session.guess_gate):
            # The model's own guesses of the next tokens ride back with this reply.
            position = chosen_position(step, reply.n_accepted)
            return [Guess(reply, position, chosen[-1], k)]
        out: list[CoreAction[L]] = []
        if self.setup.ring and session.reply is not None:
            # The next step to the first stage, where it may; not while the client is
            # away (it may be gone for good: the session waits for it, as without ring).
            reply, onward = go_round(self._ring_guesses, session, step, reply, self.clock())
            if onward is not None and session.ring_node is not None:
                out.append(RingSend(session.ring_node, onward))
        # To the client now, or when its link is back.
        return out + self._after_rules(self.rules.handle(TokensReady(reply)))

    def _on_guessed(self, ev: Guessed) -> list[CoreAction[L]]:
        session = self.table.get(ev.reply.session)
        if session is None:
            return []
        session.guess_gate = gate_offered(session.guess_gate, ev.guesses)
        reply = replace(ev.reply, guesses=ev.guesses)
        return self._after_rules(self.rules.handle(TokensReady(reply)))

    # ------------------------------------------------------------ links onward

    def _on_downstream_refused(self, ev: DownstreamRefused) -> list[CoreAction[L]]:
        if ev.error.session not in self.rules:
            return []
        # An error further down the chain: pass it back towards the client.
        return self._fail(ev.error.session, ev.error.code, ev.error.message, forward_close=False)

    def _on_downstream_lost(self, ev: DownstreamLost) -> list[CoreAction[L]]:
        out: list[CoreAction[L]] = []
        for name in self.sessions:
            out += self._fail(name, ErrorCode.STAGE_ERROR, ev.reason, forward_close=False)
        return out

    def _on_ring_refused(self, ev: RingRefused) -> list[CoreAction[L]]:
        session = self.table.get(ev.error.session)
        if session is None or session.ring_node != ev.node:
            return []
        if ev.error.code is ErrorCode.UNKNOWN_SESSION:
            # The first stage ended the session (its client's CLOSE got there before the
            # step of the token after the end): the CLOSE reaches here down the chain.
            return []
        message = f"first stage refused a step: {ev.error.message}"
        return self._fail(ev.error.session, ev.error.code, message)

    def _on_ring_lost(self, ev: RingLost) -> list[CoreAction[L]]:
        out: list[CoreAction[L]] = []
        for name in [n for n, s in self.table.items() if s.ring_node == ev.node]:
            record = self.table.get(name)
            if record is None:
                continue
            record.ring_node = None
            out += self._fail(name, ErrorCode.STAGE_ERROR, f"ring to the first stage: {ev.reason}")
        return out

    # ------------------------------------------------------------ time

    def _on_timer(self, _ev: TimerFired) -> list[CoreAction[L]]:
        """End the sessions whose link did not come back within their grace."""
        now = self.clock()
        due = [
            name
            for name, s in self.table.items()
            if s.state is LinkState.WAITING and s.grace_until is not None and s.grace_until <= now
        ]
        out: list[CoreAction[L]] = []
        for name in due:
            out += self._after_rules(self.rules.handle(GraceExpired(name)))
        return out

    def _on_sweep(self, _ev: SweepIdle) -> list[CoreAction[L]]:
        """Close the sessions that stopped stepping (peers.idle_sessions): a client that
        went away, or one holding slots it never uses, frees them and their KV."""
        idle_s = self.setup.session_idle_s
        busy = {p.step.session for p in self._pending}
        last = {name: s.last_active for name, s in self.table.items()}
        out: list[CoreAction[L]] = []
        for name in idle_sessions(last, busy, self.clock(), idle_s):
            self.stats.sessions_idle_closed += 1
            message = f"no step for {idle_s:g} s: session closed"
            out += self._fail(name, ErrorCode.STAGE_ERROR, message)
        return out


_HANDLERS: dict[type, Callable[[Any, Any], list[Any]]] = {
    FrameReceived: StageCore._on_frame,
    StageOpened: StageCore._on_opened,
    StageAdopted: StageCore._on_adopted,
    StepsComputed: StageCore._on_computed,
    Guessed: StageCore._on_guessed,
    DownstreamRefused: StageCore._on_downstream_refused,
    DownstreamLost: StageCore._on_downstream_lost,
    RingRefused: StageCore._on_ring_refused,
    RingLost: StageCore._on_ring_lost,
    TimerFired: StageCore._on_timer,
    SweepIdle: StageCore._on_sweep,
}
