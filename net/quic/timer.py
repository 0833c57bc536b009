"""Whether a link's armed timer can stay, or must be re-armed for the library's deadline.

A QUIC link keeps one loop timer for the library's next deadline (loss detection, the
ACK delay, the idle timeout). Most transmits move that deadline a little later (the idle
timeout follows every packet), and cancelling and re-arming on each would cost a handle
and a heap entry a transmit; an early timer simply fires, finds nothing due and re-arms.
But when a frame is acknowledged the deadline jumps from the loss timer (tens of ms
away) to the idle timeout (seconds away): keeping the loss timer then costs a wake-up
for nothing once a frame on a chain's decode (measured: 0.88 timer fires a frame at one
frame every 30 ms), and on a machine that runs several stages that wake-up lands in
another stage's compute. So a timer is re-armed when it would fire well before anything
is due and soon; one that is seconds away may fire early (once an idle period).

Pure function; `net.quic.links.QuicLink._reschedule_timer` acts on it.
"""

from __future__ import annotations

EARLY_SLACK = 0.005
"""Seconds an armed timer may fire before the deadline and stay armed: above the few ms
the idle deadline moves between back-to-back frames, below a chain's token interval."""

FAR = 1.0
"""An armed timer at least this far away stays even if early: it fires at most once an
idle period, and re-arming it on every transmit would cost more."""


def keep_armed(now: float, armed_at: float, deadline: float | None, armed_for_hold: bool) -> bool:
    """Whether the timer armed for `armed_at` can stay for the library's `deadline`.

    Never when there is no deadline (nothing may fire) or the deadline is earlier (it
    would fire late); never when it was armed for a held ACK that has left and fires
    early (net.quic.ack_policy); else unless it would fire early and soon, for nothing."""
    if deadline is None or armed_at > deadline:
        return False
    early = deadline - armed_at
    if armed_for_hold and early > 1e-3:
        return False
    return early <= EARLY_SLACK or armed_at - now >= FAR
