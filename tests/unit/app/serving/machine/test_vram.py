"""The VRAM cap, checked after load against the engine's and the driver's figures."""

from __future__ import annotations

import pytest

from app.compute import StageCompute
from app.serving.machine.vram import OverCap, check_within_cap
from core.hardware import MemoryUse

GIB = 1024**3


def compute(used: int) -> StageCompute:
    return StageCompute("Vulkan0 (test), 4/4 layers", used, 4 * GIB, 4, 4)


def test_within_the_cap_passes_and_over_it_is_refused_with_both_figures() -> None:
    check_within_cap(compute(3 * GIB), 4 * GIB)
    check_within_cap(compute(4 * GIB), 4 * GIB)
    with pytest.raises(OverCap, match="engine reports"):
        check_within_cap(compute(4 * GIB + 1), 4 * GIB)
    with pytest.raises(OverCap, match=r"4\.50 GiB.*driver reports.*4\.00 GiB"):
        check_within_cap(compute(3 * GIB), 4 * GIB, MemoryUse("VRAM", int(4.5 * GIB)))


def test_no_cap_cpu_stages_and_ram_figures_pass() -> None:
    check_within_cap(compute(100 * GIB), 0)
    check_within_cap(None, GIB)
    check_within_cap(compute(0), GIB, MemoryUse("RAM", 50 * GIB))  # RAM is not device memory
