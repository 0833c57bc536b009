"""What a peer may cost a node before it has proved who it is, and the QUIC windows a link
gets: one table of limits and the pure decisions made on it (no IO, no clock).

Anyone who reaches a node's UDP port can complete TLS (it proves the acceptor, not the
initiator) and so holds a link before the client proof (net.protocol). Until WELCOME
such a link is only allowed what the handshake needs:

    what                                 limit                               on breach
    -----------------------------------  ----------------------------------  ------------------
    one frame before WELCOME             `pre_auth_frame_bytes`: the largest  TOO_LARGE, closed
                                           PROOF (certificate + signature)
    time from first datagram to WELCOME  `auth_timeout_s`                     link closed
    unauthenticated links, one host      `max_pending_per_host`               Initial dropped
    unauthenticated links, all hosts     `max_pending`                        Initial dropped
    links of one host, all states        `max_links_per_host`                 Initial dropped
    stream / connection receive window   `STEP_WINDOW_BYTES`                  (flow control;
                                           QuicTuning.stream_window_bytes)

The windows bound what the QUIC library buffers for a link (data past a gap is kept up to
the window, authenticated or not) while leaving room for the largest hidden state a step
carries in flight (`STEP_WINDOW_BYTES`). A dropped Initial costs a header parse; the
dialler sees a timeout, as for a host that is down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from net.wire.layout import DEFAULT_LIMITS, HEADER, LENGTH, Limits

__all__ = [
    "DEFAULT_LINK_LIMITS",
    "STEP_WINDOW_BYTES",
    "LinkLimits",
    "admit_link",
    "pre_auth_frame_bytes",
    "pre_auth_limits",
]

STEP_WINDOW_BYTES = 16 << 20
"""A 512-row prompt chunk of an 8192-wide residual in f32 (a 70B-class model), the
largest hidden-state step a stage forwards at its default row budget, fits in flight
whole; wider models' steps still pass, the window re-opening as the peer reads."""


def pre_auth_frame_bytes(limits: Limits = DEFAULT_LIMITS) -> int:
    """The largest frame the handshake needs: a PROOF at `max_proof_bytes` (header, blob
    length, blob). HELLO, CHALLENGE, WELCOME and a refusal's ERROR are all smaller."""
    return HEADER.size + LENGTH.size + limits.max_proof_bytes


def pre_auth_limits(limits: Limits = DEFAULT_LIMITS) -> Limits:
    """`limits` with frames capped at what the handshake needs (net.protocol uses these
    until WELCOME, so an unauthenticated peer cannot make us buffer a large body)."""
    return replace(
        limits, max_frame_bytes=min(limits.max_frame_bytes, pre_auth_frame_bytes(limits))
    )


@dataclass(frozen=True)
class LinkLimits:
    """The limits a listening node applies to the links it accepts."""

    auth_timeout_s: float = 10.0
    """Seconds from a link's first datagram to its WELCOME (TLS and the proof, over a
    relay at worst); a link still unauthenticated then is closed."""
    max_pending_per_host: int = 8
    """Unauthenticated links from one source host (IP) at once."""
    max_pending: int = 128
    """Unauthenticated links from all hosts at once."""
    max_links_per_host: int = 128
    """Links from one source host at once, authenticated or not (one NAT may hide many
    honest nodes, so this is far above what one node opens)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.auth_timeout_s) and self.auth_timeout_s > 0):
            raise ValueError(f"auth_timeout_s must be a positive number, not {self.auth_timeout_s}")
        for name in ("max_pending_per_host", "max_pending", "max_links_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


DEFAULT_LINK_LIMITS = LinkLimits()


def admit_link(limits: LinkLimits, host_pending: int, host_links: int, pending: int) -> str | None:
    """Whether a new link from a host may be accepted, given the host's unauthenticated
    links, all its links and every host's unauthenticated links now: None to accept,
    else why not."""
    if host_pending >= limits.max_pending_per_host:
        return f"{host_pending} unauthenticated links from this host already"
    if host_links >= limits.max_links_per_host:
        return f"{host_links} links from this host already"
    if pending >= limits.max_pending:
        return f"{pending} unauthenticated links already"
    return None
