"""Slicing a model into pieces, the manifest, and assembling stage files from pieces."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from gguf import GGUFReader

from core.errors import PieceCorruptError, SliceError
from core.gguf_slices import assemble_stage, layer_kinds, slice_model
from core.manifest import EMBEDDING, HEAD, Manifest, block_piece_name, sha256_file
from core.types import LayerRange

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sliced(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    out = tmp_path_factory.mktemp("pieces")
    return out, slice_model(tiny_llama, out)


def _value(reader: GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_slice_writes_one_piece_per_block_plus_embedding_and_head(
    sliced: tuple[Path, Manifest],
) -> None:
    out, manifest = sliced
    names = [p.name for p in manifest.pieces]
    assert names == [EMBEDDING, *(block_piece_name(i) for i in range(8)), HEAD]
    for p in manifest.pieces:
        path = out / p.file
        assert path.stat().st_size == p.size
        assert sha256_file(path) == p.sha256
    assert Manifest.load(out) == manifest


def test_manifest_facts_describe_the_model(sliced: tuple[Path, Manifest]) -> None:
    f = sliced[1].facts
    assert (f.architecture, f.n_layer, f.n_embd, f.n_vocab) == ("llama", 8, 64, 512)
    assert f.layer_kinds == ("full",) * 8
    # f16 K and V: 2 bytes x 2 x n_head_kv(2) x head_dim(16)
    assert f.kv_bytes_per_token_per_layer == (128,) * 8
    assert len(set(f.bytes_per_layer)) == 1 and f.bytes_per_layer[0] > 0
    assert f.embedding_bytes == 512 * 64 * 4
    assert f.head_bytes == 64 * 4 + 512 * 64 * 4
    assert f.tied_output is False


def test_pieces_for_each_position_in_the_chain(sliced: tuple[Path, Manifest]) -> None:
    m = sliced[1]
    assert [p.name for p in m.pieces_for(LayerRange(0, 3))] == [
        EMBEDDING,
        "blk.000",
        "blk.001",
        "blk.002",
    ]
    assert [p.name for p in m.pieces_for(LayerRange(3, 5))] == ["blk.003", "blk.004"]
    assert [p.name for p in m.pieces_for(LayerRange(6, 8))] == [
        EMBEDDING,
        "blk.006",
        "blk.007",
        HEAD,
    ]
    with pytest.raises(SliceError):
        m.pieces_for(LayerRange(6, 9))


@pytest.mark.parametrize("cuts", [[0, 3, 6, 8], [0, 1, 7, 8], [0, 8]])
def test_assembled_stages_hold_their_blocks_renumbered(
    sliced: tuple[Path, Manifest], tmp_path: Path, cuts: list[int]
) -> None:
    pieces, manifest = sliced
    for layers in LayerRange.from_cuts(cuts):
        r = GGUFReader(
            str(assemble_stage(manifest, pieces, layers, tmp_path / f"{layers.start}.gguf"))
        )
        assert _value(r, "llama.block_count") == len(layers)
        assert _value(r, "sangama.layer_start") == layers.start
        blocks = {t.name.split(".")[1] for t in r.tensors if t.name.startswith("blk.")}
        assert blocks == {str(i) for i in range(len(layers))}
        tensors = {t.name: t for t in r.tensors}
        first, last = layers.start == 0, layers.stop == 8
        assert ("output.weight" in tensors) == last
        if not first and not last:
            assert _value(r, "tokenizer.ggml.model") == "none"
            assert _value(r, "llama.vocab_size") == 1
            assert tensors["token_embd.weight"].n_elements == 64
        else:
            assert tensors["token_embd.weight"].n_elements == 512 * 64


def test_stage_blocks_are_byte_copies(
    sliced: tuple[Path, Manifest], tiny_llama: Path, tmp_path: Path
) -> None:
    pieces, manifest = sliced
    stage = GGUFReader(str(assemble_stage(manifest, pieces, LayerRange(3, 6), tmp_path / "s.gguf")))
    source = {t.name: t for t in GGUFReader(str(tiny_llama)).tensors}
    for t in stage.tensors:
        if t.name.startswith("blk."):
            _, i, rest = t.name.split(".", 2)
            assert bytes(t.data) == bytes(source[f"blk.{int(i) + 3}.{rest}"].data)


def test_flipped_byte_is_refused_naming_the_piece(
    sliced: tuple[Path, Manifest], tmp_path: Path
) -> None:
    pieces, manifest = sliced
    copy = tmp_path / "pieces"
    copy.mkdir()
    for p in pieces.iterdir():
        if p.is_file():
            (copy / p.name).write_bytes(p.read_bytes())
    victim = copy / manifest.piece("blk.004").file
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(PieceCorruptError) as err:
        assemble_stage(manifest, copy, LayerRange(3, 6), tmp_path / "s.gguf")
    assert err.value.piece == "blk.004" and "sha256" in str(err.value)
    assert not (tmp_path / "s.gguf").exists()
    # Stages that do not need the damaged piece still assemble.
    assemble_stage(manifest, copy, LayerRange(0, 3), tmp_path / "ok.gguf")


def test_missing_or_truncated_piece_is_named(sliced: tuple[Path, Manifest], tmp_path: Path) -> None:
    pieces, manifest = sliced
    copy = tmp_path / "pieces"
    copy.mkdir()
    for p in manifest.pieces_for(LayerRange(6, 8)):
        (copy / p.file).write_bytes((pieces / p.file).read_bytes())
    (copy / manifest.piece(HEAD).file).unlink()
    with pytest.raises(PieceCorruptError, match=r"'head'.*missing"):
        assemble_stage(manifest, copy, LayerRange(6, 8), tmp_path / "s.gguf")
    (copy / manifest.piece(HEAD).file).write_bytes(b"short")
    with pytest.raises(PieceCorruptError, match=r"'head'.*size"):
        assemble_stage(manifest, copy, LayerRange(6, 8), tmp_path / "s.gguf")


def test_malformed_manifest_is_a_slice_error() -> None:
    with pytest.raises(SliceError):
        Manifest.from_json("{}")
    with pytest.raises(SliceError):
        Manifest.from_json('{"format": "sangama-manifest/1", "facts": {}}')
    with pytest.raises(SliceError):
        Manifest.from_json("not json")


def test_slicing_a_non_gguf_file_is_a_slice_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"definitely not a gguf file")
    with pytest.raises(SliceError):
        slice_model(bad, tmp_path / "out")


def _metadata_only(path: Path, arch: str, n_layer: int, extra: dict[str, object]) -> GGUFReader:
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(n_layer)
    for key, value in extra.items():
        if isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_uint32(key, int(value))  # type: ignore[call-overload]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFReader(str(path))


def test_layer_kinds_follow_llama_cpp_defaults_and_explicit_arrays(tmp_path: Path) -> None:
    gemma = _metadata_only(
        tmp_path / "g.gguf", "gemma3", 18, {"gemma3.attention.sliding_window": 512}
    )
    kinds = layer_kinds(gemma)
    assert [i for i, k in enumerate(kinds) if k == "full"] == [5, 11, 17]
    explicit = _metadata_only(
        tmp_path / "e.gguf",
        "gemma3",
        4,
        {
            "gemma3.attention.sliding_window": 512,
            "gemma3.attention.sliding_window_pattern": [True, False, True, True],
        },
    )
    assert layer_kinds(explicit) == ["sliding", "full", "sliding", "sliding"]
    qwen = _metadata_only(tmp_path / "q.gguf", "qwen35", 8, {"qwen35.full_attention_interval": 4})
    assert layer_kinds(qwen) == ["recurrent"] * 3 + ["full"] + ["recurrent"] * 3 + ["full"]
