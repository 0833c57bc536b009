"""Tiny random-weight GGUF models of more architectures, each with the tensors and keys its
llama.cpp 0.3.36 loader requires (src/models/<arch>.cpp): fast, deterministic, and built to
exercise what a cut can get wrong (biases, global rope factors, a fused QKV, position
embeddings, post-norms, an embedding scale, sliding-window and no-RoPE layer patterns)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Dims:
    n_layer: int = 8
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_vocab: int = 512
    n_ctx: int = 512

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


class _Builder:
    """A GGUFWriter plus seeded random tensors."""

    def __init__(self, path: Path, arch: str, d: Dims, seed: int) -> None:
        self.w = gguf.GGUFWriter(str(path), arch=arch)
        self.arch, self.d = arch, d
        self.rng = np.random.default_rng(seed)

    def weights(self, *shape: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (self.rng.standard_normal(shape) * s).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def bias(self, n: int) -> np.ndarray:
        return (0.05 * self.rng.standard_normal(n)).astype(np.float32)

    def t(self, name: str, data: np.ndarray) -> None:
        self.w.add_tensor(name, data)

    def common_keys(self, norm: str = "rms") -> None:
        w, d = self.w, self.d
        w.add_name(f"tiny-{self.arch}")
        w.add_context_length(d.n_ctx)
        w.add_embedding_length(d.n_embd)
        w.add_block_count(d.n_layer)
        w.add_feed_forward_length(d.n_ff)
        w.add_head_count(d.n_head)
        w.add_head_count_kv(d.n_head_kv)
        if norm == "rms":
            w.add_layer_norm_rms_eps(1e-5)
        else:
            w.add_layer_norm_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_tokenizer_model("none")  # llama.cpp then makes n_vocab dummy tokens
        w.add_vocab_size(d.n_vocab)

    def embedding(self, output: bool = True) -> None:
        d = self.d
        self.t("token_embd.weight", self.weights(d.n_vocab, d.n_embd, scale=1.0))
        self.t("output_norm.weight", self.norm(d.n_embd))
        if output:
            self.t("output.weight", self.weights(d.n_vocab, d.n_embd))

    def qkvo(self, p: str, biases: bool = False, out_bias: bool = False) -> None:
        d = self.d
        self.t(p + "attn_q.weight", self.weights(d.n_head * d.head_dim, d.n_embd))
        self.t(p + "attn_k.weight", self.weights(d.kv_dim, d.n_embd))
        self.t(p + "attn_v.weight", self.weights(d.kv_dim, d.n_embd))
        self.t(p + "attn_output.weight", self.weights(d.n_embd, d.n_head * d.head_dim))
        if biases:
            self.t(p + "attn_q.bias", self.bias(d.n_head * d.head_dim))
            self.t(p + "attn_k.bias", self.bias(d.kv_dim))
            self.t(p + "attn_v.bias", self.bias(d.kv_dim))
        if out_bias:
            self.t(p + "attn_output.bias", self.bias(d.n_embd))

    def gated_ffn(self, p: str) -> None:
        d = self.d
        self.t(p + "ffn_gate.weight", self.weights(d.n_ff, d.n_embd))
        self.t(p + "ffn_up.weight", self.weights(d.n_ff, d.n_embd))
        self.t(p + "ffn_down.weight", self.weights(d.n_embd, d.n_ff))

    def llama_block(self, p: str, biases: bool = False) -> None:
        self.t(p + "attn_norm.weight", self.norm(self.d.n_embd))
        self.qkvo(p, biases=biases)
        self.t(p + "ffn_norm.weight", self.norm(self.d.n_embd))
        self.gated_ffn(p)

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def _qwen2(b: _Builder) -> None:
    b.common_keys()
    b.embedding()
    for i in range(b.d.n_layer):
        b.llama_block(f"blk.{i}.", biases=True)  # Qwen2's q/k/v biases


def _smollm3(b: _Builder) -> None:
    b.common_keys()
    b.embedding(output=False)  # tied head
    for i in range(b.d.n_layer):
        b.llama_block(f"blk.{i}.")


def _granite(b: _Builder) -> None:
    b.common_keys()
    b.w.add_float32("granite.logit_scale", 2.0)
    b.w.add_float32("granite.residual_scale", 0.5)
    b.w.add_float32("granite.embedding_scale", 3.0)
    b.w.add_float32("granite.attention.scale", 0.2)
    b.embedding()
    # A global tensor every layer reads: must reach every stage.
    b.t("rope_freqs.weight", (1 + b.rng.random(b.d.head_dim // 2)).astype(np.float32))
    for i in range(b.d.n_layer):
        b.llama_block(f"blk.{i}.")


def _phi3(b: _Builder) -> None:
    d = b.d
    b.common_keys()
    b.embedding()
    b.t("rope_factors_long.weight", (1 + b.rng.random(d.head_dim // 2)).astype(np.float32))
    b.t("rope_factors_short.weight", (1 + b.rng.random(d.head_dim // 2)).astype(np.float32))
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.t(p + "attn_norm.weight", b.norm(d.n_embd))
        b.t(p + "attn_qkv.weight", b.weights(d.n_embd + 2 * d.kv_dim, d.n_embd))
        b.t(p + "attn_output.weight", b.weights(d.n_embd, d.n_embd))
        b.t(p + "ffn_norm.weight", b.norm(d.n_embd))
        b.t(p + "ffn_up.weight", b.weights(2 * d.n_ff, d.n_embd))  # gate and up fused
        b.t(p + "ffn_down.weight", b.weights(d.n_embd, d.n_ff))


def _starcoder2(b: _Builder) -> None:
    d = b.d
    b.common_keys(norm="layer")
    b.t("token_embd.weight", b.weights(d.n_vocab, d.n_embd, scale=1.0))
    b.t("output_norm.weight", b.norm(d.n_embd))
    b.t("output_norm.bias", b.bias(d.n_embd))  # tied head, LayerNorm with bias
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.t(p + "attn_norm.weight", b.norm(d.n_embd))
        b.t(p + "attn_norm.bias", b.bias(d.n_embd))
        b.qkvo(p, biases=True, out_bias=True)
        b.t(p + "ffn_norm.weight", b.norm(d.n_embd))
        b.t(p + "ffn_norm.bias", b.bias(d.n_embd))
        b.t(p + "ffn_up.weight", b.weights(d.n_ff, d.n_embd))
        b.t(p + "ffn_up.bias", b.bias(d.n_ff))
        b.t(p + "ffn_down.weight", b.weights(d.n_embd, d.n_ff))
        b.t(p + "ffn_down.bias", b.bias(d.n_embd))


def _starcoder(b: _Builder) -> None:
    d = b.d
    b.common_keys(norm="layer")
    b.t("token_embd.weight", b.weights(d.n_vocab, d.n_embd, scale=1.0))
    b.t("position_embd.weight", b.weights(d.n_ctx, d.n_embd, scale=0.5))
    b.t("output_norm.weight", b.norm(d.n_embd))
    b.t("output_norm.bias", b.bias(d.n_embd))
    b.t("output.weight", b.weights(d.n_vocab, d.n_embd))
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.t(p + "attn_norm.weight", b.norm(d.n_embd))
        b.t(p + "attn_norm.bias", b.bias(d.n_embd))
        b.t(p + "attn_qkv.weight", b.weights(d.n_embd + 2 * d.kv_dim, d.n_embd))
        b.t(p + "attn_qkv.bias", b.bias(d.n_embd + 2 * d.kv_dim))
        b.t(p + "attn_output.weight", b.weights(d.n_embd, d.n_embd))
        b.t(p + "attn_output.bias", b.bias(d.n_embd))
        b.t(p + "ffn_norm.weight", b.norm(d.n_embd))
        b.t(p + "ffn_norm.bias", b.bias(d.n_embd))
        b.t(p + "ffn_up.weight", b.weights(d.n_ff, d.n_embd))
        b.t(p + "ffn_up.bias", b.bias(d.n_ff))
        b.t(p + "ffn_down.weight", b.weights(d.n_embd, d.n_ff))
        b.t(p + "ffn_down.bias", b.bias(d.n_embd))


def _olmo2(b: _Builder) -> None:
    d = b.d
    b.common_keys()
    b.embedding()  # olmo2 requires output.weight: non-last stages get a zero Q4_0 one
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.qkvo(p)
        b.t(p + "attn_q_norm.weight", b.norm(d.n_embd))
        b.t(p + "attn_k_norm.weight", b.norm(d.kv_dim))
        b.t(p + "post_attention_norm.weight", b.norm(d.n_embd))
        b.gated_ffn(p)
        b.t(p + "post_ffw_norm.weight", b.norm(d.n_embd))


def _gemma2(b: _Builder) -> None:
    d = b.d
    b.common_keys()
    b.w.add_sliding_window(16)
    b.w.add_key_length(d.head_dim)
    b.w.add_value_length(d.head_dim)
    b.w.add_float32("gemma2.attn_logit_softcapping", 50.0)
    b.w.add_float32("gemma2.final_logit_softcapping", 30.0)
    b.embedding(output=False)
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.t(p + "attn_norm.weight", b.norm(d.n_embd))
        b.qkvo(p)
        b.t(p + "post_attention_norm.weight", b.norm(d.n_embd))
        b.t(p + "ffn_norm.weight", b.norm(d.n_embd))
        b.gated_ffn(p)
        b.t(p + "post_ffw_norm.weight", b.norm(d.n_embd))


def _cohere2(b: _Builder) -> None:
    d = b.d
    b.common_keys(norm="layer")
    b.w.add_sliding_window(16)  # period 4 from the loader: layers 3, 7 are global
    b.w.add_float32("cohere2.logit_scale", 0.5)
    b.embedding(output=False)
    for i in range(d.n_layer):
        p = f"blk.{i}."
        b.t(p + "attn_norm.weight", b.norm(d.n_embd))
        b.qkvo(p)
        b.gated_ffn(p)


_FAMILIES: dict[str, Callable[[_Builder], None]] = {
    "qwen2": _qwen2,
    "smollm3": _smollm3,
    "granite": _granite,
    "phi3": _phi3,
    "starcoder2": _starcoder2,
    "starcoder": _starcoder,
    "olmo2": _olmo2,
    "gemma2": _gemma2,
    "cohere2": _cohere2,
}
FAMILIES = tuple(_FAMILIES)


def write_family_model(path: Path, arch: str, dims: Dims = Dims(), seed: int = 0) -> Path:
    """A tiny random `arch` model (one of FAMILIES) with a dummy vocabulary."""
    if arch not in _FAMILIES:
        raise ValueError(f"no tiny writer for {arch!r}; have {', '.join(FAMILIES)}")
    b = _Builder(Path(path), arch, dims, seed)
    _FAMILIES[arch](b)
    b.close()
    return Path(path)
