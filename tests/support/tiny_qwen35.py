"""A tiny random-weight qwen35 or qwen35moe GGUF: hybrid (gated delta-net recurrent layers
plus full-attention layers, IMROPE positions) with an optional MTP ("nextn") block, keys
and tensors as llama.cpp 0.3.36's src/models/qwen35.cpp and qwen35moe.cpp load them. The
qwen35moe variant has what Qwen3.5-397B-A17B has in every layer, MTP block included:
routed experts (`ffn_{gate,up,down}_exps`, a router `ffn_gate_inp`) and a shared expert
with its own sigmoid gate (`ffn_*_shexp`, `ffn_gate_inp_shexp`), and may take an explicit,
irregular list of recurrent layers as the converter writes it.

`tie_mtp_head=True` makes the MTP block agree with the trunk often: its projection
passes the trunk's hidden state straight through (eh_proj = [0 | I]) and its attention
and FFN outputs are near zero, so its guess is close to argmax(output(norm(h))) of the
previous position, i.e. the token the trunk just produced. That repeats whenever the
trunk repeats itself, which random tiny models do a lot, so some guesses stand and
some do not, and both paths of verification run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "qwen35"
ARCH_MOE = "qwen35moe"


@dataclass(frozen=True)
class Qwen35Dims:
    n_layer: int = 6
    """Trunk layers; the MTP block (when present) is block n_layer."""
    full_every: int = 2
    """Every full_every-th trunk layer is full attention, the rest recurrent."""
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 256
    n_ctx: int = 1024
    ssm_state: int = 16
    ssm_groups: int = 2
    ssm_rank: int = 4
    conv_kernel: int = 4
    moe: bool = False
    """qwen35moe: routed experts plus a gated shared expert in every layer."""
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: int = 48
    pattern: tuple[bool, ...] | None = None
    """Which trunk layers are recurrent, when not every full_every-th is attention."""

    @property
    def arch(self) -> str:
        return ARCH_MOE if self.moe else ARCH

    def recurrent(self) -> list[bool]:
        if self.pattern is not None:
            assert len(self.pattern) == self.n_layer
            return list(self.pattern)
        return [(i + 1) % self.full_every != 0 for i in range(self.n_layer)]


def write_qwen35_model(
    path: Path,
    dims: Qwen35Dims = Qwen35Dims(),
    mtp: bool = True,
    tie_mtp_head: bool = True,
    seed: int = 0,
    echo: float = 0.0,
) -> Path:
    """`echo` > 0 mixes token_embd into the output projection: the residual stream still
    holds the input token's embedding, so the trunk often (not always) repeats its last
    token, which is what the tied MTP head guesses."""
    d = dims
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    n_blocks = d.n_layer + (1 if mtp else 0)
    arch = d.arch
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(d.n_ctx)
    w.add_embedding_length(d.n_embd)
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(d.n_ff)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(d.n_head_kv)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(d.head_dim)
    # IMROPE counts rotation pairs per section: head_dim/2 pairs split over 4 sections.
    quarter = d.head_dim // 8
    w.add_rope_dimension_sections([quarter, quarter, quarter, quarter])
    w.add_ssm_conv_kernel(d.conv_kernel)
    w.add_ssm_inner_size(d.ssm_state * d.ssm_rank)
    w.add_ssm_state_size(d.ssm_state)
    w.add_ssm_time_step_rank(d.ssm_rank)
    w.add_ssm_group_count(d.ssm_groups)
    recurrent = d.recurrent() + ([False] if mtp else [])
    if d.moe:
        w.add_expert_count(d.n_expert)
        w.add_expert_used_count(d.n_expert_used)
        w.add_expert_feed_forward_length(d.n_ff_exp)
        w.add_expert_shared_feed_forward_length(d.n_ff_shexp)
    w.add_key_value(
        f"{arch}.attention.recurrent_layers",
        recurrent,
        gguf.GGUFValueType.ARRAY,
        sub_type=gguf.GGUFValueType.BOOL,
    )
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_tokenizer_model("none")  # llama.cpp then makes n_vocab dummy tokens
    w.add_vocab_size(d.n_vocab)

    e, hd = d.n_embd, d.head_dim
    embd = weights(d.n_vocab, e, scale=1.0)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", norm(e))
    head = weights(d.n_vocab, e) + echo * embd / np.sqrt(e)
    w.add_tensor("output.weight", head.astype(np.float32))

    def ffn(p: str, scale: float | None = None) -> None:
        if not d.moe:
            w.add_tensor(p + "ffn_gate.weight", weights(d.n_ff, e))
            w.add_tensor(p + "ffn_up.weight", weights(d.n_ff, e))
            w.add_tensor(p + "ffn_down.weight", weights(e, d.n_ff, scale=scale))
            return
        x, f, fs = d.n_expert, d.n_ff_exp, d.n_ff_shexp
        w.add_tensor(p + "ffn_gate_inp.weight", weights(x, e))
        w.add_tensor(p + "ffn_gate_exps.weight", weights(x, f, e))
        w.add_tensor(p + "ffn_up_exps.weight", weights(x, f, e))
        w.add_tensor(p + "ffn_down_exps.weight", weights(x, e, f, scale=scale))
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", weights(e))
        w.add_tensor(p + "ffn_gate_shexp.weight", weights(fs, e))
        w.add_tensor(p + "ffn_up_shexp.weight", weights(fs, e))
        w.add_tensor(p + "ffn_down_shexp.weight", weights(e, fs, scale=scale))

    def attention(p: str, out_scale: float | None = None) -> None:
        w.add_tensor(p + "attn_q.weight", weights(2 * d.n_head * hd, e))  # per head [q | gate]
        w.add_tensor(p + "attn_k.weight", weights(d.n_head_kv * hd, e))
        w.add_tensor(p + "attn_v.weight", weights(d.n_head_kv * hd, e))
        w.add_tensor(p + "attn_output.weight", weights(e, d.n_head * hd, scale=out_scale))
        w.add_tensor(p + "attn_q_norm.weight", norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", norm(hd))

    key_dim = d.ssm_state * d.ssm_groups
    value_dim = d.ssm_state * d.ssm_rank
    conv_dim = 2 * key_dim + value_dim
    for i in range(d.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(e))
        w.add_tensor(p + "post_attention_norm.weight", norm(e))
        if recurrent[i]:
            w.add_tensor(p + "attn_qkv.weight", weights(conv_dim, e))
            w.add_tensor(p + "attn_gate.weight", weights(value_dim, e))
            w.add_tensor(p + "ssm_conv1d.weight", weights(conv_dim, d.conv_kernel, scale=0.5))
            dt_bias = (0.1 * rng.standard_normal(d.ssm_rank)).astype(np.float32)
            w.add_tensor(p + "ssm_dt.bias", dt_bias)
            w.add_tensor(p + "ssm_a", -np.abs(rng.standard_normal(d.ssm_rank)).astype(np.float32))
            w.add_tensor(p + "ssm_beta.weight", weights(d.ssm_rank, e))
            w.add_tensor(p + "ssm_alpha.weight", weights(d.ssm_rank, e))
            w.add_tensor(p + "ssm_norm.weight", norm(d.ssm_state))
            w.add_tensor(p + "ssm_out.weight", weights(e, value_dim))
        else:
            attention(p)
        ffn(p)
    if mtp:
        p = f"blk.{d.n_layer}."
        small = 1e-3 if tie_mtp_head else None
        w.add_tensor(p + "attn_norm.weight", norm(e))
        w.add_tensor(p + "post_attention_norm.weight", norm(e))
        attention(p, out_scale=small)
        ffn(p, scale=small)
        if tie_mtp_head:
            # concat(enorm(embed), hnorm(h)) -> h: the head sees the trunk's state only.
            eh = np.concatenate([np.zeros((e, e)), np.eye(e)], axis=1).astype(np.float32)
            w.add_tensor(p + "nextn.enorm.weight", np.ones(e, dtype=np.float32))
            w.add_tensor(p + "nextn.hnorm.weight", np.ones(e, dtype=np.float32))
        else:
            eh = weights(e, 2 * e)
            w.add_tensor(p + "nextn.enorm.weight", norm(e))
            w.add_tensor(p + "nextn.hnorm.weight", norm(e))
        w.add_tensor(p + "nextn.eh_proj.weight", eh)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
