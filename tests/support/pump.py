"""A chain of stage cores pumped in memory, frame by frame: no sockets, no threads, no
model (as aioquic's tests pump a client and a server connection into each other).

- `ChainEngine`: a deterministic stand-in for llama.cpp behind the real `core.stage.Stage`
  (slots, positions, cuts, hand-overs). The first stage turns token rows into hidden
  rows [token, position, stages passed, 0...]; later stages pass them on, counting
  themselves; the last stage reads the token back and answers logits peaked at
  `next_token` of the two tokens before it in its own cache, so a stage that lost or
  skipped positions it needed answers wrong (or fails, as its cache has a hole).
- `StageHost`: what app.serving.worker does around a `StageCore`, synchronously:
  engine calls run at once, frames go into the `Net`.
- `Net`: links as names between two ends; every frame crosses as bytes (net.wire).
- `ClientDriver`: a client as app.client's swarm client steps it (OPEN, prompt, then
  each next STEP with `GuessTracker` guesses, CLOSE at the end; a replay's OPEN and
  rows after a stage is lost); it records every frame it gets.
- `Chain`: the client and N hosts; `pump` delivers frames and runs engine batches until
  nothing moves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from app.serving.rules.events import (
    Action,
    End,
    Failed,
    FrameReceived,
    LinkClosed,
    LinkReady,
    Release,
    Send,
)
from app.serving.rules.stage import CoreAction, CoreEvent, StageCore, StageSetup
from app.serving.rules.work import (
    AdoptOnStage,
    CloseOnStage,
    DownstreamRefused,
    ForgetDownstream,
    Forward,
    Guess,
    Guessed,
    OpenOnStage,
    RingOpen,
    RingRefused,
    RingSend,
    StageAdopted,
    StageOpened,
    StepsComputed,
)
from app.serving.steps.batch import StageSteps
from app.session.guess_tracker import GuessTracker
from app.session.replay_resume import resume_ref
from app.session.replay_shapes import plain_segments, replay_segments
from app.session.token_step import token_step
from core.admission import AdmissionLedger, AdmissionPolicy
from core.errors import CoreError
from core.guessing import GuessPolicy
from core.stage import Stage
from core.types import LayerRange, StageSpec
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

N_EMBD = 4
N_VOCAB = 8
CLIENT = "client"


def next_token(before: int, last: int) -> int:
    """The fake model: the token after `before`, `last` (ids 1..4, eventually periodic,
    so n-gram guesses from the text come true)."""
    return (before + last) % 4 + 1


def answer_of(prompt: Sequence[int], n: int) -> list[int]:
    """The `n` tokens the fake model answers after `prompt` (greedy)."""
    text = list(prompt)
    for _ in range(n):
        text.append(next_token(text[-2], text[-1]))
    return text[len(prompt) :]


def prompt_of(n: int, seed: tuple[int, int] = (1, 2)) -> list[int]:
    """A prompt the fake model would itself have written from `seed`."""
    return [*seed, *answer_of(seed, n - 2)]


F32 = npt.NDArray[np.float32]


class ChainEngine:
    """`core.stage.Engine` for one stage of the fake model (see the module)."""

    def __init__(self, is_first: bool, is_last: bool) -> None:
        self.n_embd = N_EMBD
        self.n_vocab = N_VOCAB
        self.is_first = is_first
        self.is_last = is_last
        self.cache: dict[int, dict[int, int]] = {}
        """seq id -> position -> token: what this stage's KV holds."""
        self.rows = 0
        """Rows evaluated (a replay that keeps the KV computes few)."""

    def decode(
        self,
        positions: npt.NDArray[np.int32],
        seq_ids: npt.NDArray[np.int32],
        outputs: npt.NDArray[np.bool_],
        tokens: npt.NDArray[np.int32] | None = None,
        hidden: F32 | None = None,
    ) -> F32:
        out: list[F32] = []
        for i, (pos, seq) in enumerate(zip(positions.tolist(), seq_ids.tolist(), strict=True)):
            self.rows += 1
            if tokens is not None:
                token, passed = int(tokens[i]), 0.0
            else:
                assert hidden is not None and int(hidden[i, 1]) == pos, "rows out of place"
                token, passed = int(hidden[i, 0]), float(hidden[i, 2])
            held = self.cache.setdefault(seq, {})
            held[pos] = token
            if not self.is_last:
                out.append(np.array([token, pos, passed + 1, 0.0], dtype=np.float32))
            elif outputs[i]:
                logits = np.zeros(N_VOCAB, dtype=np.float32)
                before = held.get(pos - 1)
                if before is not None:  # a hole in the cache answers token 0 (wrong)
                    logits[next_token(before, token)] = 1.0
                out.append(logits)
        width = N_VOCAB if self.is_last else N_EMBD
        return np.stack(out) if out else np.zeros((0, width), dtype=np.float32)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        held = self.cache.get(seq_id, {})
        for pos in [p for p in held if p >= p0 and (p1 < 0 or p < p1)]:
            del held[pos]
        return True

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Net:
    """Links between two ends; a frame crosses as bytes and waits in one FIFO queue."""

    ends: dict[str, tuple[str, str]] = field(default_factory=dict)
    queue: deque[tuple[str, str, str, wire.Frame]] = field(default_factory=deque)
    """(from, to, link, frame)"""

    def connect(self, link: str, a: str, b: str) -> None:
        self.ends[link] = (a, b)

    def other(self, link: str, me: str) -> str:
        a, b = self.ends[link]
        return b if me == a else a

    def send(self, me: str, link: str, frame: wire.Frame) -> None:
        if link not in self.ends:  # closed: the frame is lost
            return
        frame = wire.decode(wire.encode(frame))  # only what the wire carries arrives
        self.queue.append((me, self.other(link, me), link, frame))


class StageHost:
    """A stage node: a `StageCore` and the real `Stage` on a `ChainEngine`, run the way
    app.serving.worker runs them, minus threads and sockets."""

    def __init__(
        self,
        node: str,
        net: Net,
        layers: LayerRange,
        n_layer_total: int,
        clock: Clock,
        max_sessions: int = 4,
        upstream: str | None = None,
        downstream: str | None = None,
    ) -> None:
        self.node = node
        self.net = net
        spec = StageSpec(layers, n_layer_total, n_ctx=512, n_batch=64, n_seq_max=max_sessions)
        self.engine = ChainEngine(spec.is_first, spec.is_last)
        self.stage = Stage(self.engine, spec)
        self.steps = StageSteps(self.stage, exact_guesses=True, recurrent=False)
        self.upstream = upstream
        """The link this stage's sessions come over (the client's on the first stage)."""
        self.downstream = downstream
        """The link to the next stage."""
        self.ring_links: dict[str, str] = {}
        """Last stage: first stage node id -> the ring link to it."""
        setup = StageSetup(
            is_first=spec.is_first,
            is_last=spec.is_last,
            n_embd=N_EMBD,
            first_layer=layers.start,
            has_next=downstream is not None,
            ring=spec.is_last and not spec.is_first,
        )
        policy = AdmissionPolicy(n_ctx=spec.n_ctx, max_sessions=max_sessions)
        self.core: StageCore[str] = StageCore(setup, clock, AdmissionLedger(policy))
        self.released: list[tuple[str, str]] = []
        self.mtp_head = False
        """Last stage: answer `Guess` with the model's next tokens (an MTP head that is
        always right); `with_mtp_head` turns it on."""
        self.guessed = 0
        """`Guess` actions carried out."""
        self._answers: list[CoreEvent[str]] = []
        """The engine's answers, fed after the actions that asked (as done-callbacks)."""
        self.sent: list[tuple[str, wire.Frame]] = []

    # ------------------------------------------------------------ the shell

    def feed(self, event: CoreEvent[str]) -> None:
        self.apply(self.core.handle(event))
        while self._answers:
            self.feed(self._answers.pop(0))

    def apply(self, actions: Sequence[CoreAction[str] | Action[str]]) -> None:
        for action in actions:
            match action:
                case Send(link, frame):
                    self._send(link, frame)
                case Release(link, session):
                    self.released.append((link, session))
                case Forward(frame, taken):
                    assert self.downstream is not None
                    if taken is not None and isinstance(frame, wire.Step):
                        self.core.sent(taken, frame)
                    self._send(self.downstream, frame)
                case ForgetDownstream():
                    pass  # no resend log here: nothing to forget
                case OpenOnStage(session):
                    error = self._engine(self.stage.open, session)
                    self._answers.append(StageOpened(session, error))
                case AdoptOnStage(old, session, kept):
                    error = self._engine(self.stage.adopt, old, session, kept)
                    self._answers.append(StageAdopted(old, session, kept, error))
                case CloseOnStage(session):
                    self._engine(self.stage.close, session)
                case RingOpen(frame):
                    assert frame.loop is not None
                    self._send(self.ring_links[frame.loop.first_node], frame)
                case RingSend(node, step):
                    self._send(self.ring_links[node], step)
                case Guess(reply, position, token, k):
                    self.guessed += 1
                    guesses: tuple[int, ...] = ()
                    if self.mtp_head:  # the model's true next tokens
                        before = self.core.table[reply.session].history[position - 1]
                        guesses = tuple(answer_of([before, token], k))
                    self._answers.append(Guessed(reply, guesses))
                case End(session, forward_close, reason):
                    self._engine(self.stage.close, session)
                    if forward_close and self.downstream is not None:
                        self._send(self.downstream, wire.Close(session, reason))
                case _:
                    pass  # Wake, Flush and what the worker only logs

    def with_mtp_head(self, guesses: int) -> None:
        """This last stage has an MTP head offering up to `guesses` tokens a reply."""
        self.mtp_head = True
        self.core.setup = replace(self.core.setup, mtp=True, mtp_guesses=guesses)

    def _send(self, link: str, frame: wire.Frame) -> None:
        self.sent.append((link, frame))
        self.net.send(self.node, link, frame)

    @staticmethod
    def _engine(call: object, *args: object) -> str:
        """An engine call; the error's text, "" when it went through."""
        try:
            call(*args)  # type: ignore[operator]
        except CoreError as exc:
            return str(exc)
        return ""

    def receive(self, link: str, peer: str, frame: wire.Frame) -> None:
        if link == self.downstream:
            if isinstance(frame, wire.Error):
                self.feed(DownstreamRefused(frame))
            return
        if link in self.ring_links.values():
            if isinstance(frame, wire.Error):
                self.feed(RingRefused(peer, frame))
            return
        if isinstance(frame, wire.Error):
            return  # a peer's report: logged by the worker
        self.feed(FrameReceived(link, peer, frame, CLIENT if peer == CLIENT else "worker"))

    def compute(self, row_budget: int = 64) -> bool:
        """One engine step of the queued rows; False when none wait."""
        batch = self.core.take_batch(row_budget)
        if batch is None:
            return False
        results, verdicts = self.steps.run(batch.items, batch.checks)
        now = self.core.clock()
        self.feed(StepsComputed(batch, results, verdicts, now, now))
        return True


@dataclass
class Answer:
    """What a client got back for one session."""

    session: str
    tokens: list[int] = field(default_factory=list)
    errors: list[wire.Error] = field(default_factory=list)
    replies: list[wire.Tokens] = field(default_factory=list)
    finished: bool = False
    looped: int = 0


class ClientDriver:
    """A client of the chain: it steps its sessions as app.client's swarm client does
    (no IO; the `Chain` delivers its frames)."""

    def __init__(self, net: Net, first_link: str, last_link: str) -> None:
        self.net = net
        self.first_link = first_link
        self.last_link = last_link
        self.answers: dict[str, Answer] = {}
        self.pause_after: dict[str, int] = {}
        """Session -> stop stepping once this many tokens came (a stage is then lost)."""
        self._trackers: dict[str, GuessTracker] = {}
        self._opens: dict[str, wire.Open] = {}
        self._prompts: dict[str, list[int]] = {}
        self._step_ids: dict[str, int] = {}
        self._went_round: dict[str, bool] = {}

    def send(self, frame: wire.Frame) -> None:
        self.net.send(CLIENT, self.first_link, frame)

    def open(
        self,
        session: str,
        prompt: Sequence[int],
        max_tokens: int,
        guesses: int = 0,
        loop: wire.Loop | None = None,
        dtype: WireDtype = WireDtype.F32,
        chunk: int = 64,
        resume: tuple[str, int, int | None] | None = None,
    ) -> None:
        """OPEN and the prompt's STEPs; `resume` (old session, tokens generated, first
        layer that kept it): a replay of `prompt` continuing that session."""
        prompt = list(prompt)
        ref = None if resume is None else resume_ref(resume[0], prompt, resume[2])
        frame = wire.Open(
            session,
            "fake",
            dtype,
            wire.SamplingSpec(),
            CLIENT,
            max_tokens,
            len(prompt),
            resumes="" if ref is None else ref.session,
            resume_held=0 if ref is None else ref.held,
            resume_digest=b"" if ref is None else ref.digest,
            resume_from_layer=None if ref is None else ref.from_layer,
            loop=loop,
        )
        self._opens[session] = frame
        self._prompts[session] = prompt
        self.answers[session] = Answer(session)
        self.send(frame)
        segments = (
            plain_segments(len(prompt), chunk)
            if resume is None
            else replay_segments(len(prompt) - resume[1], chunk, resume[1])
        )
        step_id = 0
        for seg in segments:
            rows = tuple(prompt[seg.start : seg.start + seg.rows])
            self.send(token_step(session, step_id, seg.start, rows, one_by_one=seg.one_by_one))
            step_id += 1
        self._step_ids[session] = step_id
        policy = GuessPolicy.fixed(guesses) if guesses else GuessPolicy.fixed(0)
        self._trackers[session] = GuessTracker(prompt, max_tokens, policy)
        self._went_round[session] = False

    def receive(self, link: str, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Error):
            if frame.session in self.answers:
                self.answers[frame.session].errors.append(frame)
            return
        if not isinstance(frame, wire.Tokens) or frame.session not in self.answers:
            return
        answer = self.answers[frame.session]
        if answer.finished or answer.errors:
            return
        answer.replies.append(frame)
        answer.tokens += frame.tokens
        answer.looped += frame.looped
        tracker = self._trackers[frame.session]
        if self._went_round[frame.session]:
            tracker.went_round(frame.tokens, frame.guessed - frame.n_accepted)
        else:
            tracker.reply(frame.tokens, frame.n_accepted, 1.0, frame.guesses)
        opened = self._opens[frame.session]
        if frame.finished or tracker.produced >= opened.max_tokens:
            answer.finished = True
            self.send(wire.Close(frame.session, "done"))
            return
        self._went_round[frame.session] = frame.looped
        if frame.looped:
            self._step_ids[frame.session] += 1
            return
        if len(answer.tokens) >= self.pause_after.get(frame.session, 1 << 30):
            return  # the client waits (a stage is about to be lost)
        nxt = tracker.next_step()
        step_id = self._step_ids[frame.session]
        self._step_ids[frame.session] = step_id + 1
        self.send(
            token_step(
                frame.session,
                step_id,
                nxt.start,
                nxt.tokens,
                guesses=nxt.guesses,
                keep_until=nxt.keep_until,
            )
        )

    def go_on(self, session: str) -> None:
        """Step a paused session again (`pause_after`)."""
        self.pause_after.pop(session, None)
        nxt = self._trackers[session].next_step()
        step_id = self._step_ids[session]
        self._step_ids[session] = step_id + 1
        self.send(
            token_step(
                session,
                step_id,
                nxt.start,
                nxt.tokens,
                guesses=nxt.guesses,
                keep_until=nxt.keep_until,
            )
        )

    def replay(self, old: str, new: str, from_layer: int | None) -> None:
        """Replay `old`'s tokens so far as `new` on the chain as it is now."""
        answer = self.answers[old]
        prompt = [*self._prompts[old], *answer.tokens]
        opened = self._opens[old]
        left = opened.max_tokens - len(answer.tokens)
        self.open(new, prompt, left, resume=(old, len(answer.tokens), from_layer))


class Chain:
    """A client and stages of `cuts` (layer boundaries), linked in a line: the client to
    the first stage and to the last, each stage to the next, the last to the first
    (the ring's link, dialled when a session asks for it)."""

    def __init__(self, cuts: Sequence[int], max_sessions: int = 4) -> None:
        self.net = Net()
        self.clock = Clock()
        self.cuts = list(cuts)
        self.hosts: list[StageHost] = []
        n = len(cuts) - 1
        names = [f"n{i}" for i in range(n)]
        for i in range(n):
            up = "c-n0" if i == 0 else f"{names[i - 1]}-{names[i]}"
            down = None if i == n - 1 else f"{names[i]}-{names[i + 1]}"
            host = StageHost(
                names[i],
                self.net,
                LayerRange(cuts[i], cuts[i + 1]),
                cuts[-1],
                self.clock,
                max_sessions,
                upstream=up,
                downstream=down,
            )
            self.hosts.append(host)
        self.client = ClientDriver(self.net, "c-n0", f"c-{names[-1]}")
        self._link(CLIENT, self.hosts[0], "c-n0")
        if n > 1:
            self._link(CLIENT, self.hosts[-1], f"c-{names[-1]}")
        for a, b in zip(self.hosts, self.hosts[1:], strict=False):
            assert a.downstream is not None
            self._link(a.node, b, a.downstream)
        if n > 1:
            ring = f"ring-{names[-1]}-{names[0]}"
            self.hosts[-1].ring_links[names[0]] = ring
            self._link(names[-1], self.hosts[0], ring)

    @property
    def first(self) -> StageHost:
        return self.hosts[0]

    @property
    def last(self) -> StageHost:
        return self.hosts[-1]

    def loop(self, guesses: int = 0) -> wire.Loop:
        return wire.Loop(self.first.node, "127.0.0.1:7000", self.last.node, guesses, False)

    def _link(self, a: str, b: StageHost, link: str) -> None:
        """`a` dials `b` over `link`: `b` hears of it (LinkReady)."""
        self.net.connect(link, a, b.node)
        b.feed(LinkReady(link, a))

    def host(self, node: str) -> StageHost | None:
        return next((h for h in self.hosts if h.node == node), None)

    def pump(self, max_rounds: int = 10_000) -> None:
        """Deliver every frame, then run one engine step on each stage with rows
        waiting, and again, until nothing moves."""
        for _ in range(max_rounds):
            while self.net.queue:
                _sender, to, link, frame = self.net.queue.popleft()
                if to == CLIENT:
                    self.client.receive(link, frame)
                    continue
                host = self.host(to)
                if host is not None:
                    host.receive(link, self.net.other(link, to), frame)
            computed = [host.compute() for host in self.hosts]
            if not any(computed) and not self.net.queue:
                return
        raise AssertionError("the chain never settled")

    def replace(self, index: int, node: str) -> StageHost:
        """Stage `index` dies and a fresh node with the same layers takes its place: its
        links close, its upstream retargets (failing the sessions that ran through it,
        as app.serving.worker.retarget does), the new node is linked in."""
        old = self.hosts[index]
        for link in [k for k, ends in self.net.ends.items() if old.node in ends]:
            peer = self.net.other(link, old.node)
            del self.net.ends[link]
            near = self.host(peer)
            if near is not None and link != near.downstream:
                near.feed(LinkClosed(link, "peer died"))
        layers = LayerRange(self.cuts[index], self.cuts[index + 1])
        up = self.hosts[index - 1] if index > 0 else None
        down = self.hosts[index + 1] if index + 1 < len(self.hosts) else None
        new = StageHost(
            node,
            self.net,
            layers,
            self.cuts[-1],
            self.clock,
            upstream="c-n0" if up is None else f"{up.node}-{node}",
            downstream=None if down is None else f"{node}-{down.node}",
        )
        self.hosts[index] = new
        if up is not None:
            link = up.downstream = f"{up.node}-{node}"
            for name in up.core.sessions:  # the sessions that ran through the dead node
                failed = Failed(name, ErrorCode.STAGE_ERROR, "next stage replaced", False)
                up.feed(failed)
            self._link(up.node, new, link)
        if down is not None:
            assert new.downstream is not None
            self._link(node, down, new.downstream)
        return new
