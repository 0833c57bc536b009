"""When a serving worker heartbeats next: a pure policy, no IO, no clock.

A worker learns that the coordinator replaced its next stage only from a heartbeat's
answer (its assignment names the new next hop). Every 2 s is plenty while the chain
works, but when the next stage dies the replay of the answers it carried waits for that
news: the client has its new route as soon as the coordinator re-planned, and a replay
that reaches this stage first would be sent towards the dead one and fail ("next stage
replaced"), adding a retry to every takeover. So while sessions wait for a link to the
next stage (it was lost, or is being dialled), and for `lost_window_s` after the link
died even when no session is left (the client gave the answer up to replay it; the
re-plan comes a second or two later), the worker asks again after `waiting_s`, rate-
limited to that: four beats a second on the coordinator per stage whose next hop is
gone, bounded by the relink timeout and the window.

    next hop                              since the last beat   beat
    ------------------------------------  --------------------  ----------------------
    linked, or lost > lost_window_s ago   >= every_s            now (the usual period)
    sessions wait for it, or lost within  >= waiting_s          now
      lost_window_s
    any                                   less                  after the rest of it
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
    lost_window_s: float = 10.0
    """How long after its link died the next stage counts as maybe replaced."""


def beat_delay(
    policy: BeatPolicy, since_last_s: float, hop_waiting: bool, lost_for_s: float | None = None
) -> float:
    """Seconds until the next heartbeat (0: now), `since_last_s` after the last one;
    `lost_for_s`: how long ago the link to the next stage died (None: it is up)."""
    lost = lost_for_s is not None and lost_for_s < policy.lost_window_s
    period = policy.waiting_s if hop_waiting or lost else policy.every_s
    return max(0.0, period - since_last_s)
