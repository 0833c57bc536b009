"""Recurrent state and MTP cache sizes from metadata, as llama.cpp allocates them."""

from __future__ import annotations

import pytest

from core.errors import SliceError
from core.model_sizes import (
    RECURRENT_SNAPSHOTS,
    mtp_kv_bytes_per_token,
    recurrent_state_bytes,
    recurrent_state_values,
)

pytestmark = pytest.mark.unit

QWEN35MOE_397B = {
    "qwen35moe.ssm.conv_kernel": 4,
    "qwen35moe.ssm.inner_size": 8192,
    "qwen35moe.ssm.state_size": 128,
    "qwen35moe.ssm.group_count": 16,
    "qwen35moe.embedding_length": 4096,
    "qwen35moe.attention.head_count": 32,
    "qwen35moe.attention.head_count_kv": 2,
    "qwen35moe.attention.key_length": 256,
    "qwen35moe.attention.value_length": 256,
}


def test_gated_delta_net_state_of_qwen35_397b() -> None:
    # n_embd_r: (d_conv - 1) x (d_inner + 2 n_group d_state); n_embd_s: d_state x d_inner.
    assert recurrent_state_values("qwen35moe", QWEN35MOE_397B) == (36_864, 1_048_576)
    kinds = ("recurrent", "recurrent", "recurrent", "full")
    assert recurrent_state_bytes("qwen35moe", QWEN35MOE_397B, kinds) == (4_341_760,) * 3 + (0,)


def test_attention_only_architectures_hold_no_state() -> None:
    assert recurrent_state_values("llama", QWEN35MOE_397B) == (0, 0)
    assert recurrent_state_bytes("llama", {}, ("full", "full")) == (0, 0)


def test_the_mtp_block_caches_k_and_v_per_position() -> None:
    assert mtp_kv_bytes_per_token("qwen35moe", QWEN35MOE_397B, 60, 1) == 2 * 2 * (256 + 256)
    assert mtp_kv_bytes_per_token("qwen35moe", QWEN35MOE_397B, 60, 0) == 0
    per_layer = {**QWEN35MOE_397B, "qwen35moe.attention.head_count_kv": [2] * 60 + [4]}
    assert mtp_kv_bytes_per_token("qwen35moe", per_layer, 60, 1) == 2 * 4 * 512


@pytest.mark.parametrize("bad", [-1, "4", 2.5, True, None])
def test_hostile_sizes_are_slice_errors(bad: object) -> None:
    if bad is None:  # absent: no state, rather than a guess
        meta = {k: v for k, v in QWEN35MOE_397B.items() if "conv_kernel" not in k}
        assert recurrent_state_values("qwen35moe", meta)[0] == 0
        return
    with pytest.raises(SliceError):
        recurrent_state_values("qwen35moe", {**QWEN35MOE_397B, "qwen35moe.ssm.inner_size": bad})


def test_placement_counts_the_snapshots_workers_keep() -> None:
    engine = pytest.importorskip("core.llama_engine")  # loads llama.cpp's bindings
    assert engine.EngineConfig().n_rs_seq == RECURRENT_SNAPSHOTS
