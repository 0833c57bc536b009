"""Tiny random-weight GGUF models written with gguf.GGUFWriter: fast and deterministic."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.support.tiny_families import Dims, write_family_model


def write_tiny_model(
    path: Path,
    arch: str = "llama",
    n_layer: int = 8,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_vocab: int = 512,
    seed: int = 0,
) -> Path:
    """A `llama` or `qwen3` model with a dummy vocabulary of `n_vocab` tokens; other
    architectures come from tests.support.tiny_families."""
    if arch not in ("llama", "qwen3"):
        dims = Dims(n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab)
        return write_family_model(path, arch, dims, seed)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    # No tokenizer: llama.cpp then makes n_vocab dummy tokens.
    w.add_tokenizer_model("none")
    w.add_vocab_size(n_vocab)
    head_dim = n_embd // n_head

    def weights(*shape: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", weights(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", weights(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", weights(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", weights(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", weights(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", weights(n_embd, n_head * head_dim))
        if arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", norm(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", weights(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", weights(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", weights(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
