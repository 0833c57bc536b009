"""A GGUF's metadata and tensor table read from its header alone, and the model facts and
manifest that follow from them, without reading (or having) a byte of tensor data.

What it is for: placing a model that is too large to download just to plan it. A
"header-only" GGUF (the header and tensor table of the real file, with the data section
absent or sparse) is enough for `read_facts` and for piece sizes, so placement can be
tried on the true shapes and quant types of a 200 GB model in milliseconds.

The header is untrusted input: every count and size read from it is bounded before it
is used (a kilobyte file must not make us allocate gigabytes), strings must be UTF-8,
tensor types must be ones ggml knows, tensor extents must be aligned, in range and not
overlap, and nothing is read past `max_header_bytes`. Violations raise
`GgufHeaderError` naming what was wrong.

A manifest built here (`manifest_from_header`) carries facts identical to slicing the
full file, but its pieces were never written: each piece's `size` is the tensor data it
holds (every tensor padded to the file's alignment, without the piece's own metadata),
and its `sha256` is `NOT_COMPUTED` ("not-computed", never a digest), so `verify_piece`
refuses every piece and no worker can mistake such a manifest for a sliced model.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, cast

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from core import gguf_layout as layout
from core.errors import SliceError
from core.gguf_slices import read_facts
from core.manifest import (
    BLOCK,
    EMBEDDING,
    HEAD,
    MTP,
    SHARED,
    Manifest,
    PieceInfo,
    block_piece_name,
)
from core.types import ModelFacts

__all__ = [
    "NOT_COMPUTED",
    "GgufHeader",
    "GgufHeaderError",
    "HeaderLimits",
    "TensorEntry",
    "facts_from_header",
    "manifest_from_header",
    "parse_header",
    "read_header",
    "write_manifest_only",
]

GGUF_MAGIC = b"GGUF"
NOT_COMPUTED = "not-computed"
"""The sha256 of a piece (and of the source) in a manifest built from a header alone."""
DEFAULT_ALIGNMENT = 32
"""GGUF's data alignment when `general.alignment` is absent."""
MAX_DIMS = 4
"""GGML_MAX_DIMS: ggml tensors have at most four dimensions."""

_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")

# GGUF value types (gguf-py's GGUFValueType): struct format of the scalar ones.
_STRING, _ARRAY = 8, 9
_SCALARS: Mapping[int, str] = {
    0: "B",  # uint8
    1: "b",  # int8
    2: "H",  # uint16
    3: "h",  # int16
    4: "I",  # uint32
    5: "i",  # int32
    6: "f",  # float32
    7: "?",  # bool
    10: "Q",  # uint64
    11: "q",  # int64
    12: "d",  # float64
}


class GgufHeaderError(SliceError):
    """A GGUF header is malformed, truncated, or exceeds a limit set against hostile input."""


@dataclass(frozen=True)
class HeaderLimits:
    """Bounds on what a header may ask us to read or allocate. The defaults hold every
    published model we know of with room to spare (Qwen3.5-397B: ~1,300 tensors, a
    248,320-token vocabulary, a header of ~15 MB with its tokenizer)."""

    max_header_bytes: int = 256 << 20
    max_kv: int = 1 << 16
    max_tensors: int = 1 << 16
    max_string_bytes: int = 1 << 20
    max_array_items: int = 1 << 22
    """4M items (a vocabulary's tokens and merges are well under a million each): a
    list that long costs ~150 MB of Python objects at worst."""
    max_tensor_bytes: int = 1 << 44
    """16 TiB: no single tensor is larger; bounds the arithmetic on hostile shapes."""


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table."""

    name: str
    shape: tuple[int, ...]
    """ggml's ne order, innermost first (rows of shape[0] values), as the file stores it."""
    ggml_type: int
    offset: int
    """From the start of the data section."""
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: Mapping[str, Any]
    """Key -> value: int, float, bool, str, or a list of those (read-only mapping)."""
    tensors: tuple[TensorEntry, ...]
    alignment: int
    data_offset: int
    """Where the data section starts in the file (the header's end, aligned)."""

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GgufHeaderError("GGUF has no general.architecture")
        return arch

    @property
    def data_bytes(self) -> int:
        """The data section's length, as the tensor table lays it out."""
        return max((t.offset + t.n_bytes for t in self.tensors), default=0)


class _Cursor:
    """Reads a little-endian header from a binary stream, never past `limit` bytes."""

    def __init__(self, stream: IO[bytes], limits: HeaderLimits) -> None:
        self._stream = stream
        self._limits = limits
        self.position = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.position + n > self._limits.max_header_bytes:
            raise GgufHeaderError(
                f"header larger than {self._limits.max_header_bytes} bytes "
                f"(reading {n} bytes at offset {self.position})"
            )
        data = self._stream.read(n)
        if len(data) != n:
            raise GgufHeaderError(f"truncated header: {n} bytes wanted at offset {self.position}")
        self.position += n
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str, bound: int) -> int:
        n = int(self.scalar("Q"))
        if n > bound:
            raise GgufHeaderError(f"{what} {n} exceeds the limit of {bound}")
        return n

    def string(self) -> str:
        n = self.count("string length", self._limits.max_string_bytes)
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GgufHeaderError(f"string at offset {self.position - n} is not UTF-8") from exc

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise GgufHeaderError(f"unknown value type {vtype} at offset {self.position - 4}")
        return self.scalar(fmt)

    def array(self) -> list[Any]:
        itype = int(self.scalar("I"))
        n = self.count("array length", self._limits.max_array_items)
        if itype == _STRING:
            return [self.string() for _ in range(n)]
        fmt = _SCALARS.get(itype)
        if fmt is None:
            # Nested arrays are legal GGUF, but no loader we serve reads one: refuse them
            # rather than recurse on input we do not trust.
            raise GgufHeaderError(f"array of value type {itype} is not supported")
        return list(struct.unpack(f"<{n}{fmt}", self.take(n * struct.calcsize(fmt))))


def _tensor_bytes(name: str, shape: tuple[int, ...], ggml_type: int, limits: HeaderLimits) -> int:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as exc:
        raise GgufHeaderError(f"tensor {name!r} has unknown ggml type {ggml_type}") from exc
    if shape[0] % block:
        raise GgufHeaderError(
            f"tensor {name!r}: row length {shape[0]} is not a multiple of the "
            f"{GGMLQuantizationType(ggml_type).name} block of {block}"
        )
    # Each dimension is checked first, so the product below stays a small integer.
    elements = math.prod(shape)
    n_bytes = elements // block * type_size
    if n_bytes > limits.max_tensor_bytes:
        raise GgufHeaderError(f"tensor {name!r} of {n_bytes} bytes exceeds the limit")
    return n_bytes


def _tensor_entry(cur: _Cursor, limits: HeaderLimits) -> TensorEntry:
    name = cur.string()
    n_dims = int(cur.scalar("I"))
    if not 1 <= n_dims <= MAX_DIMS:
        raise GgufHeaderError(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
    shape = tuple(int(cur.scalar("Q")) for _ in range(n_dims))
    if any(not 1 <= d <= limits.max_tensor_bytes for d in shape):
        raise GgufHeaderError(f"tensor {name!r} has an impossible shape {shape}")
    ggml_type = int(cur.scalar("I"))
    offset = int(cur.scalar("Q"))
    n_bytes = _tensor_bytes(name, shape, ggml_type, limits)
    return TensorEntry(name, shape, ggml_type, offset, n_bytes)


def _check_layout(tensors: tuple[TensorEntry, ...], alignment: int) -> None:
    names = set()
    end = 0
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.name in names:
            raise GgufHeaderError(f"tensor {t.name!r} appears twice")
        names.add(t.name)
        if t.offset % alignment:
            raise GgufHeaderError(f"tensor {t.name!r} at offset {t.offset} is not aligned")
        if t.offset < end:
            raise GgufHeaderError(f"tensor {t.name!r} overlaps the tensor before it")
        end = t.offset + t.n_bytes


def parse_header(stream: IO[bytes], limits: HeaderLimits = HeaderLimits()) -> GgufHeader:
    """Read a GGUF header (metadata and tensor table) from the start of `stream`; the
    data section is never read and may be missing."""
    cur = _Cursor(stream, limits)
    if cur.take(4) != GGUF_MAGIC:
        raise GgufHeaderError("not a GGUF file (bad magic)")
    version = int(cur.scalar("I"))
    if version not in (2, 3):
        # Version 1 used 32-bit counts; big-endian files show up as a huge version.
        raise GgufHeaderError(f"unsupported GGUF version {version} (2 or 3, little-endian)")
    n_tensors = cur.count("tensor count", limits.max_tensors)
    n_kv = cur.count("metadata count", limits.max_kv)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        if key in metadata:
            raise GgufHeaderError(f"metadata key {key!r} appears twice")
        metadata[key] = cur.value(int(cur.scalar("I")))
    tensors = tuple(_tensor_entry(cur, limits) for _ in range(n_tensors))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or not 1 <= alignment <= 1 << 20
        or alignment & (alignment - 1)
    ):
        raise GgufHeaderError(f"general.alignment {alignment!r} is not a power of two")
    _check_layout(tensors, alignment)
    data_offset = -(-cur.position // alignment) * alignment
    return GgufHeader(version, MappingProxyType(metadata), tensors, alignment, data_offset)


def read_header(path: Path, limits: HeaderLimits = HeaderLimits()) -> GgufHeader:
    try:
        with open(path, "rb") as f:
            return parse_header(f, limits)
    except OSError as exc:
        raise GgufHeaderError(f"cannot read {path}: {exc}") from exc


# ---------------------------------------------------------------- facts and manifest


@dataclass(frozen=True)
class _Field:
    """What `read_facts` asks of a gguf-py ReaderField: its value, and its length."""

    value: Any

    def contents(self) -> Any:
        return self.value

    @property
    def data(self) -> range:
        # gguf-py's `data` indexes one part per element: its length is the array's.
        return range(len(self.value) if isinstance(self.value, list) else 1)


@dataclass(frozen=True)
class _HeaderAsReader:
    """The header seen through the part of gguf-py's GGUFReader that `read_facts` uses,
    so facts come from one code path whether or not the data is there."""

    header: GgufHeader
    fields: dict[str, _Field] = field(init=False)
    tensors: tuple[TensorEntry, ...] = field(init=False)

    def __post_init__(self) -> None:
        fields = {k: _Field(v) for k, v in self.header.metadata.items()}
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "tensors", self.header.tensors)


def facts_from_header(header: GgufHeader, name: str = "") -> ModelFacts:
    """The same ModelFacts `read_facts` gives for the full file."""
    try:
        return read_facts(cast(GGUFReader, _HeaderAsReader(header)), name)
    except (TypeError, ValueError, IndexError) as exc:
        # read_facts trusts the file's types; a hostile header can break that trust.
        raise GgufHeaderError(f"metadata does not describe a model: {exc}") from exc


def _pieces(header: GgufHeader, facts: ModelFacts) -> Iterator[tuple[str, str, int | None, int]]:
    """(name, kind, layer, tensor bytes) of every piece `slice_model` would write."""
    pad = header.alignment
    sizes: dict[str, int] = {}
    n_all = facts.n_layer + facts.n_mtp_layers
    for t in header.tensors:
        place = layout.tensor_place(facts.architecture, t.name)
        m = _BLOCK_TENSOR.match(t.name)
        if place == BLOCK and m and int(m.group(1)) < facts.n_layer:
            piece = block_piece_name(int(m.group(1)))
        elif place == BLOCK and m and int(m.group(1)) < n_all:
            piece = MTP
        elif place == BLOCK:
            raise GgufHeaderError(f"tensor {t.name!r} names a block beyond block_count")
        else:
            piece = place
        sizes[piece] = sizes.get(piece, 0) + -(-t.n_bytes // pad) * pad
    yield EMBEDDING, EMBEDDING, None, sizes.get(EMBEDDING, 0)
    for i in range(facts.n_layer):
        yield block_piece_name(i), BLOCK, i, sizes.get(block_piece_name(i), 0)
    yield HEAD, HEAD, None, sizes.get(HEAD, 0)
    for extra in (SHARED, MTP):
        if extra in sizes:
            yield extra, extra, None, sizes[extra]


def manifest_from_header(header: GgufHeader, name: str = "") -> Manifest:
    """A manifest with true facts and piece sizes, nothing hashed (see the module doc);
    the source size is the full file's, as its tensor table lays it out."""
    facts = facts_from_header(header, name)
    pieces = tuple(
        PieceInfo(piece, f"{piece}.gguf", kind, layer, NOT_COMPUTED, size)
        for piece, kind, layer, size in _pieces(header, facts)
    )
    return Manifest(facts, pieces, NOT_COMPUTED, header.data_offset + header.data_bytes)


def write_manifest_only(model_path: Path, out_dir: Path, name: str = "") -> Manifest:
    """Read `model_path`'s header (a full GGUF or a header-only one) and write
    `out_dir/manifest.json` for it, without pieces."""
    model_path, out_dir = Path(model_path), Path(out_dir)
    header = read_header(model_path)
    manifest = manifest_from_header(header, name or model_path.stem)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest.save(out_dir)
    return manifest
