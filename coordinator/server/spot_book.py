"""The spot checks in flight: who is asked what, what each answered, and when a check is
decided (coordinator/server/spot_policy.py judges). One owner, no IO: the service feeds
it heartbeats and answers under its lock, with the clock and the random draws passed in.

Asks travel in heartbeat answers (a node behind a home router cannot be called); each
ask has its own id, and only the node asked may answer it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.errors import CoordinatorError, MalformedAnswer
from coordinator.server.spot_policy import (
    Answers,
    Finding,
    SpotSettings,
    Verdict,
    check_due,
    judge,
    pick_holder,
    pick_prefix,
)
from coordinator.spot_checks import (
    MAX_ASKS,
    MAX_CHECK_STEPS,
    RECOMPUTE,
    RECORD,
    CheckAsk,
    CheckDigests,
    CheckRecord,
)

MAX_WAITING_ASKS = 64
"""Asks waiting for their nodes' next heartbeat, in all."""

RECORD_ROLE, UPSTREAM_ROLE, CHECKER_ROLE, THIRD_ROLE = "record", "upstream", "checker", "third"


class CheckUnknown(CoordinatorError):
    """An answer to an ask that was not made of this node, or no longer waits."""


@dataclass
class Check:
    number: int
    node: str
    session: str
    steps: int
    upstream: str | None
    holders: tuple[str, ...]
    """Nodes serving the same layers that may recompute (the node itself left out)."""
    started: float
    answers: Answers = field(default_factory=Answers)
    checker: str | None = None
    third: str | None = None


@dataclass(frozen=True)
class Concluded:
    check: Check
    finding: Finding

    def evidence(self) -> dict[str, Any]:
        """What the operator sees of a decided check: the session, the first step where
        the evidence disagrees with its token positions, and each node's digest there."""
        c, f, a = self.check, self.finding, self.check.answers
        out: dict[str, Any] = {
            "check": c.number,
            "node": c.node,
            "session": c.session,
            "steps": c.steps,
            "verdict": f.verdict.value,
            "reason": f.reason,
            "checker": c.checker or "",
            "third": c.third or "",
            "upstream": c.upstream or "",
        }
        if a.record is not None and 0 <= f.step_index < len(a.record.steps):
            s = a.record.steps[f.step_index]
            out["step_id"] = s.step_id
            out["positions"] = [s.start, s.start + s.n_rows]
            out["claimed"] = s.output_digest
            out["input"] = s.input_digest
            for name, digests in (("checker_digest", a.checker), ("third_digest", a.third)):
                if digests is not None and f.step_index < len(digests):
                    out[name] = digests[f.step_index]
            if a.upstream_outputs is not None and s.step_id in a.upstream_outputs:
                out["upstream_sent"] = a.upstream_outputs[s.step_id]
        return out


class SpotBook:
    def __init__(self, settings: SpotSettings, draw: Callable[[], float] | None = None) -> None:
        self.settings = settings
        self._draw = draw or random.SystemRandom().random
        self._checks: dict[int, Check] = {}
        self._asks: dict[str, tuple[int, str, str]] = {}
        """Ask id -> (check number, role, node asked)."""
        self._waiting: dict[str, list[CheckAsk]] = {}
        """Node -> asks its next heartbeat answer carries."""
        self._next = 1

    @property
    def in_flight(self) -> int:
        return len(self._checks)

    def maybe_start(
        self,
        node: str,
        offered: Sequence[tuple[str, int]],
        new_steps: int,
        upstream: str | None,
        holders: Sequence[str],
        now: float,
        vouched: bool = False,
    ) -> Check | None:
        """A heartbeat of a checkable stage: start a check of it when one is due, of a
        session sampled from `offered` (a neighbour's list where `vouched`)."""
        s = self.settings
        if self.in_flight >= s.max_in_flight or any(c.node == node for c in self._checks.values()):
            return None
        if not check_due(new_steps, s.rate, self._draw()):
            return None
        picked = pick_prefix(offered, self._draw())
        if picked is None:
            return None
        return self.start(node, picked[0], picked[1], upstream, holders, now, vouched)

    def start(
        self,
        node: str,
        session: str,
        steps: int,
        upstream: str | None,
        holders: Sequence[str],
        now: float,
        vouched: bool = False,
    ) -> Check:
        """A check of `node`'s first `steps` steps of `session` (at most MAX_CHECK_STEPS:
        what a node's heartbeat answer takes)."""
        steps = max(1, min(steps, MAX_CHECK_STEPS))
        check = Check(
            self._next,
            node,
            session,
            steps,
            upstream,
            tuple(h for h in holders if h != node),
            now,
            Answers(vouched=vouched),
        )
        self._next += 1
        self._checks[check.number] = check
        self._ask(check, RECORD_ROLE, node, RECORD)
        if upstream is not None:
            self._ask(check, UPSTREAM_ROLE, upstream, RECORD)
        return check

    def asks_for(self, node: str) -> tuple[CheckAsk, ...]:
        """The asks for `node`'s heartbeat answer (each given once)."""
        waiting = self._waiting.pop(node, [])
        return tuple(waiting[:MAX_ASKS])

    def inputs(self, node: str, ask_id: str) -> CheckRecord:
        """The record `node` was asked to recompute; CheckUnknown otherwise."""
        check, role = self._lookup(node, ask_id)
        if role not in (CHECKER_ROLE, THIRD_ROLE) or check.answers.record is None:
            raise CheckUnknown("this ask has no record to recompute")
        record = check.answers.record
        return CheckRecord(record.session, record.steps[: check.steps])

    def answer(self, node: str, ask_id: str, doc: Any) -> Concluded | None:
        """`node`'s answer to one of its asks; the check's conclusion once it has one.
        MalformedAnswer for an answer that does not parse, CheckUnknown for an ask that
        was not made of `node` or was answered already."""
        check, role = self._lookup(node, ask_id)
        if not isinstance(doc, dict):
            raise MalformedAnswer("an answer to a check is a JSON object")
        a = check.answers
        refused = doc.get("refused", "")
        refused = refused[:300] if isinstance(refused, str) and refused else ""
        if role == RECORD_ROLE:
            if refused or doc.get("record") is None:
                a = replace(a, record_refused=refused or "no record")
            else:
                record = CheckRecord.from_json(doc["record"])
                if record.session != check.session or len(record.steps) != check.steps:
                    raise MalformedAnswer("the record is not of the session and steps asked")
                a = replace(a, record=record)
        elif role == UPSTREAM_ROLE:
            if not refused and doc.get("record") is not None:
                sent = CheckRecord.from_json(doc["record"])
                a = replace(a, upstream_outputs={s.step_id: s.output_digest for s in sent.steps})
        else:
            digests = CheckDigests.from_json(doc)
            why = digests.refused or ("" if digests.digests else "no digests")
            if role == CHECKER_ROLE:
                a = replace(a, checker=digests.digests, checker_refused=why)
            else:
                a = replace(a, third=digests.digests, third_refused=why)
        del self._asks[ask_id]  # answered: a malformed answer (raised above) may be sent again
        check.answers = a
        return self._advance(check)

    def expire(self, now: float) -> list[Concluded]:
        """Checks past their time, decided on what they heard."""
        done = []
        for check in list(self._checks.values()):
            if now - check.started > self.settings.timeout_s:
                check.answers = replace(check.answers, expired=True)
                concluded = self._advance(check)
                if concluded is not None:
                    done.append(concluded)
        return done

    def forget_node(self, node: str) -> None:
        """A node out of the swarm gets no more asks."""
        self._waiting.pop(node, None)

    # ------------------------------------------------------------ inside

    def _advance(self, check: Check) -> Concluded | None:
        a = check.answers
        upstream_waits = any(
            r == UPSTREAM_ROLE and n == check.number for n, r, _ in self._asks.values()
        )
        if upstream_waits and not a.expired:
            return None  # the input's evidence comes first
        finding = judge(a)
        if finding.verdict is Verdict.PENDING:
            if a.record is not None and check.checker is None and a.has_checker:
                self._next_holder(check, CHECKER_ROLE)
            elif a.checker is not None and check.third is None and a.has_third:
                self._next_holder(check, THIRD_ROLE)
            else:
                return None
            return self._advance(check)
        self._close(check)
        return Concluded(check, finding)

    def _next_holder(self, check: Check, role: str) -> None:
        taken = frozenset({check.node, *(n for n in (check.checker, check.third) if n)})
        holder = pick_holder(check.holders, taken, self._draw())
        if holder is None:
            if role == CHECKER_ROLE:
                check.answers = replace(check.answers, has_checker=False)
            else:
                check.answers = replace(check.answers, has_third=False)
            return
        if role == CHECKER_ROLE:
            check.checker = holder
        else:
            check.third = holder
        self._ask(check, role, holder, RECOMPUTE)

    def _ask(self, check: Check, role: str, node: str, kind: str) -> None:
        ask_id = f"{check.number}-{role}"
        if sum(len(w) for w in self._waiting.values()) >= MAX_WAITING_ASKS:
            return  # the check times out undecided
        self._asks[ask_id] = (check.number, role, node)
        self._waiting.setdefault(node, []).append(
            CheckAsk(ask_id, kind, check.session, check.steps)
        )

    def _lookup(self, node: str, ask_id: str) -> tuple[Check, str]:
        found = self._asks.get(ask_id)
        if found is None or found[2] != node or found[0] not in self._checks:
            raise CheckUnknown(f"no check {ask_id!r} waits for {node}")
        return self._checks[found[0]], found[1]

    def _close(self, check: Check) -> None:
        self._checks.pop(check.number, None)
        for ask_id in [k for k, v in self._asks.items() if v[0] == check.number]:
            del self._asks[ask_id]
        for node, waiting in list(self._waiting.items()):
            left = [w for w in waiting if not w.check_id.startswith(f"{check.number}-")]
            if left:
                self._waiting[node] = left
            else:
                del self._waiting[node]
