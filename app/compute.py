"""What runs where for one serving stage: the backend, device memory against its cap, and
layers on the GPU. One value feeds the heartbeat, the status window and the tray, so the
operator page and the volunteer's window say the same thing in the same words.

The facts come from the stage's engine (`LlamaStageEngine.backend` and `.offload`, set
when the model loads). They are read with `getattr`, not through `core.stage.Engine`, so
engines that do not report them (test fakes, an older engine) serve without these lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.types import BackendReport, OffloadPlan

if TYPE_CHECKING:  # the status window imports this module; it needs no numpy or engine
    from core.stage import Stage

__all__ = ["StageCompute", "stage_compute"]

_GIB = 1024**3


@dataclass(frozen=True)
class StageCompute:
    backend: str
    """BackendReport.describe(plan): "CUDA0 (NVIDIA GeForce RTX 4090), 20/24 layers"."""
    device_bytes_used: int
    """What the offload plan puts on the device: weights, KV and compute reserve."""
    device_cap_bytes: int
    """The volunteer's cap; with no cap, the device's size (the real limit). 0 on CPU."""
    gpu_layers: int
    n_layers: int

    @classmethod
    def from_reports(
        cls, backend: BackendReport, plan: OffloadPlan | None, n_layers: int
    ) -> StageCompute:
        if plan is None or not plan.on_gpu:
            return cls(backend.describe(plan), 0, 0, 0, n_layers)
        cap = plan.cap_bytes
        if cap <= 0:  # the volunteer set no cap: the whole device is the limit
            device = next((d for d in backend.devices if d.name == plan.device), None)
            cap = device.total_bytes if device is not None else 0
        return cls(backend.describe(plan), plan.device_bytes, cap, plan.layers_on_device, n_layers)

    def heartbeat_fields(self) -> dict[str, Any]:
        """Fields of the heartbeat (coordinator.contract.Heartbeat) that describe the stage."""
        return {
            "backend": self.backend,
            "device_bytes_used": self.device_bytes_used,
            "device_cap_bytes": self.device_cap_bytes,
            "gpu_layers": self.gpu_layers,
            "n_layers": self.n_layers,
        }

    @property
    def memory_text(self) -> str:
        """ "3.2 / 8.0 GiB device memory"; the operator page writes the same (app.js)."""
        used = f"{self.device_bytes_used / _GIB:.1f}"
        if self.device_cap_bytes <= 0:
            return f"{used} GiB device memory"
        return f"{used} / {self.device_cap_bytes / _GIB:.1f} GiB device memory"

    @property
    def layers_text(self) -> str:
        return f"{self.gpu_layers}/{self.n_layers} layers on GPU"


def stage_compute(stage: Stage) -> StageCompute | None:
    """The compute facts of a loaded stage, or None when its engine does not report them."""
    backend = getattr(stage.engine, "backend", None)
    if not isinstance(backend, BackendReport):
        return None
    plan = getattr(stage.engine, "offload", None)
    plan = plan if isinstance(plan, OffloadPlan) else None
    return StageCompute.from_reports(backend, plan, len(stage.spec.layers))
