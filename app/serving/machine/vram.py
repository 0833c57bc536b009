"""The volunteer's VRAM cap, checked after a stage has loaded.

`core.offload.plan_offload` plans the stage within the cap; this is the second look,
at what was really allocated: the engine's own report of device memory (weights, KV
and compute reserve on the device) and, where NVML sees this process on an NVIDIA GPU,
the driver's figure for the whole process. A stage over the cap is not served: the
volunteer said how much of their GPU Sangama may take.
"""

from __future__ import annotations

from app.compute import StageCompute
from app.errors import AppError
from core.hardware import MemoryUse

__all__ = ["OverCap", "check_within_cap"]

_GIB = 1024**3


class OverCap(AppError):
    """The loaded stage holds more device memory than the volunteer allowed."""


def check_within_cap(
    compute: StageCompute | None, cap_bytes: int, measured: MemoryUse | None = None
) -> None:
    """Raise OverCap when the stage's device memory exceeds `cap_bytes` (0: no cap).

    A stage on the CPU (no device bytes) or an engine that reports nothing passes; the
    NVML figure counts only when it is VRAM (on the CPU it is the process's RAM)."""
    if cap_bytes <= 0:
        return
    reported = compute.device_bytes_used if compute is not None else 0
    seen = measured.bytes if measured is not None and measured.kind == "VRAM" else 0
    used = max(reported, seen)
    if used > cap_bytes:
        source = "the driver reports" if seen > reported else "the engine reports"
        raise OverCap(
            f"the stage takes {used / _GIB:.2f} GiB of GPU memory ({source}), "
            f"over the cap of {cap_bytes / _GIB:.2f} GiB, so it is not served"
        )
