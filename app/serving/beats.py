"""When a serving worker heartbeats next: a pure policy, no IO, no clock.

A worker learns that the coordinator replaced its next stage only from a heartbeat's
answer (its assignment names the new next hop). Every 2 s is plenty while the chain
works, but when the next stage dies the replay of the answers it carried waits for that
news: the client has its new route as soon as the coordinator re-planned, and a replay
that reaches this stage first would be sent towards the dead one and fail ("next stage
replaced"), adding a retry to every takeover. So while sessions wait for a link to the
next stage (it was lost, or is being dialled), the worker asks again after `waiting_s`,
rate-limited to that: a quarter of a second on the coordinator per stage whose next hop
is gone, for as long as the link stays down (the relink timeout bounds it).

    next hop            since the last beat     beat
    ------------------  ----------------------  -------------------------
    linked, or idle     >= every_s              now (the usual period)
    sessions waiting    >= waiting_s            now
    either              less                    after the rest of it
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BeatPolicy:
    every_s: float = 2.0
    """The heartbeat period of a serving worker."""
    waiting_s: float = 0.25
    """The period while sessions wait for the next stage: the soonest the worker asks
    the coordinator again (each answer costs it a re-plan check)."""


def beat_delay(policy: BeatPolicy, since_last_s: float, hop_waiting: bool) -> float:
    """Seconds until the next heartbeat (0: now), `since_last_s` after the last one."""
    period = policy.waiting_s if hop_waiting else policy.every_s
    return max(0.0, period - since_last_s)
