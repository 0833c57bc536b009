"""When a link's ACK of a one-packet frame leaves: now, or with the next frame.

On a one-way chain of stages a link's receiving end sends nothing but ACKs, and each ACK
costs both ends: a datagram built and sent here, a wake-up, a receive and a pass through
the packet core at the sender (docs/decisions/ack-hold.md). QUIC lets a receiver
acknowledge every second ack-eliciting packet and delay an ACK by up to the
`max_ack_delay` it advertised (RFC 9000 §13.2.1-2; qh3 advertises 25 ms). So when frames
come close together, the ACK of one is held until the next arrives and both are
acknowledged in one datagram; when they come apart (one token every few tens of ms, a
chain's decode), it leaves at once as before, since holding it would only add a timer.

Pure functions; `net.quic.links.QuicLink` keeps the times and acts on the answers.
"""

from __future__ import annotations

ACK_HOLD = 0.010
"""Seconds an ACK may wait for the next frame: under the 25 ms `max_ack_delay` the peer
adds to its loss timer (so the probe timeout never fires for a held ACK, with 15 ms to
spare for a busy machine's scheduling), and above the frame interval of back-to-back
traffic on a loaded machine (a 4-link ring at 2 ms a hop, many sessions, a prompt's
chunks), which is then acknowledged two frames at a time. A decode at tens of ms a token
is slower than this and keeps an ACK a frame."""


def hold_ack_until(now: float, gap: float | None, held: bool, hold: float = ACK_HOLD) -> float:
    """When the ACK pending at `now` should leave; `now` means at once.

    `gap`: seconds between the last two data bursts this link received (None: fewer than
    two so far); `held`: an ACK was already held since the last one left (so this one
    covers a second frame and goes now, as RFC 9000's every-second-packet rule asks).
    Held only when the next frame is due well inside the hold (`gap` at most half of
    it): a held ACK whose next frame comes late leaves by timer, a wake-up that an ACK
    sent at once would not have cost (measured: at load 9.5 with frames ~10 ms apart,
    half the held ACKs did)."""
    if held or hold <= 0 or gap is None or gap > hold / 2:
        return now
    return now + hold
