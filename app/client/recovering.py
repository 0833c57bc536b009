"""A swarm client whose answers survive a stage dying mid-way (the shell of
`app.client.recovery`, which decides).

It wraps one `SwarmClient` at a time. When a generation fails, it probes every stage of
the route (a short dial each: a killed worker's port answers nothing), asks the
policy what to do, asks the route source for a route avoiding the dead stages (the
coordinator offers one once it re-planned around them), connects a fresh client on it
and replays the tokens so far (prompt + generated) as a new session that names the one
it continues (the stages after the replaced one keep its KV: app.serving.rules.resume),
each position with the shape it first had (app.session.replay_shapes: the answer equals an
uninterrupted run's bit for bit, not only nearly). The caller's stream goes on with the
next token: a pause, never an error, while a replacement exists. Each recovery's stall
(failure noticed -> next token) is kept in `stalls`.

A stage the coordinator's spot checks convict (it lists faulty nodes with every route;
the client asks every `faulty_poll_s` while answering, and whenever it re-routes) is
avoided like a dead one, and what it touched is taken back: the stream carries
`SuspectTokens` naming the answer's tokens from the first one computed through it, and
the answer goes on from there on a chain without it, replayed from nothing (the stages
after it hold KV computed from its rows), so it ends as an honest chain's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from app.client.generation import AnswerEvent, SuspectTokens
from app.client.recovery import (
    Decision,
    Probe,
    RecoveryAction,
    RecoveryPolicy,
    accused,
    classify,
    convicted_span,
    dead_stages,
    decide,
    first_layer_to_adopt,
)
from app.client.swarm_client import (
    DEFAULT_CHUNK,
    NO_GUESSES,
    ChannelDialer,
    SwarmClient,
    TokenEvent,
)
from app.config import Route
from app.errors import AppError, ClientError, RouteUnavailable, StageFailed
from app.session.replay_resume import resume_ref
from app.session.replay_shapes import replay_segments
from coordinator.errors import CoordinatorError
from core.guessing import GuessPolicy
from core.types import SamplingParams
from net.channel import NodeCredentials, connect_channel
from net.errors import ErrorCode, NetError
from net.quic.links import PeerUnreachable, QuicTuning
from net.wire.tensors import WireDtype

log = logging.getLogger(__name__)

DEFAULT_POLICY = RecoveryPolicy()

RouteSource = Callable[[tuple[str, ...]], Awaitable[Route]]
"""(node ids to avoid) -> a route without them; raises AppError while there is none."""


class StageDead(RouteUnavailable):
    """A stage of the route stopped answering dials while an answer waited on it."""

    def __init__(self, dead: tuple[str, ...]) -> None:
        super().__init__(f"stage {', '.join(dead)} stopped answering")
        self.dead = dead


class StageFaulty(RouteUnavailable):
    """The coordinator lists stages that served the answer as faulty: a spot check found
    them computing rows no honest stage computes."""

    def __init__(self, nodes: tuple[str, ...]) -> None:
        super().__init__(f"stage {', '.join(nodes)} was found faulty by a spot check")
        self.nodes = nodes


@dataclass(frozen=True)
class Recovery:
    """One answer's recovery, for logs, tests and the soak report."""

    failure: str
    dead: tuple[str, ...]
    replayed: int
    """Positions replayed on the new chain."""
    stall_s: float
    """Failure noticed -> first token on the new chain."""
    route: tuple[str, ...] = field(default=())
    replays: int = 1
    """Replays it took: more than 1 when a replay broke again before its first token."""


def _stage_refs(route: Route) -> list[tuple[str, int, int]]:
    return [(s.node_id, s.layers.start, s.layers.stop) for s in route.stages]


class RecoveringClient:
    def __init__(
        self,
        creds: NodeCredentials,
        route: Route,
        route_source: RouteSource,
        policy: RecoveryPolicy = DEFAULT_POLICY,
        tuning: QuicTuning = QuicTuning(),
        dialer: ChannelDialer | None = None,
        step_timeout: float | None = None,
        first_token_timeout: float = 60.0,
        guesses: GuessPolicy = NO_GUESSES,
        keep_kv: bool = True,
        vocab_size: int | None = None,
    ) -> None:
        self.creds = creds
        self.vocab_size = vocab_size
        """The model's vocabulary, for each client's checks of TOKENS."""
        self.keep_kv = keep_kv
        """Replays name the session they continue (a surviving last stage keeps its KV);
        False: every replay starts from nothing on every stage (benchmarks compare)."""
        self.route = route
        self.policy = policy
        self.guesses = guesses
        """Guessing ahead for answers that do not choose (as `SwarmClient.guesses`)."""
        self._route_source = route_source
        self._tuning = tuning
        self._dialer = dialer
        self._step_timeout = policy.step_timeout_s if step_timeout is None else step_timeout
        self._first_token_timeout = first_token_timeout
        self._client = self._make(route)
        self._switching = asyncio.Lock()
        """Concurrent answers (the API) that break together switch the client once."""
        self.recoveries: list[Recovery] = []
        self.faulty: frozenset[str] = frozenset(route.faulty)
        """Nodes the coordinator last listed as faulty."""
        self._faulty_asked = time.monotonic()
        self._faulty_ask: asyncio.Future[None] | None = None

    def _make(self, route: Route) -> SwarmClient:
        return SwarmClient(
            self.creds,
            route,
            self._tuning,
            first_token_timeout=self._first_token_timeout,
            step_timeout=self._step_timeout,
            dialer=self._dialer,
            vocab_size=self.vocab_size,
        )

    @property
    def linked(self) -> frozenset[str]:
        return self._client.linked

    @property
    def relinks(self) -> int:
        return self._client.relinks

    @property
    def stalls(self) -> list[float]:
        return [r.stall_s for r in self.recoveries]

    async def connect(self) -> None:
        """Connect along the route; if a stage of it is already dead (a volunteer left
        between the route and the dial), connect along one avoiding it instead."""
        try:
            await self._client.connect()
        except (AppError, CoordinatorError, NetError, OSError, TimeoutError) as exc:
            dead = dead_stages(await self._probe(self.route), failed=True)
            log.warning("connecting failed (%s); dead stages %s: asking for a route", exc, dead)
            await self._switch(Decision(RecoveryAction.REROUTE, avoid=dead), exc, self._client)

    async def close(self) -> None:
        if self._faulty_ask is not None:
            self._faulty_ask.cancel()
        await self._client.close()

    async def __aenter__(self) -> RecoveringClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        wire_dtype: WireDtype = WireDtype.F32,
        chunk: int = DEFAULT_CHUNK,
        is_end: Callable[[int], bool] = lambda _t: False,
        guesses: GuessPolicy | None = None,
    ) -> AsyncIterator[AnswerEvent]:
        """`SwarmClient.generate`, continued on a replacement chain when a stage dies, and
        taken back from where a stage found faulty joined it (`SuspectTokens`). Guesses
        (default `self.guesses`) restart from the replayed history (the guesses come
        from it)."""
        if guesses is None:
            guesses = self.guesses
        produced: list[int] = []
        recoveries = 0
        pending: tuple[Decision, float, str, tuple[str, ...]] | None = None
        replays = 0
        previous: str | None = None
        previous_route = self.route
        served: dict[str, int] = {}
        """Node -> the first generated token it helped compute (0: the prompt's too)."""
        while True:
            history = [*prompt, *produced]
            client = self._client
            for stage in client.route.stages:
                served.setdefault(stage.node_id, len(produced))
            # A replay names the session it continues: the stages that kept it (the run
            # of them ending the route) keep its KV and compute only what they lack
            # (app.serving.rules.resume).
            name = uuid.uuid4().hex
            resume = None
            if previous is not None and pending is not None and self.keep_kv:
                decision, dead = pending[0], pending[3]
                from_layer = first_layer_to_adopt(
                    _stage_refs(previous_route),
                    _stage_refs(client.route),
                    dead,
                    state_lost=decision.verdict is RecoveryAction.REPLAY,
                )
                if from_layer is not None:
                    resume = resume_ref(previous, history, from_layer)
            answered = False
            try:
                async for event in self._watched(
                    served,
                    client.generate(
                        history,
                        max_tokens - len(produced),
                        sampling,
                        wire_dtype,
                        chunk,
                        is_end,
                        guesses,
                        session=name,
                        resume=resume,
                        # Every position with the shape it first had: the prompt in its
                        # chunks, each generated row alone (app.session.replay_shapes).
                        segments=replay_segments(len(prompt), chunk, len(produced)),
                    ),
                ):
                    if pending is not None:
                        decision, noticed, failure, dead = pending
                        stall = time.monotonic() - noticed
                        self.recoveries.append(
                            Recovery(
                                failure,
                                dead,
                                decision.replay_tokens,
                                stall,
                                tuple(s.node_id for s in self.route.stages),
                                replays,
                            )
                        )
                        log.warning(
                            "answer resumed on %s after %.2f s (%d positions replayed)",
                            " -> ".join(s.node_id for s in self.route.stages),
                            stall,
                            decision.replay_tokens,
                        )
                        pending = None
                    produced.extend(event.tokens)
                    answered = True
                    yield event
                return
            except (ClientError, NetError) as exc:
                noticed = time.monotonic()
                # The session the last stage holds: a replay that broke before its first
                # token may never have reached it (its OPEN died with the stage before,
                # e.g. one whose next hop was being replaced), so the next replay names
                # the session that last answered, not that one.
                if previous is None or answered:
                    previous, previous_route = name, client.route
                code = exc.error_code if isinstance(exc, StageFailed) else None
                if isinstance(exc, StageDead):
                    dead = exc.dead
                elif isinstance(exc, StageFaulty):
                    dead = exc.nodes
                elif code is ErrorCode.ROUTE_MOVED:
                    dead = ()  # every stage answered; the coordinator's route is newer
                else:
                    # Stages it still has a link to are alive; dialling them again would
                    # move their replies off that link (the last stage sends TOKENS on
                    # a client's newest link). The answer failed for real, so a silent
                    # stage is a suspect now.
                    probes = await self._probe(client.route, skip=client.linked)
                    dead = dead_stages(probes, failed=True)
                unreachable = bool(dead)
                # A stage that sent rows or TOKENS no honest stage sends is avoided like
                # a dead one, though it still answers.
                suspects = accused(exc, _stage_refs(client.route))
                dead = tuple(dict.fromkeys([*dead, *suspects]))
                decision = decide(
                    classify(code, unreachable),
                    recoveries,
                    dead,
                    len(prompt) + len(produced),  # what the replay will send
                    self.policy,
                )
                log.warning(
                    "answer broke (%s); dead or suspect stages %s: %s", exc, dead, decision.verdict
                )
                if decision.verdict is RecoveryAction.GIVE_UP:
                    raise
                recoveries += 1
                if pending is not None:  # broke again before a token came: one long stall
                    noticed, failure = pending[1], f"{pending[2]}; then {exc}"
                    dead = tuple(dict.fromkeys([*pending[3], *dead]))
                    replays += 1
                else:
                    failure, replays = str(exc), 1
                await self._switch(decision, exc, client)
                pending = (decision, noticed, failure, dead)
                span = convicted_span(served, self.faulty)
                if span is not None:
                    first, convicted = span
                    if first < len(produced):
                        yield SuspectTokens(first, len(produced) - first, convicted)
                        del produced[first:]
                    served = {n: min(i, first) for n, i in served.items() if n not in convicted}
                    # The stages after a faulty one hold KV computed from its rows: the
                    # replay starts from nothing everywhere.
                    previous = None

    async def _watched(
        self, served: Mapping[str, int], stream: AsyncIterator[TokenEvent]
    ) -> AsyncIterator[TokenEvent]:
        """`stream`, probing the route whenever an answer is `probe_after_s` late: a stage
        whose host says nothing listens ends the wait at once (`StageDead`) instead of at
        the step deadline; one that is merely slow or silent is waited for (the chain's
        typed error or the step deadline decides, `dead_stages`). A node that `served`
        the answer, on this route or an earlier one, found faulty since ends it too
        (`StageFaulty`): what it touched is taken back."""
        try:
            while True:
                nxt = asyncio.ensure_future(anext(stream))
                while True:
                    done, _ = await asyncio.wait({nxt}, timeout=self.policy.probe_after_s)
                    if done:
                        break
                    probes = await self._probe(self._client.route, skip=self._client.linked)
                    dead = dead_stages(probes, failed=False)
                    if dead:
                        nxt.cancel()
                        with contextlib.suppress(BaseException):
                            await nxt
                        raise StageDead(dead)
                try:
                    event = nxt.result()
                except StopAsyncIteration:
                    return
                self._ask_faulty()
                span = convicted_span(served, self.faulty)
                if span is not None:
                    raise StageFaulty(span[1])
                yield event
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    def _ask_faulty(self) -> None:
        """Ask the coordinator which nodes are faulty, in the background, when
        `faulty_poll_s` has passed since the last ask (one ask at a time, shared by
        concurrent answers)."""
        now = time.monotonic()
        if now - self._faulty_asked < self.policy.faulty_poll_s:
            return
        if self._faulty_ask is not None and not self._faulty_ask.done():
            return
        self._faulty_asked = now

        async def ask() -> None:
            try:
                route = await self._route_source(())
            except (AppError, CoordinatorError, NetError, OSError, TimeoutError) as exc:
                log.info("could not ask which nodes are faulty: %s", exc)
                return
            self.faulty = frozenset(route.faulty)

        self._faulty_ask = asyncio.ensure_future(ask())

    async def _probe(self, route: Route, skip: frozenset[str] = frozenset()) -> dict[str, Probe]:
        """What a short dial finds at each stage of `route` outside `skip` (in parallel):
        the advertised address first (a killed process's host answers "nothing listens"),
        then, for a joined client, the link dialer (ICE through the coordinator: a stage
        behind NAT answers only there)."""

        async def probe(node_id: str, address: tuple[str, int]) -> Probe:
            try:
                channel = await connect_channel(
                    address, self.creds, node_id, self._tuning, self.policy.probe_timeout_s
                )
            except PeerUnreachable:
                return Probe.GONE
            except (NetError, OSError, TimeoutError):
                if self._dialer is None:
                    return Probe.SILENT
                try:
                    channel = await asyncio.wait_for(
                        self._dialer(node_id, address), self.policy.ice_probe_timeout_s
                    )
                except (NetError, OSError, TimeoutError):
                    return Probe.SILENT
            channel.close("probe done")
            return Probe.ALIVE

        stages = [s for s in route.stages if s.node_id not in skip]
        found = await asyncio.gather(*(probe(s.node_id, s.address) for s in stages))
        return {s.node_id: seen for s, seen in zip(stages, found, strict=True)}

    async def _dead(self, route: Route, skip: frozenset[str]) -> tuple[str, ...]:
        """Stages of `route` outside `skip` not serving now (a spare still loading)."""
        return dead_stages(await self._probe(route, skip), failed=True)

    async def _still_dead(self, avoid: tuple[str, ...]) -> tuple[str, ...]:
        """Of the stages being avoided, those still not serving where the coordinator
        says they are now. A stage that restarted (a reboot: back within the
        coordinator's stale_after_s, so it keeps its place in the plan, maybe at a new
        address) serves again; the coordinator will not route around it, and the
        replay's fresh session needs none of its lost KV, so it is used again."""
        if not avoid:
            return avoid
        try:
            current = await self._route_source(())
        except (AppError, CoordinatorError, NetError, OSError, TimeoutError):
            return avoid  # the coordinator is down too: nothing new to go by
        planned = frozenset(s.node_id for s in current.stages)
        dead = await self._dead(current, skip=planned - set(avoid))
        return tuple(n for n in avoid if n in dead or n not in planned)

    async def _switch(self, decision: Decision, error: Exception, broken: SwarmClient) -> None:
        """Close the broken client and connect one on a route the decision allows; if
        another answer already did (concurrent API requests), use that one."""
        async with self._switching:
            if self._client is not broken:
                return
            await self._switch_now(decision, error)

    async def _switch_now(self, decision: Decision, error: Exception) -> None:
        with contextlib.suppress(Exception):
            await self._client.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.route_wait_s
        last: Exception = error
        avoid = decision.avoid
        while loop.time() < deadline:
            try:
                route = (
                    self.route
                    if decision.verdict is RecoveryAction.REPLAY and not avoid
                    else await self._route_source(avoid)
                )
                if any(s.node_id in avoid for s in route.stages):
                    raise RouteUnavailable("the route still passes through a dead stage")
                # A spare the coordinator just placed may still be loading: replaying
                # before it listens would only fail again.
                old = frozenset(s.node_id for s in self.route.stages) - set(avoid)
                waiting = await self._dead(route, skip=old)
                if waiting:
                    raise RouteUnavailable(f"{', '.join(waiting)} not serving yet")
                client = self._make(route)
                await client.connect()
            except (AppError, CoordinatorError, NetError, OSError, TimeoutError) as exc:
                last = exc
                await asyncio.sleep(0.5)
                avoid = await self._still_dead(avoid)
                continue
            self._client, self.route = client, route
            self.faulty = frozenset(route.faulty)
            return
        raise RouteUnavailable(
            f"no route avoiding {', '.join(decision.avoid) or 'the failed stage'} "
            f"within {self.policy.route_wait_s:.0f} s: {last}"
        ) from error
