"""Where every tensor and metadata key of a GGUF goes in a chain, and which cuts are exact.

Pure tables and functions, read off llama.cpp 0.3.36 (src/llama-arch.cpp for the names,
src/models/<arch>.cpp for what each loader and graph does with them). The slicer asks:

- `tensor_place(arch, name)`: "block" (blk.N.*), "embedding" (first stage), "head" (last
  stage) or "shared" (a global tensor every layer reads, e.g. rope factors). A tensor no
  table knows is refused: a stage without it would differ, a stage with it unused is
  refused by llama.cpp's tensor count anyway.
- `key_role(arch, key)`: how a metadata key travels (copied, sliced per layer, rewritten by
  the assembler, first stage only, tokenizer, refused when it is set, or dropped).
- `cut_policy(...)`: the cut points at which a stage boundary keeps the chain equal to the
  whole model, or None when any boundary does. Only architectures whose graph we read are
  accepted; others are refused by name rather than risked.

Layer patterns llama.cpp reads from the GGUF (sliding-window and recurrent layers) are
written per layer by the assembler, so they never restrict cuts; patterns the loader fixes
by layer index in code do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import UnsupportedModelError

BLOCK = "block"
EMBEDDING = "embedding"
HEAD = "head"
SHARED = "shared"

# ---------------------------------------------------------------- tensors

_GLOBAL_TENSORS: Mapping[str, str] = {
    "token_embd.weight": EMBEDDING,
    # Added to the token embeddings by gpt2-style graphs; later stages get zeros (x+0 == x).
    "position_embd.weight": EMBEDDING,
    "output_norm.weight": HEAD,
    "output_norm.bias": HEAD,
    "output.weight": HEAD,
    "output.bias": HEAD,
    # One tensor that llama.cpp hands to every layer (TENSOR_DUPLICATED for il != 0).
    "rope_freqs.weight": SHARED,
    "rope_factors_long.weight": SHARED,
    "rope_factors_short.weight": SHARED,
}

# Embedding tensors other than token_embd that a non-first stage replaces by a neutral
# value; anything else in the embedding piece would be applied twice.
NEUTRAL_IF_NOT_FIRST = {"position_embd.weight": 0.0}
# Head tensors a non-last stage replaces by dummies (never evaluated: the capture stops
# the graph at the last block) because the loader requires them.
DUMMY_HEAD = {"output_norm.weight": 1.0, "output_norm.bias": 0.0, "output.bias": 0.0}
# Architectures whose loader requires output.weight (no fallback to token_embd).
OUTPUT_REQUIRED = frozenset({"olmo2", "qwen2moe"})


def tensor_place(arch: str, name: str) -> str:
    """The piece a tensor belongs to; UnsupportedModelError for a tensor no table knows."""
    if name.startswith("blk."):
        return BLOCK
    place = _GLOBAL_TENSORS.get(name)
    if place is None:
        raise UnsupportedModelError(
            f"{arch}: tensor {name!r} is not a block tensor and not one of the global "
            "tensors Sangama knows where to place; refusing to slice rather than build "
            "stages that could differ from the whole model"
        )
    return place


# ---------------------------------------------------------------- metadata keys

COPY = "copy"
PER_LAYER = "per_layer"
REWRITE = "rewrite"
FIRST_ONLY = "first_only"
TOKENIZER = "tokenizer"
REFUSE_IF_SET = "refuse_if_set"
DROP = "drop"
"""Keys that describe the published file, not the model (gguf-split's split.*): no piece
or stage carries them."""

# `{arch}.` keys llama.cpp reads as one value per layer (get_key_or_arr with n_layer).
_PER_LAYER = frozenset(
    {
        "feed_forward_length",
        "expert_feed_forward_length",
        "expert_used_count",
        "attention.head_count",
        "attention.head_count_kv",
        "swiglu_clamp_exp",
        "swiglu_clamp_shexp",
    }
)
_PER_LAYER_GLOBAL_NAMES = frozenset({"xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps"})
# Rewritten by the assembler for each stage's own layers.
_REWRITE = frozenset(
    {
        "block_count",
        "nextn_predict_layers",
        "vocab_size",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "attention.recurrent_layers",
        "full_attention_interval",
        "leading_dense_block_count",
    }
)
# Applied by build_inp_embd to whatever enters the graph, hidden states included (granite):
# only the stage that embeds tokens may keep it.
_FIRST_ONLY = frozenset({"embedding_scale"})
# Keys whose meaning ties layers to other layers or to inputs only the first stage has;
# a model that sets them cannot be cut exactly (yet), so it is refused.
_REFUSE_IF_SET = frozenset(
    {
        "attention.shared_kv_layers",  # later layers reuse earlier layers' KV cache
        "embedding_length_per_layer_input",  # per-layer token inputs (gemma3n)
        "n_deepstack_layers",
        "deepstack_mapping",
        "hash_layer_count",
        "num_loops",
        "decoder_block_count",
        "target_layers",
        "attn_res.block_size",
        "hyper_connection.count",
        "ple.layers",
    }
)


def key_role(arch: str, key: str) -> str:
    """How `key` travels into a stage file. Keys llama.cpp does not read are copied: they
    cannot change what it computes."""
    if key.startswith("tokenizer."):
        return TOKENIZER
    if key.startswith("split."):
        return DROP  # the slicer reads every shard of a split model (core.gguf_shards)
    if key in _PER_LAYER_GLOBAL_NAMES:
        return PER_LAYER
    prefix = f"{arch}."
    if not key.startswith(prefix):
        return COPY
    suffix = key[len(prefix) :]
    if suffix in _PER_LAYER:
        return PER_LAYER
    if suffix in _REWRITE:
        return REWRITE
    if suffix in _FIRST_ONLY:
        return FIRST_ONLY
    if suffix in _REFUSE_IF_SET:
        return REFUSE_IF_SET
    return COPY


def _is_set(value: Any) -> bool:
    if isinstance(value, list):
        return any(_is_set(v) for v in value)
    if isinstance(value, str):
        return bool(value)
    return value is not None and value != 0 and value is not False


# Architectures whose MTP ("nextn") block Sangama places: one full-attention block after
# the trunk, read by the MTP graph only (src/models/qwen35*.cpp assert a single head).
MTP_ARCHS = frozenset({"qwen35", "qwen35moe"})


def mtp_layers(arch: str, metadata: Mapping[str, Any]) -> int:
    """How many MTP blocks follow the trunk (0 or 1); UnsupportedModelError for others."""
    n = int(metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)
    if n and (arch not in MTP_ARCHS or n != 1):
        raise UnsupportedModelError(
            f"{arch}: metadata {arch}.nextn_predict_layers={n!r}: Sangama places a single "
            f"MTP block of {', '.join(sorted(MTP_ARCHS))} only; refusing to slice"
        )
    return n


def check_keys(arch: str, metadata: Mapping[str, Any]) -> None:
    """Refuse a model that sets a key whose layers cannot be separated."""
    mtp_layers(arch, metadata)
    for key, value in metadata.items():
        if key_role(arch, key) == REFUSE_IF_SET and _is_set(value):
            raise UnsupportedModelError(
                f"{arch}: metadata {key}={value!r} ties layers together in a way a chain "
                "of stages cannot reproduce exactly; refusing to slice"
            )


# ---------------------------------------------------------------- cuts


@dataclass(frozen=True)
class CutPolicy:
    """Where stage boundaries may fall; `cuts` None: at every layer boundary."""

    cuts: tuple[int, ...] | None
    reason: str = ""


ANY = "any"
PERIOD = "period"
WHOLE = "whole"
SLIDING_START = "sliding_start"


@dataclass(frozen=True)
class ArchRule:
    kind: str
    period: int = 0
    why: str = ""


_SQRT_SCALE = (
    "the graph scales every stage's input by sqrt(n_embd), hidden states included, "
    "so only the whole model is exact"
)
ARCH_RULES: Mapping[str, ArchRule] = {
    "llama": ArchRule(ANY),
    "mistral3": ArchRule(ANY),
    "qwen2": ArchRule(ANY),
    "qwen2moe": ArchRule(ANY),
    "qwen3": ArchRule(ANY),
    "qwen3moe": ArchRule(ANY),
    # Hybrids: a stage may hold recurrent layers only or attention layers only, since the
    # engine's llama.cpp skips the inputs of a memory no layer of the graph reads
    # (installers/engine/patches/hybrid-memory-single-kind.patch); stock llama.cpp aborts
    # there with GGML_ASSERT(buffer).
    "qwen35": ArchRule(ANY),
    "qwen35moe": ArchRule(ANY),
    "qwen3next": ArchRule(ANY),
    "gemma3": ArchRule(ANY),
    "phi3": ArchRule(ANY),
    "starcoder": ArchRule(ANY),
    "starcoder2": ArchRule(ANY),
    "granite": ArchRule(ANY),
    "olmo2": ArchRule(ANY),
    "exaone4": ArchRule(ANY),
    "gemma": ArchRule(WHOLE, why=_SQRT_SCALE),
    "gemma2": ArchRule(WHOLE, why=_SQRT_SCALE),
    "smollm3": ArchRule(
        PERIOD, 4, "llama.cpp skips RoPE in every 4th layer by index (n_no_rope_layer_step=4)"
    ),
    "llama4": ArchRule(
        PERIOD, 4, "llama.cpp skips RoPE in every 4th layer by index (n_no_rope_layer_step=4)"
    ),
    # The loader forces sliding-window attention and asserts that a model has a sliding
    # layer: a stage must not consist of full-attention layers only.
    "cohere2": ArchRule(SLIDING_START, why="cohere2 stages must start at a sliding-window layer"),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(ARCH_RULES))


def cut_policy(
    arch: str, n_layer: int, metadata: Mapping[str, Any], kinds: Sequence[str]
) -> CutPolicy:
    """The exact cuts for this model (see ARCH_RULES), refusing unknown architectures."""
    rule = ARCH_RULES.get(arch)
    if rule is None:
        raise UnsupportedModelError(
            f"architecture {arch!r} has not been checked for exact layer cuts; "
            f"supported: {', '.join(supported_architectures())}"
        )
    kind, period, why = rule.kind, rule.period, rule.why
    if arch == "exaone4" and n_layer == 64:
        # The loader turns sliding-window attention on only for a 64-layer model.
        kind, why = WHOLE, "exaone4 enables sliding-window attention only when n_layer == 64"
    if arch == "llama4" and metadata.get(f"{arch}.attention.sliding_window") == 0:
        # Then n_no_rope_layer_step = n_layer: the stage's own last layer would skip RoPE.
        kind, why = WHOLE, "llama4 without chunked attention skips RoPE in its last layer"
    moe_step = int(metadata.get(f"{arch}.interleave_moe_layer_step", 0) or 0)
    if moe_step > 1 and kind != WHOLE:
        # MoE layers are those with (il + 1) % step == 0, counted from the stage's start.
        period = math.lcm(period or 1, moe_step)
        kind = PERIOD
        why = (why + "; " if why else "") + f"MoE every {moe_step} layers by index"
    if kind == ANY:
        return CutPolicy(None)
    if kind == WHOLE:
        return CutPolicy((0, n_layer), why)
    if kind == PERIOD:
        return CutPolicy((*range(0, n_layer, period), n_layer), why)
    starts = [i for i in range(n_layer) if kinds[i] == "sliding" or i == 0]
    return CutPolicy((*starts, n_layer), why)


def cut_allowed(cuts: tuple[int, ...] | None, position: int) -> bool:
    return cuts is None or position in cuts
