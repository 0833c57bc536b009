"""Qwen3.5-397B-A17B at Q4_K_M as a header-only GGUF: the true metadata, tensor shapes and
quant types of the model Sangama exists for, with no tensor data (a ~60 KB file that
describes ~240 GB), so placement and manifests can be tested at true sizes.

Facts (Qwen/Qwen3.5-397B-A17B's config.json, as quoted by the mlx-community 4-bit card
and by several open-source configs of the model): hidden_size 4096; 60 layers, 15 x
(3 gated delta-net + 1 gated full attention); num_experts 512, num_experts_per_tok 10,
moe_intermediate_size 1024, shared_expert_intermediate_size 1024 (one published
test fixture says 4096; 1024 is what two independent configs say and what 397B total
parameters imply); attention 32 heads, 2 KV heads, head_dim 256; linear attention 16
key heads and 64 value heads of 128 dims, conv kernel 4; vocab_size 248320;
max_position_embeddings 262144; one MTP block; untied output.

Tensor names and shapes are those llama.cpp 0.3.36 loads for `qwen35moe`
(src/models/qwen35moe.cpp, src/llama-arch.cpp), in ggml's ne order. Quant types follow
llama.cpp's Q4_K_M rules (src/llama-quant.cpp): Q4_K by default; output.weight Q6_K;
attention V-like tensors (attn_v, and the fused attn_qkv of recurrent layers, one per
block, counted in file order) and ffn_down (routed and shared) Q6_K where
`use_more_bits(i, n)` holds (the first and last eighth of the blocks, and every third in
between); 1-D tensors, norms, the router (ffn_gate_inp) and ssm_conv1d stay F32 as the
converter writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

ARCH = "qwen35moe"
F32 = GGMLQuantizationType.F32
Q4_K = GGMLQuantizationType.Q4_K
Q6_K = GGMLQuantizationType.Q6_K
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


@dataclass(frozen=True)
class Qwen35MoeDims:
    n_layer: int = 60
    n_mtp: int = 1
    full_every: int = 4
    n_embd: int = 4096
    n_head: int = 32
    n_head_kv: int = 2
    head_dim: int = 256
    n_expert: int = 512
    n_expert_used: int = 10
    n_ff_exp: int = 1024
    n_ff_shexp: int = 1024
    linear_k_heads: int = 16
    linear_v_heads: int = 64
    linear_head_dim: int = 128
    conv_kernel: int = 4
    n_vocab: int = 248_320
    n_ctx: int = 262_144
    rope_dims: int = 64
    """partial_rotary_factor 0.25 of head_dim 256."""

    @property
    def n_blocks(self) -> int:
        return self.n_layer + self.n_mtp

    def recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_every != 0


QWEN35_397B = Qwen35MoeDims()


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which of n layers a K-quant "M" mix gives more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, block: int | None, n_blocks: int) -> GGMLQuantizationType:
    """The type llama.cpp's Q4_K_M quantization gives a 2-D+ tensor of this model."""
    if name == "output.weight":
        return Q6_K
    if block is not None and name.endswith(("attn_v.weight", "attn_qkv.weight")):
        return Q6_K if use_more_bits(block, n_blocks) else Q4_K  # one per block, in order
    if block is not None and "ffn_down" in name:
        return Q6_K if use_more_bits(block, n_blocks) else Q4_K
    return Q4_K


Row = tuple[str, tuple[int, ...], GGMLQuantizationType]
_KEPT_F32 = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight")


def tensor_table(d: Qwen35MoeDims = QWEN35_397B) -> list[Row]:
    """(name, ne shape innermost first, type) of every tensor, in file order."""
    rows: list[Row] = []

    def add(name: str, *ne: int, block: int | None = None) -> None:
        # Not quantized: 1-D tensors, biases and ssm_a, norms, the router, the conv kernel.
        if len(ne) == 1 or not name.endswith(".weight") or name.endswith(_KEPT_F32):
            kind = F32
        else:
            kind = q4_k_m_type(name, block, d.n_blocks)
        rows.append((name, ne, kind))

    e, hd = d.n_embd, d.head_dim
    add("token_embd.weight", e, d.n_vocab)
    key_dim = d.linear_k_heads * d.linear_head_dim
    value_dim = d.linear_v_heads * d.linear_head_dim
    conv_dim = 2 * key_dim + value_dim
    for il in range(d.n_blocks):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", e, block=il)
        add(p + "post_attention_norm.weight", e, block=il)
        if d.recurrent(il):
            add(p + "attn_qkv.weight", e, conv_dim, block=il)
            add(p + "attn_gate.weight", e, value_dim, block=il)
            add(p + "ssm_conv1d.weight", d.conv_kernel, conv_dim, block=il)
            add(p + "ssm_dt.bias", d.linear_v_heads, block=il)
            add(p + "ssm_a", d.linear_v_heads, block=il)
            add(p + "ssm_beta.weight", e, d.linear_v_heads, block=il)
            add(p + "ssm_alpha.weight", e, d.linear_v_heads, block=il)
            add(p + "ssm_norm.weight", d.linear_head_dim, block=il)
            add(p + "ssm_out.weight", value_dim, e, block=il)
        else:
            add(p + "attn_q.weight", e, 2 * d.n_head * hd, block=il)  # per head [q | gate]
            add(p + "attn_k.weight", e, d.n_head_kv * hd, block=il)
            add(p + "attn_v.weight", e, d.n_head_kv * hd, block=il)
            add(p + "attn_output.weight", d.n_head * hd, e, block=il)
            add(p + "attn_q_norm.weight", hd, block=il)
            add(p + "attn_k_norm.weight", hd, block=il)
        add(p + "ffn_gate_inp.weight", e, d.n_expert, block=il)
        add(p + "ffn_gate_exps.weight", e, d.n_ff_exp, d.n_expert, block=il)
        add(p + "ffn_up_exps.weight", e, d.n_ff_exp, d.n_expert, block=il)
        add(p + "ffn_down_exps.weight", d.n_ff_exp, e, d.n_expert, block=il)
        add(p + "ffn_gate_inp_shexp.weight", e, block=il)
        add(p + "ffn_gate_shexp.weight", e, d.n_ff_shexp, block=il)
        add(p + "ffn_up_shexp.weight", e, d.n_ff_shexp, block=il)
        add(p + "ffn_down_shexp.weight", d.n_ff_shexp, e, block=il)
        if il >= d.n_layer:  # the MTP block: embedding and hidden state in, one block
            add(p + "nextn.eh_proj.weight", 2 * e, e, block=il)
            add(p + "nextn.enorm.weight", e, block=il)
            add(p + "nextn.hnorm.weight", e, block=il)
            add(p + "nextn.shared_head_norm.weight", e, block=il)
    add("output_norm.weight", e)
    add("output.weight", e, d.n_vocab)
    return rows


def tensor_bytes(ne: tuple[int, ...], kind: GGMLQuantizationType) -> int:
    block, type_size = GGML_QUANT_SIZES[kind]
    return int(np.prod(ne)) // block * type_size


def write_header_only_gguf(
    path: Path, d: Qwen35MoeDims = QWEN35_397B, name: str = "Qwen3.5-397B-A17B"
) -> Path:
    """Metadata and tensor table of the Q4_K_M GGUF, no data section, at `path`."""
    w = GGUFWriter(str(path), arch=ARCH)
    w.add_name(name)
    w.add_file_type(LLAMA_FTYPE_MOSTLY_Q4_K_M)
    w.add_block_count(d.n_blocks)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", d.n_mtp)
    w.add_context_length(d.n_ctx)
    w.add_embedding_length(d.n_embd)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(d.n_head_kv)
    w.add_key_length(d.head_dim)
    w.add_value_length(d.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10_000_000.0)
    w.add_rope_dimension_count(d.rope_dims)
    w.add_expert_count(d.n_expert)
    w.add_expert_used_count(d.n_expert_used)
    w.add_expert_feed_forward_length(d.n_ff_exp)
    w.add_expert_shared_feed_forward_length(d.n_ff_shexp)
    w.add_ssm_conv_kernel(d.conv_kernel)
    w.add_ssm_state_size(d.linear_head_dim)
    w.add_ssm_group_count(d.linear_k_heads)
    w.add_ssm_time_step_rank(d.linear_v_heads)
    w.add_ssm_inner_size(d.linear_v_heads * d.linear_head_dim)
    w.add_key_value(f"{ARCH}.full_attention_interval", d.full_every, GGUFValueType.UINT32)
    # No tokenizer arrays: the vocabulary size alone is what placement needs.
    w.add_vocab_size(d.n_vocab)
    for tensor_name, ne, kind in tensor_table(d):
        # gguf-py takes numpy's order (outermost first) and writes it reversed.
        w.add_tensor_info(
            tensor_name, tuple(reversed(ne)), np.dtype(np.float32), tensor_bytes(ne, kind), kind
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path
