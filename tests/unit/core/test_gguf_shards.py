"""Slicing a model as published: the shards llama.cpp's gguf-split writes, both layouts,
give the very pieces the merged file gives; a shard alone, or the wrong one, is refused
saying what to pass."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from core.errors import MissingShardsError, NotFirstShardError, SliceError
from core.gguf_shards import model_stem, open_shards, shard_name, shard_paths
from core.gguf_slices import slice_model
from core.manifest import Manifest
from tests.support.gguf_fixtures import merged_with_split_keys, split_gguf, write_rich_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    d = tmp_path_factory.mktemp("rich")
    model = write_rich_model(d / "rich.gguf")
    return model, slice_model(model, d / "pieces")


def _piece_bytes(out: Path, manifest: Manifest) -> dict[str, bytes]:
    return {p.file: (out / p.file).read_bytes() for p in manifest.pieces}


@pytest.mark.parametrize("no_tensor_first", [False, True], ids=["spread", "metadata-first"])
@pytest.mark.parametrize("per_shard", [1, 4, 9])
def test_shards_slice_into_the_merged_files_pieces(
    rich: tuple[Path, Manifest], tmp_path: Path, no_tensor_first: bool, per_shard: int
) -> None:
    model, merged = rich
    shards = split_gguf(model, tmp_path, "rich", per_shard, no_tensor_first)
    assert len(shards) > 2
    if no_tensor_first:
        assert GGUFReader(str(shards[0])).tensors == []
    manifest = slice_model(shards[0], tmp_path / "pieces")
    assert manifest.facts == merged.facts  # the name too: the shard suffix left off
    assert manifest.pieces == merged.pieces  # sha256 and size of every piece
    assert _piece_bytes(tmp_path / "pieces", manifest) == _piece_bytes(
        model.parent / "pieces", merged
    )
    whole = b"".join(s.read_bytes() for s in shards)
    assert manifest.source_sha256 == hashlib.sha256(whole).hexdigest()
    assert manifest.source_size == len(whole)


def test_gguf_py_shards_slice_the_same(rich: tuple[Path, Manifest], tmp_path: Path) -> None:
    """gguf-py's own splitting writer (convert_hf_to_gguf --split-max-tensors) agrees."""
    model, merged = rich
    r = GGUFReader(str(model))
    w = gguf.GGUFWriter(str(tmp_path / "py.gguf"), arch="llama", split_max_tensors=5)
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = -(-len(r.tensors) // 5)
    first = tmp_path / f"py-00001-of-{n:05d}.gguf"
    assert first.is_file() and n > 2
    manifest = slice_model(first, tmp_path / "pieces")
    assert manifest.pieces == merged.pieces


def test_a_merged_file_keeping_split_keys_slices_like_the_original(
    rich: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, merged = rich
    again = merged_with_split_keys(model, tmp_path / "merged.gguf")
    assert GGUFReader(str(again)).fields["split.tensors.count"].contents() > 0
    assert slice_model(again, tmp_path / "pieces").pieces == merged.pieces


def test_pieces_carry_no_split_keys(rich: tuple[Path, Manifest], tmp_path: Path) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    manifest = slice_model(shards[0], tmp_path / "pieces")
    for p in manifest.pieces:
        keys = GGUFReader(str(tmp_path / "pieces" / p.file)).fields
        assert not [k for k in keys if k.startswith("split.")], p.name


def test_a_missing_shard_is_named(rich: tuple[Path, Manifest], tmp_path: Path) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    shards[2].unlink()
    shards[-1].unlink()
    with pytest.raises(MissingShardsError) as err:
        slice_model(shards[0], tmp_path / "pieces")
    assert err.value.missing == (shards[2], shards[-1])
    text = str(err.value)
    assert f"split into {len(shards)} files" in text
    assert shards[2].name in text and shards[-1].name in text and "missing" in text
    assert not (tmp_path / "pieces").exists()  # refused before anything is written


def test_a_shard_alone_is_refused(rich: tuple[Path, Manifest], tmp_path: Path) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(shards[0], alone / shards[0].name)
    with pytest.raises(MissingShardsError, match=f"{len(shards) - 1} of the others are missing"):
        slice_model(alone / shards[0].name, tmp_path / "pieces")


def test_a_later_shard_says_to_pass_the_first(rich: tuple[Path, Manifest], tmp_path: Path) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    with pytest.raises(NotFirstShardError) as err:
        slice_model(shards[1], tmp_path / "pieces")
    assert f"shard 2 of {len(shards)}" in str(err.value)
    assert f"pass the first shard ({shards[0].name})" in str(err.value)


def test_a_shard_whose_metadata_contradicts_its_name_is_refused(
    rich: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    shards[1].write_bytes(shards[2].read_bytes())  # shard 3's content under shard 2's name
    with pytest.raises(SliceError, match=r"rich-00002-of-.*is not shard 2"):
        slice_model(shards[0], tmp_path / "pieces")


def test_a_renamed_first_shard_cannot_find_its_set(
    rich: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, _ = rich
    shards = split_gguf(model, tmp_path, "rich", 4)
    renamed = shards[0].rename(tmp_path / "model.gguf")
    with pytest.raises(SliceError, match="not named as gguf-split names it"):
        slice_model(renamed, tmp_path / "pieces")


def test_shard_names_follow_gguf_split() -> None:
    assert shard_name("m", 1, 3) == "m-00001-of-00003.gguf"
    assert model_stem(Path("/x/Qwen3-Q4_K_M-00001-of-00004.gguf")) == "Qwen3-Q4_K_M"
    assert model_stem(Path("/x/plain.gguf")) == "plain"
    paths = shard_paths(Path("/d/m-00001-of-00003.gguf"), 3)
    assert [p.name for p in paths] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_a_single_file_is_its_own_set(rich: tuple[Path, Manifest]) -> None:
    readers, paths = open_shards(rich[0])
    assert paths == (rich[0],) and len(readers) == 1
