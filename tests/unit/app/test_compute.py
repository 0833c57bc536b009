"""What runs a stage, as the heartbeat, the status window and the tray word it: built from
fake backend reports and offload plans (no engine)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.compute import StageCompute, stage_compute
from core.types import BackendReport, ComputeDevice, LayerRange, OffloadPlan

pytestmark = pytest.mark.unit

GIB = 1024**3
CPU = ComputeDevice("CPU", "AMD EPYC 7B13", "cpu", 64 * GIB, 60 * GIB)
GPU = ComputeDevice("Vulkan0", "NVIDIA GeForce RTX 4090", "gpu", 24 * GIB, 22 * GIB)
REPORT = BackendReport("zen4", ("AVX2", "AVX512"), (CPU, GPU), ("AMX",), dynamic=True)


def _plan(n_gpu_layers: int, cap: int, device: str | None = "Vulkan0") -> OffloadPlan:
    return OffloadPlan(device, n_gpu_layers, 12, 3 * GIB, GIB, GIB // 2, cap, reason="test plan")


def test_all_on_the_cpu_says_the_variant_and_no_device_memory() -> None:
    cpu_only = OffloadPlan(None, 0, 12, 0, 0, 0, 0, "no GPU backend device found")
    c = StageCompute.from_reports(REPORT, cpu_only, 12)
    assert c == StageCompute("CPU (zen4)", 0, 0, 0, 12)
    assert c.memory_text == "0.0 GiB device memory"
    assert c.layers_text == "0/12 layers on GPU"
    assert StageCompute.from_reports(REPORT, None, 6).layers_text == "0/6 layers on GPU"


def test_offloaded_layers_report_the_plan_against_the_cap() -> None:
    c = StageCompute.from_reports(REPORT, _plan(8, 8 * GIB), 12)
    assert c.backend == "Vulkan0 (NVIDIA GeForce RTX 4090), 8/12 layers"
    assert c.device_bytes_used == 3 * GIB + GIB + GIB // 2
    assert c.memory_text == "4.5 / 8.0 GiB device memory"
    assert c.layers_text == "8/12 layers on GPU"
    assert c.heartbeat_fields() == {
        "backend": c.backend,
        "device_bytes_used": c.device_bytes_used,
        "device_cap_bytes": 8 * GIB,
        "gpu_layers": 8,
        "n_layers": 12,
    }


def test_no_cap_means_the_whole_device_and_the_output_layer_is_not_a_block() -> None:
    # n_gpu_layers = n_layer + 1 is llama.cpp's "every block and the output layer".
    c = StageCompute.from_reports(REPORT, _plan(13, 0), 12)
    assert c.device_cap_bytes == 24 * GIB
    assert c.layers_text == "12/12 layers on GPU"


@dataclass
class _Engine:
    n_embd: int = 8


@dataclass
class _ReportingEngine(_Engine):
    backend: BackendReport = REPORT
    offload: OffloadPlan | None = None


@dataclass
class _Stage:
    engine: _Engine
    spec: object


@dataclass
class _Spec:
    layers: LayerRange


def test_stage_compute_reads_the_engine_and_tolerates_one_that_does_not_say() -> None:
    spec = _Spec(LayerRange(6, 12))
    assert stage_compute(_Stage(_Engine(), spec)) is None  # type: ignore[arg-type]
    quiet = stage_compute(_Stage(_ReportingEngine(), spec))  # type: ignore[arg-type]
    assert quiet == StageCompute("CPU (zen4)", 0, 0, 0, 6)
    plan = OffloadPlan("Vulkan0", 6, 6, GIB, 0, 0, 2 * GIB, "every block fits")
    loud = stage_compute(_Stage(_ReportingEngine(offload=plan), spec))  # type: ignore[arg-type]
    assert loud is not None and loud.layers_text == "6/6 layers on GPU"
    assert loud.memory_text == "1.0 / 2.0 GiB device memory"
