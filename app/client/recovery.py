"""What a client does when an answer breaks mid-way: a pure policy, no IO, no clock.

A generation that fails (an ERROR relayed up the chain, a stage that cannot be reached
again, the step deadline) is not lost while the swarm has a replacement for the stage
that broke: the client asks the coordinator for a route that avoids the dead stage and
replays the session's tokens so far (prompt + generated) on it as a fresh session, in
chunks; the new chain's last stage then samples the next position exactly where the old
one stopped. `app.client.recovering.RecoveringClient` feeds each failure here and does
what `decide` says:

    failure                                  attempts left   verdict
    ---------------------------------------  --------------  ---------------------------
    the client's own fault (BAD_VALUE, ...)  -               GIVE_UP (re-sending fails
                                                             the same way)
    a stage of the route is unreachable      yes             REROUTE avoiding it, replay
    the route moved (ROUTE_MOVED: a stage's  yes             REROUTE: ask for the route
      next hop is not the route's)                           as it is now, replay
    a stage reported it lacks positions or   yes             REPLAY on the same route
      the session (it restarted, no KV)                      (a fresh session)
    anything else (STAGE_ERROR, timeout,     yes             REROUTE (avoid what the
      OVERLOADED, link lost)                                 probe found dead), replay
    any                                      no              GIVE_UP

The replay is a new session on every stage, but its OPEN names the session it continues,
carries a digest of the token ids a surviving stage should hold of it (all positions
but the newest; app.session.replay_resume) and names the first layer from which the stages may
keep it (`first_layer_to_adopt`: the run of stages ending the new route that served the
same layers on the old one and were not found dead). Those stages (the one that died was
upstream of them) still hold that session: each checks the client and the digest, takes
the old session's KV over and computes (and passes on) only the final row
(app.serving.rules.resume); the stages before them, the replacement included, hold
nothing usable and compute the whole replay, as their hidden states for every position
are needed downstream. A stage that restarted, whose resume grace (30 s) ran out before
the replay came, or whose history differs holds nothing that matches and computes
everything, as before (`RecoveringClient(keep_kv=False)` always does); one after the
named layer that holds nothing is fed a gap and answers MISSING_POSITIONS, and the
replay after that names only the last stage. The kept prefix and the new rows are the
same layers on the same tokens; only batch shapes differ, which can flip a near tie
(docs/decisions/replay-keeps-kv.md). Stages drop the old session
by its CLOSE, by the takeover or, where the link is gone, by their resume grace. Greedy
answers equal the uninterrupted run up to that; a seeded sampler starts its stream again
at the replay (documented, not hidden: `exact_for` says which answers are exact).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from app.errors import BadTokens, RowsRefused
from core.types import SamplingParams
from net.errors import ErrorCode


class RecoveryAction(Enum):
    REPLAY = "replay on the same route"
    REROUTE = "ask for a route avoiding the dead stages, then replay"
    GIVE_UP = "give up: raise the error"


class Probe(Enum):
    """What one short dial to a stage found."""

    ALIVE = "it answered"
    GONE = "its host said nothing listens there (the process is gone)"
    SILENT = "no answer in time (gone, or only slow, or behind NAT)"


def dead_stages(probes: dict[str, Probe], failed: bool) -> tuple[str, ...]:
    """The stages to treat as dead. While an answer is merely late (`failed` False) only
    a definite GONE counts: a stage that is slow under load, or reachable only through
    ICE (whose direct dial times out by design), must not be declared dead and replayed
    around. Once the answer really failed (a typed error relayed up the chain, or the
    step deadline passed), a SILENT stage is a suspect too."""
    return tuple(
        node
        for node, seen in probes.items()
        if seen is Probe.GONE or (failed and seen is Probe.SILENT)
    )


class FailureKind(Enum):
    CLIENT_FAULT = "the request itself is wrong"
    MISSING_STATE = "a stage lacks the session's positions (restarted)"
    UNREACHABLE = "a stage of the route cannot be reached"
    ROUTE_MOVED = "the route is not the chain any more"
    STAGE = "a stage failed or went silent"


CLIENT_FAULTS = frozenset(
    {
        ErrorCode.MALFORMED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.TOO_LARGE,
        ErrorCode.BAD_DTYPE,
        ErrorCode.BAD_SHAPE,
        ErrorCode.BAD_VALUE,
        ErrorCode.NOT_OWNER,
        ErrorCode.UNAUTHENTICATED,
    }
)
"""Codes that say the request is wrong, not the stage: replaying it would fail again."""

MISSING_STATE = frozenset({ErrorCode.UNKNOWN_SESSION, ErrorCode.MISSING_POSITIONS})


def classify(code: ErrorCode | None, unreachable: bool) -> FailureKind:
    """The kind of a failure: the wire code of an ERROR (None for a timeout or a lost
    link) and whether a stage of the route was found unreachable."""
    if code in CLIENT_FAULTS:
        return FailureKind.CLIENT_FAULT
    if unreachable:
        return FailureKind.UNREACHABLE
    if code in MISSING_STATE:
        return FailureKind.MISSING_STATE
    if code is ErrorCode.ROUTE_MOVED:
        return FailureKind.ROUTE_MOVED
    return FailureKind.STAGE


@dataclass(frozen=True)
class RecoveryPolicy:
    max_recoveries: int = 6
    """Replays per answer; one more failure after that is raised."""
    route_wait_s: float = 90.0
    """How long to wait for the coordinator to offer a route avoiding a dead stage
    (it re-plans once the stage misses its heartbeats, and the spare loads)."""
    probe_timeout_s: float = 3.0
    """How long one dial may take when probing which stage of the route is dead."""
    probe_after_s: float = 2.0
    """An answer this late makes the client probe the route's stages (a short dial to
    each it has no link to); one found gone ends the wait at once."""
    ice_probe_timeout_s: float = 10.0
    """How long a probe through the link dialer (ICE via the coordinator) may take when
    the direct dial got no answer."""
    step_timeout_s: float = 40.0
    """The step deadline while recovering is allowed (a silent chain must be noticed)."""
    faulty_poll_s: float = 5.0
    """How often an answering client asks the coordinator which nodes spot checks found
    faulty (a convicted stage that keeps serving is noticed within this)."""


@dataclass(frozen=True)
class Decision:
    verdict: RecoveryAction
    avoid: tuple[str, ...] = ()
    """Node ids the next route must not contain."""
    replay_tokens: int = 0
    """Positions to replay (prompt + generated so far); generation resumes after them."""


def decide(
    kind: FailureKind,
    recoveries: int,
    dead: Sequence[str],
    n_tokens: int,
    policy: RecoveryPolicy,
) -> Decision:
    """What to do after a failure: `recoveries` done so far for this answer, `dead` the
    stages a probe found unreachable now, `n_tokens` the session's tokens so far (prompt
    + generated). Only what is dead now is avoided: a stage that was down during an
    earlier failure and serves again (a spare that was still loading) is usable."""
    if kind is FailureKind.CLIENT_FAULT or recoveries >= policy.max_recoveries:
        return Decision(RecoveryAction.GIVE_UP)
    avoid = tuple(dict.fromkeys(dead))
    if kind is FailureKind.MISSING_STATE:
        return Decision(RecoveryAction.REPLAY, avoid, n_tokens)
    if kind is FailureKind.ROUTE_MOVED:
        return Decision(RecoveryAction.REROUTE, (), n_tokens)
    return Decision(RecoveryAction.REROUTE, avoid, n_tokens)


StageRef = tuple[str, int, int]
"""A stage of a route: node id, first layer, end layer."""


def accused(error: Exception, stages: Sequence[StageRef]) -> tuple[str, ...]:
    """The stages of the route a failure accuses, alive or not: the one that sent rows
    the next stage refused (its layers end where the refusing stage's begin), or the
    last stage, for TOKENS that cannot answer the step. The next route avoids them
    where the swarm has others."""
    if isinstance(error, RowsRefused):
        return tuple(node for node, _start, stop in stages if stop == error.from_layer)
    if isinstance(error, BadTokens) and stages:
        return (stages[-1][0],)
    return ()


def first_layer_to_adopt(
    old: Sequence[StageRef],
    new: Sequence[StageRef],
    dead: Collection[str],
    state_lost: bool,
) -> int | None:
    """The first layer from which the stages of the `new` route may keep the KV of the
    session that ran on `old` (the replay's `resume_from_layer`), or None: none may.

    A stage may keep it only when every stage after it does too (one that skips rows
    has no hidden states for them to send on), so this is the first layer of the
    longest run of stages ending the new route that served the same layers on the old
    one and are not `dead` (found dead since, or restarted). `state_lost`: a stage said
    it lacks the session's positions and the client cannot tell which one: only the last
    stage is named (it checks what it holds itself, and nothing after it depends on it).
    """
    kept = set(old)
    first: int | None = None
    for node, start, stop in reversed(new):
        if (node, start, stop) not in kept or node in dead:
            break
        first = start
        if state_lost:
            break
    return first


def convicted_span(
    served: Mapping[str, int], faulty: Collection[str]
) -> tuple[int, tuple[str, ...]] | None:
    """The answer's first token a faulty node may have touched, and those nodes: of the
    nodes that served it (node -> the first generated token it helped compute, 0 for
    the prompt's too), every one spot checks found faulty, whether it is on the route
    now or the answer left it before it was caught. None when none of them is."""
    if not faulty:  # the usual case, asked after every token: nothing to look through
        return None
    convicted = tuple(sorted(n for n in served if n in faulty))
    if not convicted:
        return None
    return min(served[n] for n in convicted), convicted


def exact_for(sampling: SamplingParams) -> bool:
    """Whether a replayed answer equals the uninterrupted one token for token: greedy
    decoding depends only on the tokens; a sampler's random stream restarts."""
    return sampling.temperature <= 0.0
