"""What one QUIC link did, counted: datagrams, transmits, timers.

A hop's software cost scales with these counts far more than with bytes
(docs/decisions/ack-hold.md): every datagram is a syscall and a pass through the packet core on both
ends, every receive burst a wake-up, every timer armed a handle in the loop's heap. They
are plain integers kept by `net.quic.links.QuicLink` as it works, so benchmarks read them
without a profiler and tests assert them (counts, never wall-clock times).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class LinkCounts:
    """Counters of one link since it was made (mutable: the link increments them)."""

    datagrams_sent: int = 0
    control_datagrams_sent: int = 0
    """Datagrams that left in a transmit with no new stream data queued since the last one:
    ACKs, PINGs, probes (a retransmission there would count too; loss is rare)."""
    datagrams_received: int = 0
    bursts_received: int = 0
    """Times received datagrams were handed to the QUIC library (one per wake-up on paths
    that read bursts, one per datagram elsewhere)."""
    transmits: int = 0
    """Passes that asked the library for datagrams to send (some find none)."""
    timers_armed: int = 0
    """Loop timers created for the library's deadline (each a TimerHandle)."""
    timer_fires: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def per_frame(before: dict[str, int], after: dict[str, int], frames: int) -> dict[str, float]:
    """Each counter's increase from `before` to `after`, divided by `frames`."""
    if frames <= 0:
        raise ValueError(f"frames must be positive, not {frames}")
    return {k: (after[k] - before.get(k, 0)) / frames for k in after}


def add(*counts: dict[str, int]) -> dict[str, int]:
    """The sum of several links' snapshots, counter by counter."""
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total
