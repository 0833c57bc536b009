"""Exact or refused: where tensors and keys go, which cuts each architecture allows, and
what the slicer writes for the families of tests.support.tiny_families (no llama.cpp)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from core import gguf_layout as layout
from core.errors import CutNotAllowedError, SliceError, UnsupportedModelError
from core.gguf_slices import assemble_stage, slice_model
from core.manifest import SHARED, Manifest
from core.types import LayerRange
from tests.support.tiny_families import FAMILIES, write_family_model
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit


def test_tensors_are_placed_by_name_and_unknown_ones_refused() -> None:
    assert layout.tensor_place("llama", "blk.3.attn_q.weight") == layout.BLOCK
    assert layout.tensor_place("llama", "token_embd.weight") == layout.EMBEDDING
    assert layout.tensor_place("starcoder", "position_embd.weight") == layout.EMBEDDING
    for name in ("output_norm.weight", "output_norm.bias", "output.weight", "output.bias"):
        assert layout.tensor_place("qwen2", name) == layout.HEAD
    for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        assert layout.tensor_place("phi3", name) == layout.SHARED
    with pytest.raises(UnsupportedModelError, match=r"gemma3n: tensor 'per_layer_token_embd"):
        layout.tensor_place("gemma3n", "per_layer_token_embd.weight")


def test_keys_have_roles() -> None:
    role = layout.key_role
    assert role("llama", "tokenizer.ggml.tokens") == layout.TOKENIZER
    assert role("llama", "general.name") == layout.COPY
    assert role("llama", "llama.rope.freq_base") == layout.COPY
    assert role("llama", "llama.attention.head_count_kv") == layout.PER_LAYER
    assert role("apertus", "xielu.beta") == layout.PER_LAYER
    assert role("llama", "llama.block_count") == layout.REWRITE
    assert role("deepseek2", "deepseek2.leading_dense_block_count") == layout.REWRITE
    assert role("granite", "granite.embedding_scale") == layout.FIRST_ONLY
    assert role("qwen35", "qwen35.nextn_predict_layers") == layout.REWRITE
    # The published files' layout (gguf-split), not the model's: no piece carries it.
    assert role("llama", "split.count") == layout.DROP
    # A key of another architecture is ignored by this loader, so it is just copied.
    assert role("llama", "qwen2.embedding_scale") == layout.COPY


def test_keys_that_tie_layers_together_are_refused_when_set() -> None:
    layout.check_keys("qwen35", {"qwen35.nextn_predict_layers": 0, "split.count": 1})
    # One MTP block of qwen35 goes to the last stage; more heads, or other archs, refused.
    layout.check_keys("qwen35", {"qwen35.nextn_predict_layers": 1})
    assert layout.mtp_layers("qwen35moe", {"qwen35moe.nextn_predict_layers": 1}) == 1
    with pytest.raises(UnsupportedModelError, match="nextn_predict_layers=2"):
        layout.check_keys("qwen35", {"qwen35.nextn_predict_layers": 2})
    with pytest.raises(UnsupportedModelError, match="nextn_predict_layers=1"):
        layout.check_keys("glm4moe", {"glm4moe.nextn_predict_layers": 1})
    layout.check_keys("llama", {"split.no": 0, "split.count": 3, "split.tensors.count": 9})


@pytest.mark.parametrize(
    ("arch", "n", "meta", "cuts"),
    [
        ("llama", 8, {}, None),
        ("qwen2", 8, {}, None),
        ("smollm3", 10, {}, (0, 4, 8, 10)),
        ("llama4", 8, {}, (0, 4, 8)),
        ("llama4", 24, {"llama4.interleave_moe_layer_step": 3}, (0, 12, 24)),
        ("llama4", 8, {"llama4.attention.sliding_window": 0}, (0, 8)),
        ("gemma2", 8, {}, (0, 8)),
        ("gemma", 6, {}, (0, 6)),
        ("exaone4", 8, {}, None),
        ("exaone4", 64, {}, (0, 64)),
    ],
)
def test_cut_policy_per_architecture(
    arch: str, n: int, meta: dict[str, int], cuts: tuple[int, ...] | None
) -> None:
    policy = layout.cut_policy(arch, n, meta, ["full"] * n)
    assert policy.cuts == cuts
    assert (policy.reason == "") == (cuts is None)


def test_cohere2_stages_start_at_sliding_layers() -> None:
    kinds = ["sliding", "sliding", "sliding", "full"] * 2
    assert layout.cut_policy("cohere2", 8, {}, kinds).cuts == (0, 1, 2, 4, 5, 6, 8)


def test_unknown_architecture_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedModelError, match=r"'rwkv7' has not been checked"):
        layout.cut_policy("rwkv7", 8, {}, ["recurrent"] * 8)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Manifest]]:
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        out[fam] = d, slice_model(write_family_model(d / f"{fam}.gguf", fam), d / "pieces")
    return out


def _tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(str(path)).tensors}


def _stage(fam: tuple[Path, Manifest], a: int, b: int) -> GGUFReader:
    d, m = fam
    return GGUFReader(str(assemble_stage(m, d / "pieces", LayerRange(a, b), d / f"s{a}-{b}.gguf")))


def test_manifests_record_cuts_and_global_tensors(
    families: dict[str, tuple[Path, Manifest]],
) -> None:
    facts = {fam: m.facts for fam, (_, m) in families.items()}
    assert facts["smollm3"].allowed_cuts == (0, 4, 8)
    assert facts["gemma2"].allowed_cuts == (0, 8)
    assert facts["cohere2"].allowed_cuts == (0, 1, 2, 4, 5, 6, 8)
    for fam in ("qwen2", "granite", "phi3", "starcoder", "starcoder2", "olmo2"):
        assert facts[fam].allowed_cuts is None, fam
    assert "output_norm.bias" in facts["starcoder2"].global_tensors
    for fam, (d, m) in families.items():
        assert Manifest.load(d / "pieces") == m
        has_shared = any(p.name == SHARED for p in m.pieces)
        assert has_shared == (fam in ("granite", "phi3")), fam


def test_every_stage_gets_the_shared_rope_tensors(
    families: dict[str, tuple[Path, Manifest]],
) -> None:
    for a, b in [(0, 3), (3, 6), (6, 8)]:
        names = {t.name for t in _stage(families["phi3"], a, b).tensors}
        assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= names
        names = {t.name for t in _stage(families["granite"], a, b).tensors}
        assert "rope_freqs.weight" in names


def test_first_stage_keys_and_neutral_embeddings_on_later_stages(
    families: dict[str, tuple[Path, Manifest]],
) -> None:
    assert "granite.embedding_scale" in _stage(families["granite"], 0, 3).fields
    assert "granite.embedding_scale" not in _stage(families["granite"], 3, 8).fields
    first = {t.name: t for t in _stage(families["starcoder"], 0, 4).tensors}
    assert np.any(np.asarray(first["position_embd.weight"].data) != 0)
    for a, b in [(4, 6), (6, 8)]:
        later = {t.name: t for t in _stage(families["starcoder"], a, b).tensors}
        assert not np.any(np.asarray(later["position_embd.weight"].data))


def test_required_head_tensors_get_placeholders_on_non_last_stages(
    families: dict[str, tuple[Path, Manifest]],
) -> None:
    mid = {t.name: t for t in _stage(families["starcoder2"], 2, 5).tensors}
    assert mid["output_norm.bias"].n_elements == 64
    first = {t.name: t for t in _stage(families["olmo2"], 0, 4).tensors}
    assert first["output.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert first["output.weight"].n_elements == 512 * 64
    mid = {t.name: t for t in _stage(families["olmo2"], 4, 6).tensors}
    assert mid["output.weight"].n_elements == 64


def test_disallowed_cut_is_refused_before_reading_pieces(
    families: dict[str, tuple[Path, Manifest]], tmp_path: Path
) -> None:
    _, m = families["smollm3"]
    with pytest.raises(CutNotAllowedError) as err:
        assemble_stage(m, tmp_path / "nothing-here", LayerRange(0, 3), tmp_path / "s.gguf")
    assert err.value.position == 3 and err.value.allowed == (0, 4, 8)
    assert "RoPE" in str(err.value)
    _, g = families["gemma2"]
    with pytest.raises(CutNotAllowedError, match="sqrt"):
        assemble_stage(g, tmp_path, LayerRange(4, 8), tmp_path / "s.gguf")
    assert isinstance(err.value, SliceError)


def test_old_manifests_without_the_new_fields_allow_every_cut(
    families: dict[str, tuple[Path, Manifest]],
) -> None:
    import json

    _, m = families["qwen2"]
    doc = json.loads(m.to_json())
    del doc["facts"]["allowed_cuts"], doc["facts"]["cut_reason"], doc["facts"]["global_tensors"]
    old = Manifest.from_json(json.dumps(doc))
    assert old.facts.allowed_cuts is None and old.facts.global_tensors == ()
    assert old.facts.cut_allowed(5)


def test_leading_dense_blocks_are_counted_per_stage(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    # Re-write the model with a dense-lead key (meaningless to llama, read by deepseek-likes).
    r = GGUFReader(str(model))
    w = gguf.GGUFWriter(str(tmp_path / "d.gguf"), arch="llama")
    for name, f in r.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    w.add_uint32("llama.leading_dense_block_count", 3)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = slice_model(tmp_path / "d.gguf", tmp_path / "p")
    for (a, b), lead in {(0, 2): 2, (2, 5): 1, (3, 8): 0}.items():
        out = assemble_stage(m, tmp_path / "p", LayerRange(a, b), tmp_path / f"{a}.gguf")
        got = GGUFReader(str(out)).fields["llama.leading_dense_block_count"].contents()
        assert got == lead, (a, b)


def test_an_unknown_global_tensor_is_refused_naming_it(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), arch="llama")
    w.add_block_count(1)
    w.add_embedding_length(4)
    w.add_head_count(1)
    w.add_vocab_size(2)
    w.add_tensor("token_embd.weight", np.zeros((2, 4), np.float32))
    w.add_tensor("cls.weight", np.zeros((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"'cls\.weight'"):
        slice_model(tmp_path / "x.gguf", tmp_path / "out")


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_hybrid_models_allow_every_cut_single_kind_stages_included(arch: str) -> None:
    # The engine runs a stage of recurrent layers only, or attention layers only.
    kinds = ["recurrent", "recurrent", "recurrent", "full"] * 2 + ["recurrent", "full"]
    policy = layout.cut_policy(arch, len(kinds), {}, kinds)
    assert policy.cuts is None and policy.reason == ""
