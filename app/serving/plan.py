"""What a coordinated worker does next: one pure function from what it holds and what the
coordinator last answered to one action (exo's worker/plan.py manner).

The serve loop (app.serving.coordinated) only carries actions out: it heartbeats, asks
`plan`, does what it says (download, load, serve, stand by, move, stop) and asks again
with what changed. No clock, network, disk or engine here, so every transition replays
in a unit test (tests/unit/app/serving/test_plan.py).

    no stage ──assignment──▶ Download ──pieces on disk──▶ Load ──▶ Serve (each beat)
       │  ▲                                                          │  │
       │  └──────── Release(MOVING): another stage, or none ◀────────┘  │ only the next
       └─standby offer─▶ Standby (pieces, a pre-load), then Wait         ▼ hop moved
    stop: Release(PAUSING) while a stage runs, then Stop          Retarget
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.config import Hop, parse_address
from app.errors import ConfigError
from app.node_status import ServeState
from coordinator.contract import Assignment, HeartbeatAnswer

HEARTBEAT_S = 2.0
STANDBY_BEAT_S = 0.5
"""A spare standing by asks this often: its promotion reaches it on its next heartbeat,
and a takeover should not wait most of a heartbeat period for it (spares are few)."""


@dataclass(frozen=True)
class BeatTimes:
    """How long a node without a stage waits between heartbeats."""

    waiting_s: float = HEARTBEAT_S
    standby_s: float = STANDBY_BEAT_S


@dataclass(frozen=True)
class NodeState:
    """What the worker holds when it decides."""

    stopping: bool = False
    """The volunteer (or the good-guest policy) asked it to stop."""
    serving: Assignment | None = None
    """The assignment its running stage serves; None while no stage runs."""
    pieces: Assignment | None = None
    """An assignment whose pieces are on disk, verified, its stage not started yet."""
    preloaded: bool = False
    """A stage built ahead (a spare's pre-load) fits `pieces`: start on it, no load."""
    standby: Assignment | None = None
    """The stage this spare is getting ready for (pieces, a pre-load), with no stage."""
    retarget_refused: bool = False
    """The running stage could not forward to the new next hop (`Retarget` failed)."""


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Wait:
    """No stage to serve: heartbeat again after `seconds`."""

    seconds: float


@dataclass(frozen=True)
class Standby:
    """Get this stage ready beside the heartbeats (its pieces, a pre-load), so taking it
    over costs a load at most; the previous standby stage's pre-load is freed first."""

    stage: Assignment


@dataclass(frozen=True)
class Download:
    """Assigned a stage: fetch its pieces. `promote`: it is the standby stage, whose
    pre-load (finished or under way) is kept; any other pre-load is freed."""

    stage: Assignment
    promote: bool


@dataclass(frozen=True)
class Load:
    """Start the stage on its downloaded pieces (`preloaded`: on the stage built ahead)."""

    stage: Assignment
    preloaded: bool


@dataclass(frozen=True)
class Serve:
    """Keep serving: heartbeat at the serving pace (app.serving.rules.beats)."""


@dataclass(frozen=True)
class Retarget:
    """Same stage, a new next hop (a spare took the next stage's place): forward to it,
    keeping the loaded stage and the sessions' KV."""

    stage: Assignment
    hop: Hop


@dataclass(frozen=True)
class Release:
    """Take no new sessions, let the running ones finish, free the stage. `leaving`:
    PAUSING (stopping) or MOVING (another stage, or none, comes next)."""

    leaving: ServeState


@dataclass(frozen=True)
class Stop:
    """Stopping with no stage running: free what a spare got ready, and return."""


Action = Wait | Standby | Download | Load | Serve | Retarget | Release | Stop


# ---------------------------------------------------------------- the decision


def plan(
    state: NodeState, answer: HeartbeatAnswer | None, times: BeatTimes = BeatTimes()
) -> Action:
    """The next action. `answer`: the heartbeat answer not yet acted on; None when there
    is none (no beat since the last action, or it failed: the coordinator is
    unreachable, and the worker carries on as it is)."""
    if state.stopping:
        return Release(ServeState.PAUSING) if state.serving is not None else Stop()
    if state.serving is not None:
        return _while_serving(state, answer)
    if state.pieces is not None:
        return Load(state.pieces, state.preloaded)
    if answer is not None and answer.assignment is not None:
        assigned = answer.assignment
        promote = state.standby is not None and state.standby.layers == assigned.layers
        return Download(assigned, promote)
    if answer is not None and answer.standby is not None and answer.standby != state.standby:
        return Standby(answer.standby)
    return Wait(times.waiting_s if state.standby is None else times.standby_s)


def _while_serving(state: NodeState, answer: HeartbeatAnswer | None) -> Action:
    serving = state.serving
    assert serving is not None
    if answer is None or answer.assignment == serving:
        return Serve()
    moved = only_next_hop_moved(serving, answer.assignment)
    if moved is not None and not state.retarget_refused:
        assert answer.assignment is not None
        return Retarget(answer.assignment, moved)
    return Release(ServeState.MOVING)


def only_next_hop_moved(old: Assignment, new: Assignment | None) -> Hop | None:
    """The new next hop when an assignment changed in nothing else, else None."""
    if new is None or old.next_hop is None or new.next_hop is None:
        return None
    if replace(new, next_hop=old.next_hop) != old:
        return None
    try:
        return Hop(new.next_hop.node_id, parse_address(new.next_hop.address))
    except ConfigError:
        return None  # an address that cannot be dialled: rebuild and report it there
