"""core.model_inputs: cut points suggested and checked against a model's own boundaries,
and files judged by their header before anything is sliced or loaded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from core.errors import CutsError, NotAModelError
from core.model_inputs import read_header, stage_layers, stage_ranges, suggest_cuts
from core.types import LayerRange, ModelFacts

pytestmark = pytest.mark.unit

FACTS = ModelFacts(
    architecture="llama",
    n_layer=30,
    n_embd=64,
    n_vocab=512,
    n_ctx_train=2048,
    layer_kinds=("full",) * 30,
    bytes_per_layer=(1,) * 30,
    kv_bytes_per_token_per_layer=(1,) * 30,
    embedding_bytes=1,
    head_bytes=1,
    tied_output=True,
    name="SmolLM2-135M",
)
HYBRID = replace(
    FACTS, name="hybrid", allowed_cuts=(0, 4, 8, 12, 30), cut_reason="full attention ends"
)


def test_suggested_cuts_are_even_where_any_cut_is_allowed() -> None:
    assert suggest_cuts(FACTS) == [0, 10, 20, 30]
    assert suggest_cuts(FACTS, 2) == [0, 15, 30]


def test_suggested_cuts_fall_on_allowed_boundaries_only() -> None:
    cuts = suggest_cuts(HYBRID, 3)
    assert cuts[0] == 0 and cuts[-1] == 30 and len(cuts) == 4
    assert set(cuts) <= set(HYBRID.allowed_cuts or ())
    # A model cut only whole gets one stage, not a refusal.
    assert suggest_cuts(replace(FACTS, allowed_cuts=(0, 30)), 3) == [0, 30]


def test_stage_ranges_takes_cuts_that_fit() -> None:
    assert stage_ranges(HYBRID, [0, 8, 30]) == [LayerRange(0, 8), LayerRange(8, 30)]


def test_cuts_outside_the_model_name_its_layers_and_a_fix() -> None:
    with pytest.raises(CutsError) as refused:
        stage_ranges(FACTS, [0, 5, 8, 9])
    assert str(refused.value) == (
        "cuts must run from 0 to 30 for SmolLM2-135M (30 layers); got 0,5,8,9 "
        "— e.g. --cuts 0,10,20,30"
    )
    assert refused.value.example == "0,10,20,30"


def test_a_forbidden_cut_lists_the_allowed_ones() -> None:
    with pytest.raises(CutsError) as refused:
        stage_ranges(HYBRID, [0, 6, 30])
    message = str(refused.value)
    assert "cannot cut at layer 6" in message and "allows cuts only at 0,4,8,12,30" in message
    assert "[full attention ends]" in message
    assert refused.value.allowed == (0, 4, 8, 12, 30)
    stage_ranges(HYBRID, [int(c) for c in refused.value.example.split(",")])  # the fix works


def test_stage_layers_refuses_beyond_the_model_and_forbidden_ends() -> None:
    assert stage_layers(HYBRID, LayerRange(4, 8)) == LayerRange(4, 8)
    with pytest.raises(CutsError, match=r"--layers 0:31 is outside hybrid \(30 layers\)"):
        stage_layers(HYBRID, LayerRange(0, 31))
    with pytest.raises(CutsError, match="cannot start or end at layer 5,9"):
        stage_layers(HYBRID, LayerRange(5, 9))


def test_a_truncated_gguf_is_damaged_not_a_crash(tiny_llama: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_llama.read_bytes()[:40])
    with pytest.raises(NotAModelError, match="damaged or truncated GGUF"):
        read_header(cut)


def test_an_adapter_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "lora.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.type", "adapter")
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((2, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotAModelError, match="adapter"):
        read_header(path)


def test_a_whole_model_header(tiny_llama: Path) -> None:
    header = read_header(tiny_llama)
    assert (header.architecture, header.split_index, header.split_count) == ("llama", 0, 0)
