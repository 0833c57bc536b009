"""The offload decision: which device, how many blocks, KV on the device, the cap honoured."""

from __future__ import annotations

import pytest

from core.offload import StageSizes, compute_reserve_bytes, plan_offload
from core.types import BackendReport, ComputeDevice

pytestmark = pytest.mark.unit

MIB = 1024**2
GIB = 1024**3

CPU = ComputeDevice("CPU", "AMD EPYC", "cpu", 64 * GIB, 60 * GIB)


def gpu(name: str = "Vulkan0", free: int = 8 * GIB, kind: str = "gpu") -> ComputeDevice:
    return ComputeDevice(name, f"{name} card", kind, free + GIB, free)


# Six blocks of 500 MiB, 1 MiB of KV per cached position each.
SIZES = StageSizes(
    block_bytes=(500 * MIB,) * 6, kv_bytes_per_token=(MIB,) * 6, head_bytes=300 * MIB, n_embd=4096
)
RESERVE = compute_reserve_bytes(SIZES, n_batch=256)


def test_no_gpu_keeps_everything_on_the_cpu() -> None:
    plan = plan_offload([CPU], SIZES, n_ctx=1024, n_batch=256)
    assert (plan.device, plan.n_gpu_layers, plan.device_bytes) == (None, 0, 0)
    assert "no GPU" in plan.reason


def test_gpu_turned_off_wins_over_a_present_gpu() -> None:
    plan = plan_offload([CPU, gpu()], SIZES, n_ctx=1024, n_batch=256, use_gpu=False)
    assert not plan.on_gpu and "turned off" in plan.reason


def test_everything_fits_takes_the_head_too() -> None:
    plan = plan_offload([CPU, gpu(free=16 * GIB)], SIZES, n_ctx=1024, n_batch=256)
    assert plan.device == "Vulkan0"
    assert plan.n_gpu_layers == 7  # six blocks + llama.cpp's "output layer"
    assert plan.layers_on_device == 6
    assert plan.weight_bytes == 6 * 500 * MIB + 300 * MIB
    assert plan.kv_bytes == 6 * 1024 * MIB


def test_non_last_stage_without_head_counts_blocks_only() -> None:
    sizes = StageSizes(SIZES.block_bytes, SIZES.kv_bytes_per_token, head_bytes=0, n_embd=4096)
    plan = plan_offload([gpu(free=16 * GIB)], sizes, n_ctx=1024, n_batch=256)
    assert plan.n_gpu_layers == 6


def test_the_cap_limits_blocks_and_they_are_taken_from_the_end() -> None:
    # Each block costs 500 MiB weights + 512 MiB KV at n_ctx=512; the cap leaves room for 3.
    cap = RESERVE + 3 * 1012 * MIB + 10 * MIB
    plan = plan_offload([gpu(free=24 * GIB)], SIZES, n_ctx=512, n_batch=256, cap_bytes=cap)
    assert plan.n_gpu_layers == 3
    assert plan.device_bytes <= cap
    assert plan.cap_bytes == cap
    assert "3 of 6" in plan.reason


def test_free_memory_limits_when_below_the_cap() -> None:
    free = RESERVE + 2 * 1012 * MIB + 1
    plan = plan_offload([gpu(free=free)], SIZES, n_ctx=512, n_batch=256, cap_bytes=64 * GIB)
    assert plan.n_gpu_layers == 2
    assert plan.device_bytes <= free


def test_more_sessions_context_means_fewer_blocks() -> None:
    small = plan_offload([gpu(free=8 * GIB)], SIZES, n_ctx=256, n_batch=256)
    large = plan_offload([gpu(free=8 * GIB)], SIZES, n_ctx=4096, n_batch=256)
    assert large.n_gpu_layers < small.n_gpu_layers


def test_a_cap_below_the_reserve_means_cpu() -> None:
    plan = plan_offload([gpu()], SIZES, n_ctx=512, n_batch=256, cap_bytes=RESERVE // 2)
    assert not plan.on_gpu and "reserve" in plan.reason


def test_not_one_block_fits() -> None:
    huge = StageSizes((30 * GIB,), (0,), n_embd=4096)
    plan = plan_offload([gpu(free=8 * GIB)], huge, n_ctx=512, n_batch=256)
    assert not plan.on_gpu and "not one block" in plan.reason


def test_discrete_gpu_preferred_over_integrated_then_most_free() -> None:
    devices = [
        CPU,
        gpu("Vulkan0", 30 * GIB, "igpu"),
        gpu("Vulkan1", 6 * GIB),
        gpu("CUDA0", 12 * GIB),
    ]
    plan = plan_offload(devices, SIZES, n_ctx=256, n_batch=256)
    assert plan.device == "CUDA0"


def test_recurrent_blocks_cost_no_kv() -> None:
    sizes = StageSizes((500 * MIB,) * 4, (0, 0, 0, MIB), n_embd=4096)
    plan = plan_offload([gpu(free=16 * GIB)], sizes, n_ctx=2048, n_batch=256)
    assert plan.kv_bytes == 2048 * MIB


def test_report_describes_the_backend_in_use() -> None:
    report = BackendReport("zen4", ("AVX2",), (CPU, gpu("CUDA0")), ("AMX",), True)
    assert report.describe() == "CPU (zen4)"
    plan = plan_offload(report.devices, SIZES, n_ctx=256, n_batch=256)
    assert report.describe(plan) == "CUDA0 (CUDA0 card), 6/6 layers"
    assert [d.name for d in report.gpus] == ["CUDA0"]
