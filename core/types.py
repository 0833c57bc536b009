"""Small frozen value types shared by the engine, the wire and the coordinator."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any


def format_layers(start: int, stop: int) -> str:
    """Layers [start, stop) as a person reads them: "layers 20-29" (20 through 29), or
    "layer 20" alone. The one notation of the CLI, logs, the tray and the operator page
    (its JS copy: layerText in app.js); code and the wire keep [start, stop)."""
    if stop - start == 1:
        return f"layer {start}"
    return f"layers {start}-{stop - 1}"


@dataclass(frozen=True, order=True)
class LayerRange:
    """Transformer blocks [start, stop) of a model; the one range type used everywhere."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not (0 <= self.start < self.stop):
            raise ValueError(f"invalid layer range [{self.start}, {self.stop})")

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Any:
        return iter(range(self.start, self.stop))

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, int) and self.start <= layer < self.stop

    def __str__(self) -> str:
        return format_layers(self.start, self.stop)

    @staticmethod
    def from_cuts(cuts: list[int] | tuple[int, ...]) -> list[LayerRange]:
        """`[0, 6, 12, 18]` -> three consecutive ranges; cuts must strictly increase."""
        if len(cuts) < 2:
            raise ValueError("need at least two cut points")
        if any(b <= a for a, b in pairwise(cuts)):
            raise ValueError(f"cut points must strictly increase: {list(cuts)}")
        return [LayerRange(a, b) for a, b in pairwise(cuts)]


@dataclass(frozen=True)
class ModelFacts:
    """What placement and the wire need to know about a model, read once from its GGUF."""

    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    layer_kinds: tuple[str, ...]
    """Per-layer attention kind: "full", "sliding" or "recurrent"."""
    bytes_per_layer: tuple[int, ...]
    kv_bytes_per_token_per_layer: tuple[int, ...]
    """f16 K+V cache bytes one position costs in each layer (0 for recurrent layers)."""
    embedding_bytes: int
    head_bytes: int
    tied_output: bool
    """The output projection reuses token_embd (Gemma), so the last stage needs it too."""
    bos_token: int | None = None
    eos_tokens: tuple[int, ...] = ()
    name: str = ""
    allowed_cuts: tuple[int, ...] | None = None
    """Layer boundaries where a stage may start or end and stay exact (0 and n_layer
    included); None: every boundary (manifests written before this field existed)."""
    cut_reason: str = ""
    """Why cuts are restricted, for refusals and the operator."""
    global_tensors: tuple[str, ...] = ()
    """Names of the model's non-block tensors, so a stage without the embedding or head
    piece can still write the placeholders llama.cpp requires."""
    n_mtp_layers: int = 0
    """MTP ("nextn") blocks after the trunk (block_count = n_layer + this): the last
    stage alone gets them, to guess tokens ahead."""
    recurrent_state_bytes_per_session_per_layer: tuple[int, ...] = ()
    """f32 conv + SSM state one session holds in each recurrent layer, one copy (0 in
    attention layers; llama.cpp keeps 1 + n_rs_seq copies, core.model_sizes); () when
    unknown (manifests written before this field existed)."""
    mtp_kv_bytes_per_token: int = 0
    """f16 K+V one position costs in the MTP block(s): the last stage's MTP context."""

    def cut_allowed(self, position: int) -> bool:
        return self.allowed_cuts is None or position in self.allowed_cuts

    def stage_weight_bytes(self, layers: LayerRange) -> int:
        """Bytes of weights a stage holding `layers` loads (block bytes plus end pieces)."""
        total = sum(self.bytes_per_layer[layers.start : layers.stop])
        if layers.start == 0:
            total += self.embedding_bytes
        if layers.stop == self.n_layer:
            total += self.head_bytes + (0 if layers.start == 0 else self.embedding_bytes)
        return total

    def stage_kv_bytes(self, layers: LayerRange, positions: int) -> int:
        """KV-cache bytes for `positions` cached positions in the stage's layers."""
        return positions * sum(self.kv_bytes_per_token_per_layer[layers.start : layers.stop])

    def stage_state_bytes(self, layers: LayerRange, sessions: int, copies: int = 1) -> int:
        """Recurrent-state bytes `sessions` sessions hold in the stage's layers, `copies`
        states each (1 + the engine's snapshots per sequence)."""
        per = self.recurrent_state_bytes_per_session_per_layer[layers.start : layers.stop]
        return sessions * copies * sum(per)


@dataclass(frozen=True)
class SamplingParams:
    """How the last stage turns logits into a token; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_window: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        # Written so that NaN fails every check: `nan < 0` is False, `not (nan >= 0)` is True.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError("temperature must be finite and >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if not (0.0 <= self.min_p < 1.0):
            raise ValueError("min_p must be in [0, 1)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be finite and > 0")
        if self.repetition_window < 0:
            raise ValueError("repetition_window must be >= 0 (0 disables the penalty)")
        if self.seed < 0:
            raise ValueError("seed must be >= 0 (numpy seeds are non-negative)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class StageSpec:
    """How to build one stage's runtime."""

    layers: LayerRange
    n_layer_total: int
    n_ctx: int = 2048
    """KV positions of the stage, all sessions together: each session has a stream of
    n_ctx / n_seq_max of them (`session_ctx`)."""
    n_batch: int = 256
    n_seq_max: int = 8
    n_threads: int = 2
    use_gpu: bool = True
    """Offload the stage's blocks to a GPU where the engine finds one."""
    device_cap_bytes: int = 0
    """The most GPU memory the stage may take (the volunteer's cap); 0: all free."""
    reproducible: bool = False
    """Each session's rows in a llama_decode of their own. Not needed for the same
    numbers as alone (every session has a KV stream of its own and the kernels used do
    not depend on the batch); kept to measure what batching across sessions gains."""

    @property
    def session_ctx(self) -> int:
        """Positions one session may hold: its own stream's share of the stage's KV."""
        return self.n_ctx // self.n_seq_max

    def __post_init__(self) -> None:
        if self.device_cap_bytes < 0:
            raise ValueError("device_cap_bytes must be >= 0 (0: all free device memory)")
        if self.layers.stop > self.n_layer_total:
            raise ValueError(f"{self.layers} exceeds the model's {self.n_layer_total} layers")
        if not (1 <= self.n_seq_max <= 256):
            raise ValueError("n_seq_max must be in 1..256 (llama.cpp's limit)")
        if self.n_batch < 1 or self.n_ctx < 1 or self.n_threads < 1:
            raise ValueError("n_batch, n_ctx and n_threads must be positive")

    @property
    def is_first(self) -> bool:
        return self.layers.start == 0

    @property
    def is_last(self) -> bool:
        return self.layers.stop == self.n_layer_total


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML sees it; sizes in bytes."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class HardwareReport:
    """Memory a node can offer; from NVML when there is an NVIDIA GPU, else system RAM."""

    gpus: tuple[GpuInfo, ...]
    system_total_bytes: int
    system_available_bytes: int
    driver: str | None
    note: str

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def usable_bytes(self) -> int:
        """Free VRAM summed over GPUs, or available system memory without a GPU."""
        if self.gpus:
            return sum(g.free_bytes for g in self.gpus)
        return self.system_available_bytes


@dataclass(frozen=True)
class ComputeDevice:
    """One device llama.cpp can run layers on, as its backend registry lists it."""

    name: str
    """ggml's device name: "CPU", "Vulkan0", "CUDA0"."""
    description: str
    """What the hardware calls itself: "AMD EPYC 7B13", "NVIDIA GeForce RTX 4090"."""
    kind: str
    """"cpu", "gpu", "igpu" (integrated GPU) or "accel"."""
    total_bytes: int
    free_bytes: int

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")


@dataclass(frozen=True)
class OffloadPlan:
    """Which of a stage's layers run on a GPU, and the device memory that takes."""

    device: str | None
    """ggml device name the layers go to; None: everything on the CPU."""
    n_gpu_layers: int
    n_layer: int
    weight_bytes: int
    """Weights placed on the device."""
    kv_bytes: int
    """KV cache of the offloaded layers for every admitted session at full context."""
    reserve_bytes: int
    """Compute buffers and driver overhead kept free on the device."""
    cap_bytes: int
    """The most device memory the volunteer lets this stage take."""
    reason: str

    @property
    def layers_on_device(self) -> int:
        """Blocks on the device (n_gpu_layers counts the output layer as one more)."""
        return min(self.n_gpu_layers, self.n_layer)

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.reserve_bytes if self.n_gpu_layers else 0

    @property
    def on_gpu(self) -> bool:
        return self.device is not None and self.n_gpu_layers > 0


@dataclass(frozen=True)
class BackendReport:
    """What runs where in this process: the CPU kernels chosen and the devices seen."""

    cpu_variant: str
    """The CPU module llama.cpp loaded ("zen4", "haswell", ...) or "built-in"."""
    cpu_features: tuple[str, ...]
    devices: tuple[ComputeDevice, ...]
    disabled_buffer_types: tuple[str, ...]
    """Extra weight layouts Sangama refuses to use (AMX), see docs/engine.md."""
    dynamic: bool
    """True for the shipped build (backends loaded as modules at start-up)."""

    @property
    def gpus(self) -> tuple[ComputeDevice, ...]:
        return tuple(d for d in self.devices if d.is_gpu)

    def describe(self, plan: OffloadPlan | None = None) -> str:
        """One line: the backend that runs the stage's layers."""
        if plan is not None and plan.on_gpu:
            gpu = next((d for d in self.devices if d.name == plan.device), None)
            label = gpu.description if gpu is not None else str(plan.device)
            return f"{plan.device} ({label}), {plan.layers_on_device}/{plan.n_layer} layers"
        return f"CPU ({self.cpu_variant})"
