"""Memory a stage holds for its sessions beyond weights: recurrent state and the MTP
head's KV cache, from a GGUF's metadata alone. Pure functions, no IO.

Hybrid models (qwen3next, qwen35, qwen35moe) keep, in each gated delta-net layer, a
fixed-size state per session instead of K and V per position: a convolution state of
(ssm.conv_kernel - 1) x (ssm.inner_size + 2 x ssm.group_count x ssm.state_size) values
and an SSM state of ssm.state_size x ssm.inner_size values, both f32. These are
llama.cpp's `llama_hparams::n_embd_r()` and `n_embd_s()` for these architectures and the
`GGML_TYPE_F32` it passes for both (src/llama-hparams.cpp, src/llama-model.cpp, 0.3.36).
llama.cpp allocates `n_seq_max x (1 + n_rs_seq)` such rows per layer
(src/llama-memory-recurrent.cpp): one live state per sequence plus `n_rs_seq` per-token
snapshots that let `seq_rm` undo rejected guesses. So what one admitted session costs in
a recurrent layer is `(1 + snapshots) x recurrent_state_bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import SliceError

__all__ = [
    "RECURRENT_ARCHS",
    "RECURRENT_SNAPSHOTS",
    "STATE_BYTES_PER_VALUE",
    "mtp_kv_bytes_per_token",
    "recurrent_state_bytes",
    "recurrent_state_values",
]

RECURRENT_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
"""Architectures whose recurrent layers size their state with the Mamba-style formula
below (other recurrent families, RWKV or LFM2, use other formulas and are not sliced)."""
STATE_BYTES_PER_VALUE = 4
"""llama.cpp keeps recurrent state in f32 (recurrent_type_r and _s are GGML_TYPE_F32)."""
RECURRENT_SNAPSHOTS = 8
"""Per-token snapshots of each session's recurrent state a worker keeps, so a stage can
cut up to this many rejected guesses: the engine's `EngineConfig.n_rs_seq`."""
KV_BYTES_PER_VALUE = 2
"""K and V caches are f16 (llama.cpp's default type_k and type_v)."""


def _int(metadata: Mapping[str, Any], key: str) -> int:
    value = metadata.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SliceError(f"metadata {key} must be a non-negative integer, not {value!r}")
    return value


def recurrent_state_values(arch: str, metadata: Mapping[str, Any]) -> tuple[int, int]:
    """(conv, ssm) state values one sequence holds in one recurrent layer: llama.cpp's
    n_embd_r() and n_embd_s() for the hybrid qwen architectures; (0, 0) for others."""
    if arch not in RECURRENT_ARCHS:
        return 0, 0
    d_conv = _int(metadata, f"{arch}.ssm.conv_kernel")
    d_inner = _int(metadata, f"{arch}.ssm.inner_size")
    d_state = _int(metadata, f"{arch}.ssm.state_size")
    n_group = _int(metadata, f"{arch}.ssm.group_count")
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return conv, d_state * d_inner


def recurrent_state_bytes(
    arch: str, metadata: Mapping[str, Any], kinds: Sequence[str]
) -> tuple[int, ...]:
    """Per layer: bytes of one session's recurrent state, one copy (0 for attention
    layers and for architectures without recurrent layers)."""
    conv, ssm = recurrent_state_values(arch, metadata)
    per_layer = (conv + ssm) * STATE_BYTES_PER_VALUE
    return tuple(per_layer if kind == "recurrent" else 0 for kind in kinds)


def _at(value: Any, index: int, default: int) -> int:
    """A per-layer hyperparameter (scalar, or an array over every block) at `index`."""
    if isinstance(value, list):
        return int(value[index]) if 0 <= index < len(value) else default
    return default if value is None else int(value)


def mtp_kv_bytes_per_token(arch: str, metadata: Mapping[str, Any], n_layer: int, n_mtp: int) -> int:
    """K+V bytes one cached position costs in the MTP block(s) after the trunk: the last
    stage's MTP context keeps a KV cache for those blocks alone, as deep as the trunk's
    (llama.cpp's MTP context filters its cache to layers >= n_layer)."""
    if n_mtp <= 0:
        return 0
    n_embd = _int(metadata, f"{arch}.embedding_length")
    heads = metadata.get(f"{arch}.attention.head_count")
    heads_kv = metadata.get(f"{arch}.attention.head_count_kv")
    total = 0
    for il in range(n_layer, n_layer + n_mtp):
        n_head = max(1, _at(heads, il, 1))
        n_head_kv = _at(heads_kv, il, n_head)
        key = _int(metadata, f"{arch}.attention.key_length") or n_embd // n_head
        value = _int(metadata, f"{arch}.attention.value_length") or key
        total += KV_BYTES_PER_VALUE * n_head_kv * (key + value)
    return total
