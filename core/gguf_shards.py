"""A model as published: one GGUF file, or the shards llama.cpp's `gguf-split` writes.

What a shard set looks like (tools/gguf-split/gguf-split.cpp and llama_split_path in
llama.cpp, whose loader reads sets the same way):

- shard i of n (i from 1) is named `<prefix>-%05d-of-%05d.gguf`, all in one folder;
- every shard is a complete GGUF file whose tensor data follow its own header;
- the first shard carries all of the model's metadata; every shard, the first included,
  carries `split.no` (u16, counted from 0), `split.count` (u16) and
  `split.tensors.count` (i32, the tensors of the whole set), and the others nothing else;
- tensors keep the merged file's order: the first shard's, then the second's, ...; with
  `--no-tensor-first-split` the first shard holds metadata and no tensor at all.

`open_source` reads the metadata of the file given (the first shard of a set finds the
others beside it) into a `SourceModel`: the first shard's metadata entries as raw bytes,
and where each tensor's bytes lie, every offset and size checked against its file before
anything is read. Nothing here reads tensor data; core.gguf_stream does, in one pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from core.errors import MissingShardsError, NotFirstShardError, SliceError
from core.gguf_reader import open_gguf

GGUF_MAGIC = b"GGUF"
SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
_SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_PSEUDO_FIELD = "GGUF."  # gguf-py's names for the header's counts, not metadata entries


def shard_name(prefix: str, number: int, count: int) -> str:
    """The file name gguf-split gives shard `number` (counted from 1) of `count`."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def model_stem(path: Path) -> str:
    """The model's name as a file stem: the shard suffix (-00001-of-00003) left off."""
    m = _SHARD_NAME.match(Path(path).name)
    return m.group("prefix") if m else Path(path).stem


def shard_paths(first: Path, count: int) -> tuple[Path, ...]:
    """Every shard of the set whose first shard is `first`, by gguf-split's names."""
    m = _SHARD_NAME.match(first.name)
    if m is None or int(m.group("no")) != 1 or int(m.group("count")) != count:
        raise SliceError(
            f"{first} is the first of {count} shards (split.no 0) but is not named as "
            f"gguf-split names it ({shard_name('NAME', 1, count)}), so its other shards "
            "cannot be found: rename the shards as gguf-split wrote them"
        )
    prefix = m.group("prefix")
    return tuple(first.with_name(shard_name(prefix, i, count)) for i in range(1, count + 1))


@dataclass(frozen=True)
class TensorSpan:
    """One tensor of the source: its description and where its bytes lie."""

    name: str
    dims: tuple[int, ...]
    """ggml's ne order, as in the file."""
    ggml_type: int
    n_bytes: int
    shard: int
    """Index into SourceModel.files."""
    offset: int
    """Absolute offset of the first byte in that file."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class SourceModel:
    """The metadata of a model, merged over its shards; tensor data are not read."""

    files: tuple[SourceFile, ...]
    architecture: str
    alignment: int
    """Data alignment of the first shard: general.alignment, or GGUF's default 32."""
    kv: tuple[tuple[str, bytes], ...]
    """The first shard's metadata entries in file order, each as its raw bytes (key,
    type and value) — general.architecture and split.* included."""
    tensors: tuple[TensorSpan, ...]
    """Every tensor of the set in order: the first shard's, then the second's, ..."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _open(path: Path) -> GGUFReader:
    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            raise SliceError(
                f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'): give a "
                "model in GGUF format, e.g. converted with llama.cpp's convert_hf_to_gguf.py"
            )
        reader = open_gguf(path)
    except FileNotFoundError:
        raise SliceError(f"no file at {path}") from None
    except OSError as exc:
        raise SliceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    # gguf-py reports a file that is not a GGUF (or a damaged one) by whatever its parser
    # trips on first: bad magic, a short read, a length beyond the file.
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise SliceError(f"{path} is a damaged or truncated GGUF file ({exc})") from exc
    if reader.byte_order != "I":
        raise SliceError(f"{path} is a big-endian GGUF; Sangama reads little-endian ones")
    return reader


def _scalar(reader: GGUFReader, key: str) -> int | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    if not isinstance(value, int) or isinstance(value, bool):
        raise SliceError(f"{key} is not an integer ({value!r})")
    return value


def _split_of(reader: GGUFReader) -> tuple[int, int]:
    """(split.no, split.count); (0, 1) for a file that is not one of several shards."""
    count = _scalar(reader, SPLIT_COUNT) or 0
    if count <= 1:  # a merged file keeps split.count 0 (gguf-split --merge)
        return 0, 1
    return _scalar(reader, SPLIT_NO) or 0, count


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _spans(reader: GGUFReader, shard: int, path: Path, size: int) -> list[TensorSpan]:
    """The file's tensors, each checked to lie inside it where llama.cpp would look: one
    after the other in header order, each padded to the alignment (gguf.cpp refuses any
    other layout), so a hostile header cannot send a read beyond the file."""
    spans = []
    expected = 0
    for t in reader.tensors:
        relative = int(t.data_offset) - int(reader.data_offset)
        n_bytes = int(t.n_bytes)
        if relative != expected:
            raise SliceError(
                f"{path}: tensor {t.name!r} has data offset {relative}, expected {expected} "
                "(tensor data must follow the header's order, as llama.cpp requires)"
            )
        if int(t.data_offset) + n_bytes > size:
            raise SliceError(
                f"{path}: tensor {t.name!r} ends at byte {int(t.data_offset) + n_bytes}, "
                f"beyond the file's {size} bytes (truncated download?)"
            )
        expected += _pad(n_bytes, reader.alignment)
        dims = tuple(int(d) for d in t.shape)
        spans.append(
            TensorSpan(t.name, dims, int(t.tensor_type), n_bytes, shard, int(t.data_offset))
        )
    return spans


def _raw_kv(reader: GGUFReader) -> tuple[tuple[str, bytes], ...]:
    """Every metadata entry as the bytes it occupies in the file (key, type, value)."""
    out = []
    for name, field in reader.fields.items():
        if name.startswith(_PSEUDO_FIELD):
            continue
        n = sum(int(p.nbytes) for p in field.parts)
        out.append((name, bytes(reader.data[field.offset : field.offset + n])))
    return tuple(out)


def _check_set(first: Path, count: int) -> tuple[Path, ...]:
    paths = shard_paths(first, count)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise MissingShardsError(first, count, tuple(missing))
    return paths


def open_shards(path: Path) -> tuple[list[GGUFReader], tuple[Path, ...]]:
    """The readers of the model at `path` and of its other shards, each checked to be the
    shard its name says. NotFirstShardError for a shard other than the first,
    MissingShardsError when shards of the set are not beside it."""
    path = Path(path)
    first = _open(path)
    no, count = _split_of(first)
    if count == 1:
        return [first], (path,)
    if no != 0:
        m = _SHARD_NAME.match(path.name)
        name = shard_name(m.group("prefix"), 1, count) if m else "the shard whose split.no is 0"
        raise NotFirstShardError(
            f"{path} is shard {no + 1} of {count} of a split GGUF (gguf-split): pass the "
            f"first shard ({name}); the others are found beside it"
        )
    paths = _check_set(path, count)
    readers = [first]
    for i, p in enumerate(paths[1:], start=1):
        reader = _open(p)
        if _split_of(reader) != (i, count):
            raise SliceError(
                f"{p} is not shard {i + 1} of {count} of {path.name}'s set "
                f"(its split.no/split.count say {_split_of(reader)}): the shards do not match"
            )
        readers.append(reader)
    return readers, paths


def open_source(path: Path) -> tuple[SourceModel, GGUFReader]:
    """The source model at `path`, and a reader of its metadata whose `tensors` are those
    of every shard (what core.gguf_slices.read_facts reads). The reader's mapping is
    only read for metadata; drop it before copying tensor data."""
    readers, paths = open_shards(path)
    spans: list[TensorSpan] = []
    files = []
    for i, (reader, p) in enumerate(zip(readers, paths, strict=True)):
        st = os.stat(p)
        files.append(SourceFile(p, st.st_size, st.st_mtime_ns))
        spans.extend(_spans(reader, i, p, st.st_size))
    merged = readers[0]
    declared = _scalar(merged, SPLIT_TENSORS_COUNT)
    if len(readers) > 1 and declared is not None and declared != len(spans):
        raise SliceError(
            f"{path}: the shards hold {len(spans)} tensors, split.tensors.count says {declared}"
        )
    names = [s.name for s in spans]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})[:3]
        raise SliceError(f"{path}: tensors named more than once across shards: {dup}")
    arch = _field_value(merged.fields, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise SliceError(f"{path} has no general.architecture, so it is not a model GGUF")
    # read_facts wants every tensor of the model: the first shard's reader, given all.
    merged.tensors = [t for r in readers for t in r.tensors]
    source = SourceModel(tuple(files), arch, int(merged.alignment), _raw_kv(merged), tuple(spans))
    return source, merged


def _field_value(fields: Mapping[str, Any], key: str) -> Any:
    field = fields.get(key)
    return None if field is None else field.contents()
