"""Whether the swarm can answer: the decisions around the coordinator's end-to-end probe
(pure: no IO, the clock passed in).

Heartbeats say each node is alive; they cannot say that a prompt sent to the first
stage comes back as tokens (a link between two stages may be down while both beat).
So the coordinator asks the planned chain itself now and then: a tiny authenticated
generation, a couple of tokens, under an identity of its own (answer_prober.py does the
IO). These functions decide when to probe, and what the operator is told.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "AnswerState",
    "Chain",
    "Failure",
    "ProbeFailure",
    "ProbePolicy",
    "describe",
    "next_state",
    "probe_due",
]

Chain = tuple[tuple[str, str], ...]
"""The planned chain as probed: (node id, address) of each stage, in token order."""


@dataclass(frozen=True)
class ProbePolicy:
    every_s: float = 45.0
    """A chain that did not change is probed this often: a link that broke while every
    node heartbeats shows within a minute."""
    timeout_s: float = 20.0
    """The probe's whole budget (dials, the prompt's trip, the ring's step); a chain that
    needs longer for two tokens cannot answer a person either."""
    dial_timeout_s: float = 5.0
    """One dial to a stage."""
    retry_s: float = 10.0
    """After a failed probe the next one comes sooner: the operator sees the chain
    answer again soon after it is repaired."""


class ProbeFailure(enum.Enum):
    NO_PLAN = "no_plan"
    DIAL = "dial"
    """A stage of the chain did not accept the coordinator's link."""
    REFUSED = "refused"
    """A stage answered the probe's session with an error."""
    LINK_CLOSED = "link_closed"
    """A link the probe held closed before the answer came."""
    NO_TOKEN = "no_token"
    """The prompt went in, no token came out in time."""
    NO_RING = "no_ring"
    """The first token came; the next step, which goes round from the last stage to the
    first by itself, did not."""


@dataclass(frozen=True)
class Failure:
    kind: ProbeFailure
    stage: str = ""
    """The node id the failure points at, where known."""
    detail: str = ""
    silent: tuple[str, ...] = ()
    """With NO_TOKEN: the stages in between that did not answer a dial afterwards."""


@dataclass(frozen=True)
class AnswerState:
    """What the operator is told."""

    can_answer: bool | None = None
    """None: not probed yet."""
    since: float = 0.0
    """Unix time since when it has been so (the first probe that found it)."""
    checked_at: float = 0.0
    """Unix time of the last probe."""
    reason: str = ""
    """Why it cannot answer (empty when it can)."""
    chain: tuple[str, ...] = ()
    """The node ids probed last."""
    answer_ms: float = 0.0
    """How long the last successful probe took (dials included)."""


def probe_due(
    policy: ProbePolicy,
    state: AnswerState,
    chain: Chain,
    probed_chain: Chain | None,
    last_probe_at: float | None,
    now: float,
) -> bool:
    """Whether to probe now (monotonic clock): at once after every re-plan (the chain
    or an address in it changed), else once `every_s` passed since the last probe
    (`retry_s` while it cannot answer). No chain: the state says so without probing."""
    if not chain:
        return False
    if last_probe_at is None or chain != probed_chain:
        return True
    wait = policy.retry_s if state.can_answer is False else policy.every_s
    return now - last_probe_at >= wait


def describe(failure: Failure, chain: Chain) -> str:
    """The operator's words for a failed probe: which stage or link, and what happened."""
    ids = [node for node, _ in chain]
    path = " -> ".join(ids)
    role = _role(failure.stage, ids)
    k = failure.kind
    detail = f": {failure.detail}" if failure.detail else ""
    if k is ProbeFailure.NO_PLAN:
        return f"no chain is planned{detail}"
    if k is ProbeFailure.DIAL:
        return f"{role} {failure.stage} does not accept links{detail}"
    if k is ProbeFailure.REFUSED:
        return f"{role} {failure.stage} refused the probe{detail}"
    if k is ProbeFailure.LINK_CLOSED:
        return f"the link to {role} {failure.stage} closed mid-answer{detail}"
    if k is ProbeFailure.NO_RING:
        first = ids[0] if ids else "?"
        return (
            f"the first token came, the next did not: the link from the last stage "
            f"{failure.stage} round to the first stage {first} does not carry steps{detail}"
        )
    if failure.silent:
        return (
            f"no token came back{detail}; {', '.join(failure.silent)} in between "
            f"does not accept links ({path})"
        )
    return (
        f"no token came back{detail}; every stage accepts links, so a link between "
        f"stages ({path}) does not carry the prompt"
    )


def _role(node: str, ids: list[str]) -> str:
    if ids and node == ids[0]:
        return "the first stage"
    if ids and node == ids[-1]:
        return "the last stage"
    return "stage"


def next_state(
    previous: AnswerState,
    chain: Chain,
    failure: Failure | None,
    now: float,
    answer_ms: float = 0.0,
) -> AnswerState:
    """The state after a probe of `chain` at `now` (Unix time): `failure` None when two
    tokens came back. "Since" moves only when the answer changes, so "cannot answer
    since T" names when it stopped answering, however many probes failed since."""
    ok = failure is None
    since = previous.since if previous.can_answer is ok else now
    return AnswerState(
        can_answer=ok,
        since=since,
        checked_at=now,
        reason="" if failure is None else describe(failure, chain),
        chain=tuple(node for node, _ in chain),
        answer_ms=answer_ms if ok else 0.0,
    )


def no_plan_state(previous: AnswerState, reason: str, now: float) -> AnswerState:
    """No chain to probe: it cannot answer, because there is none."""
    return next_state(previous, (), Failure(ProbeFailure.NO_PLAN, detail=reason), now)
