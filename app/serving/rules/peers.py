"""Who may start sessions on a stage, how many one node may hold, when a session that
stopped stepping is closed, and where a client's ring may point: the stage's limits on
its authenticated peers, as one table and pure decisions (no IO, no clock of its own).

    rule                           first stage                     later stages
    -----------------------------  ------------------------------  --------------------------
    who may OPEN a new session     any authenticated node          the planned upstream
                                                                     (`StagePlan.upstream`);
                                                                     unknown: nodes certified
                                                                     as workers, never clients
    sessions one node may hold     `per_node_sessions` (all but    the upstream: every slot
                                     a quarter of the slots)         (the whole chain's)
    a session with no STEP for     closed, KV freed, ERROR up      the same (`idle_sessions`)
      `session_idle_s`
    `Open.loop` (the ring)         must name this node, at one of  the last stage dials only
                                     its own addresses, else the     what came past the first
                                     OPEN is refused BAD_VALUE       stage's check, from its
                                     (`loop_refusal`)                upstream

A client's ring makes the last stage dial the address its OPEN names. The first stage is
the one node that knows where it is reached (its listen address, or the one it tells the
coordinator, which routes carry), and every OPEN reaches the last stage through it and
the planned chain, so checking there keeps volunteers' PCs from sending datagrams to
addresses a client picked.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from net import wire

__all__ = [
    "StagePlan",
    "idle_sessions",
    "loop_refusal",
    "opener_refusal",
    "per_node_sessions",
]

Addr = tuple[str, int]

STAGE_ROLE = "worker"
"""The certificate role of nodes that serve stages (app.credentials)."""


@dataclass(frozen=True)
class StagePlan:
    """What a stage knows of its place in the plan."""

    node_id: str
    is_first: bool
    upstream: frozenset[str] | None = None
    """Node ids of the stage(s) before this one; None: not known here (a coordinated
    stage: a spare may take the place upstream at any time)."""
    addresses: frozenset[Addr] = frozenset()
    """Where peers reach this stage: its listen address and any it advertises."""


def opener_refusal(plan: StagePlan, peer: str, role: str) -> str | None:
    """Why `peer` (certified as `role`) may not open a new session here; None: it may.
    Past the first stage sessions come down the chain, never straight from a client."""
    if plan.is_first:
        return None
    if plan.upstream is not None:
        if peer in plan.upstream:
            return None
        before = ", ".join(sorted(plan.upstream))
        return f"only the stage before this one ({before}) opens sessions here"
    if role != STAGE_ROLE:
        return f"a {role or 'peer'} may not open sessions past the first stage"
    return None


def per_node_sessions(slots: int, setting: int = 0) -> int:
    """Sessions one node may hold on a first stage of `slots` sessions: `setting` where
    set (at most `slots`), else all but a quarter of them, so one node holding sessions
    it never steps leaves room for everyone else."""
    if setting > 0:
        return min(setting, slots)
    return max(1, slots - max(1, slots // 4))


def idle_sessions(
    last_active: Mapping[str, float], busy: Collection[str], now: float, idle_s: float
) -> list[str]:
    """The sessions to close: no STEP taken or answered for `idle_s` seconds and none of
    their rows waiting for the engine (`busy`)."""
    return [name for name, at in last_active.items() if name not in busy and now - at >= idle_s]


def loop_refusal(plan: StagePlan, loop: wire.Loop) -> str | None:
    """First stage: why a client's `Open.loop` may not be used; None: it may. It must
    name this node, at an address this node is reached at."""
    if loop.first_node != plan.node_id:
        return f"the ring must name this first stage ({plan.node_id}), not {loop.first_node!r}"
    if not _reached_at(loop.address, plan.addresses):
        return (
            f"the ring's address {loop.first_address} is not one this stage is reached at; "
            "a stage behind a port forward or proxy names it in its `advertise` setting"
        )
    return None


def _reached_at(address: Addr, own: Iterable[Addr]) -> bool:
    host, port = _normal(address)
    for own_host, own_port in own:
        if own_port != port:
            continue
        own_host = _normal((own_host, own_port))[0]
        # Listening on every interface: the port is the stage's, the host any of this
        # machine's names (not knowable here). `advertise` narrows it to one.
        if own_host == host or own_host in ("0.0.0.0", "::"):
            return True
    return False


def _normal(address: Addr) -> Addr:
    host, port = address
    host = host.strip("[]").lower()
    with contextlib.suppress(ValueError):  # a name: compared as written
        host = str(ipaddress.ip_address(host))
    return host, port
