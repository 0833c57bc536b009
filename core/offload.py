"""How many of a stage's layers go on the GPU: a pure function of the devices and the sizes.

llama.cpp offloads the *last* `n_gpu_layers` blocks of a model (and its output layer when
`n_gpu_layers` exceeds the block count); each offloaded block keeps its KV cache on the
device too (`offload_kqv`). So the plan walks the stage's blocks from the end and takes
each one whose weights plus KV for every admitted session still fit under the budget:
the smaller of the volunteer's cap and the device's free memory, less a reserve for
compute buffers. One device only: a stage is a few layers, and splitting them over two
GPUs of one PC would add a copy per layer for little gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.types import ComputeDevice, OffloadPlan

__all__ = ["StageSizes", "compute_reserve_bytes", "plan_offload"]

_MIB = 1024**2


@dataclass(frozen=True)
class StageSizes:
    """What a stage's blocks cost on a device, read from its GGUF."""

    block_bytes: tuple[int, ...]
    """Weights of each block, in the stage's order."""
    kv_bytes_per_token: tuple[int, ...]
    """K and V of one cached position, per block (0 for recurrent blocks)."""
    head_bytes: int = 0
    """Output norm and projection: non-zero on the last stage only."""
    n_embd: int = 0

    @property
    def n_layer(self) -> int:
        return len(self.block_bytes)


def compute_reserve_bytes(sizes: StageSizes, n_batch: int) -> int:
    """Compute buffers and driver overhead to keep free beside weights and KV.

    A fixed floor for the driver's own allocations plus the activations of one full
    batch through a block (a generous multiple of n_batch x n_embd floats).
    """
    return 256 * _MIB + 32 * n_batch * max(sizes.n_embd, 1) * 4


def plan_offload(
    devices: Sequence[ComputeDevice],
    sizes: StageSizes,
    n_ctx: int,
    n_batch: int,
    cap_bytes: int = 0,
    use_gpu: bool = True,
) -> OffloadPlan:
    """Choose the device and the number of offloaded blocks for one stage.

    `cap_bytes` is the volunteer's limit on device memory; 0 means all free memory.
    `n_ctx` is the KV cache size in positions (shared by all sessions of the stage).
    """
    n_layer = sizes.n_layer
    reserve = compute_reserve_bytes(sizes, n_batch)

    def cpu_only(reason: str) -> OffloadPlan:
        return OffloadPlan(None, 0, n_layer, 0, 0, 0, cap_bytes, reason)

    if not use_gpu:
        return cpu_only("GPU use is turned off")
    gpus = [d for d in devices if d.is_gpu]
    if not gpus:
        return cpu_only("no GPU backend device found")
    # A discrete GPU beats an integrated one that shares system memory; then most free.
    best = max(gpus, key=lambda d: (d.kind == "gpu", d.free_bytes))
    budget = best.free_bytes if cap_bytes <= 0 else min(cap_bytes, best.free_bytes)
    room = budget - reserve
    if room <= 0:
        return cpu_only(
            f"{best.name} has {budget // _MIB} MiB to offer, below the {reserve // _MIB} MiB"
            " reserve for compute buffers"
        )

    weights = kv = taken = 0
    for block, per_token in zip(
        reversed(sizes.block_bytes), reversed(sizes.kv_bytes_per_token), strict=True
    ):
        cost = block + per_token * n_ctx
        if weights + kv + cost > room:
            break
        weights += block
        kv += per_token * n_ctx
        taken += 1
    if taken == 0:
        return cpu_only(f"not one block fits in {room // _MIB} MiB of {best.name}")
    n_gpu_layers = taken
    if taken == n_layer and sizes.head_bytes and weights + kv + sizes.head_bytes <= room:
        weights += sizes.head_bytes
        n_gpu_layers = n_layer + 1  # llama.cpp's way of saying "the output layer too"
    reason = (
        "every block fits"
        if taken == n_layer
        else f"{taken} of {n_layer} blocks fit in {room // _MIB} MiB"
    )
    return OffloadPlan(best.name, n_gpu_layers, n_layer, weights, kv, reserve, cap_bytes, reason)
