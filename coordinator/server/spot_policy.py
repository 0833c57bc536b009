"""Spot checks' decisions, pure: when a stage's steps are checked, which session and
prefix, who recomputes it, and what the answers say (one verdict table).

A check asks the checked stage for its record of a session's first steps (the rows it
took, digests of the rows it sent on), asks a node serving the same layers elsewhere
to recompute them, and on a mismatch asks a third such node. The rows of a step
depend on everything the session fed the stage before, so the unit checked is a prefix
from position 0; reproducible workers make an honest recomputation bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from coordinator.spot_checks import CheckRecord


@dataclass(frozen=True)
class SpotSettings:
    rate: float = 0.01
    """Share of a stage's steps that start a check (0: the swarm checks nothing)."""
    max_in_flight: int = 4
    """Checks running at once, in the whole swarm."""
    timeout_s: float = 120.0
    """A check with an answer still missing after this is dropped, undecided."""


def check_due(new_steps: int, rate: float, draw: float) -> bool:
    """Whether a stage that took `new_steps` steps since its last heartbeat is checked
    now: as if each step were sampled with probability `rate` (`draw` uniform in [0, 1))."""
    if rate <= 0 or new_steps <= 0:
        return False
    if rate >= 1:
        return True
    return draw < -math.expm1(new_steps * math.log1p(-rate))


def pick_prefix(offered: Sequence[tuple[str, int]], draw: float) -> tuple[str, int] | None:
    """The sampled step: each step of every offered session equally likely (`draw`
    uniform in [0, 1)); the check covers its session up to it: (session, steps)."""
    total = sum(max(0, n) for _, n in offered)
    if total <= 0:
        return None
    target = min(int(draw * total), total - 1)
    for session, n in offered:
        if target < n:
            return session, target + 1
        target -= max(0, n)
    return None  # pragma: no cover - the loop always finds the target


def pick_holder(holders: Sequence[str], exclude: frozenset[str], draw: float) -> str | None:
    """A node to recompute: one of `holders` (serving the same layers, checkable,
    healthy, not faulty) other than those in `exclude`; None when there is none."""
    left = sorted(h for h in holders if h not in exclude)
    if not left:
        return None
    return left[min(int(draw * len(left)), len(left) - 1)]


# ---------------------------------------------------------------- verdicts


class Verdict(Enum):
    PENDING = "pending"
    """An answer the verdict needs is still to come."""
    HONEST = "honest"
    """The checker recomputed what the stage claimed."""
    FAULTY = "faulty"
    """The checked stage: its own record contradicts itself, or two other holders
    recomputed the same rows and not its."""
    CHECKER_FAULTY = "checker faulty"
    """The checker: the third holder recomputed what the checked stage claimed."""
    DISPUTED = "disputed"
    """Its rows recompute as it claims, but its input is not what its upstream says it
    sent: one of the two lies (links are authenticated, frames are not signed), so
    neither is marked; the operator sees both."""
    WITHHELD = "withheld"
    """It gave no record of a session its neighbour saw pass through it: a stage that
    lied on that session would hide it so; an honest one may have forgotten it already
    (each keeps a bounded window), so it is shown, not marked."""
    UNDECIDED = "undecided"
    """No one can be blamed: no third holder, one refused, or all three differ."""
    UNVERIFIED = "unverified"
    """The check could not run (no record, no checker, a refusal, a timeout)."""


@dataclass(frozen=True)
class Answers:
    """What a check has heard so far; None: not yet (or never, once `expired`)."""

    record: CheckRecord | None = None
    record_refused: str = ""
    upstream_outputs: dict[int, str] | None = None
    """The upstream stage's claimed output digest per step id (None: not asked/heard)."""
    checker: tuple[str, ...] | None = None
    checker_refused: str = ""
    third: tuple[str, ...] | None = None
    third_refused: str = ""
    has_checker: bool = True
    has_third: bool = True
    expired: bool = False
    vouched: bool = False
    """The session was sampled from a neighbour's list: the stage should hold it."""


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    reason: str
    step_index: int = -1
    """The first step of the prefix where the evidence disagrees (-1: none)."""


def first_difference(a: Sequence[str], b: Sequence[str]) -> int:
    """The first index where two digest lists differ (a shorter one differs where it
    ends); -1 when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def judge(a: Answers) -> Finding:
    """The verdict table (`_judge_rows`), then the upstream's word: a check that blames
    no one but finds the input differing from what the upstream claims it sent is a
    dispute between the two."""
    found = _judge_rows(a)
    if found.verdict in (Verdict.PENDING, Verdict.FAULTY, Verdict.CHECKER_FAULTY):
        return found
    if a.record is not None and a.upstream_outputs is not None:
        for i, s in enumerate(a.record.steps):
            sent = a.upstream_outputs.get(s.step_id)
            if sent is not None and sent != s.input_digest:
                why = f"step {s.step_id}: its input is not what its upstream says it sent"
                return Finding(Verdict.DISPUTED, f"{why} ({found.verdict.value} otherwise)", i)
    return found


def _judge_rows(a: Answers) -> Finding:
    """Each row a situation, in the order they are tried."""
    if a.record is None:
        if a.record_refused and a.vouched:
            why = f"no record of a session its neighbour saw: {a.record_refused}"
            return Finding(Verdict.WITHHELD, why)
        if a.record_refused or a.expired:
            return Finding(Verdict.UNVERIFIED, f"no record: {a.record_refused or 'no answer'}")
        return Finding(Verdict.PENDING, "waiting for the record")
    record = a.record
    claimed = tuple(s.output_digest for s in record.steps)
    lie = record.lies_about_itself()
    if lie:
        return Finding(Verdict.FAULTY, f"its record contradicts itself: {lie}", 0)
    if not a.has_checker:
        return Finding(Verdict.UNVERIFIED, "no other node serves these layers to recompute")
    if a.checker is None:
        if a.checker_refused or a.expired:
            why = a.checker_refused or "no answer"
            return Finding(Verdict.UNVERIFIED, f"the checker did not recompute: {why}")
        return Finding(Verdict.PENDING, "waiting for the checker")
    if a.checker_refused:  # digests of a first part only: compare none
        return Finding(Verdict.UNVERIFIED, f"the checker stopped: {a.checker_refused}")
    at = first_difference(claimed, a.checker)
    if at < 0:
        return Finding(Verdict.HONEST, "the checker recomputed the same rows")
    if not a.has_third:
        return Finding(Verdict.UNDECIDED, "checker and stage differ; no third holder", at)
    if a.third is None or a.third_refused:
        if a.third_refused or a.expired:
            why = a.third_refused or "no answer"
            return Finding(Verdict.UNDECIDED, f"checker and stage differ; third: {why}", at)
        return Finding(Verdict.PENDING, "waiting for the third holder", at)
    if first_difference(a.third, a.checker) < 0:
        return Finding(Verdict.FAULTY, "two other holders recomputed other rows", at)
    if first_difference(a.third, claimed) < 0:
        return Finding(Verdict.CHECKER_FAULTY, "the third holder recomputed the stage's rows", at)
    return Finding(Verdict.UNDECIDED, "all three recomputed different rows", at)
