"""A published model planned from its headers alone: its facts, its pieces and where each
piece's tensor bytes lie in the published files, without a byte of tensor data.

The coordinator of a model registered by URL reads only the GGUF header of each published
file (one GGUF, or every shard of a gguf-split set), and from them plans the same pieces
`sangama slice` would write (core.gguf_stream.plan_pieces: the same headers, the same
sizes), so a piece built from the mirror's bytes is byte-identical to a sliced one. The
headers are checked as core.gguf_shards checks local files: tensor data in header order,
inside the file, shards numbered as their names say.

Pure: bytes in, plans out; reading the headers over HTTP is coordinator.mirror_reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from io import BytesIO
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit, urlunsplit

from core import gguf_layout as layout
from core.errors import SliceError, UnsupportedModelError

# _Cursor: the same bounded reader parse_header validated the header with, walked again
# to keep each metadata entry's raw bytes (which a piece copies as they are).
from core.gguf_header import (
    GgufHeader,
    GgufHeaderError,
    HeaderLimits,
    _Cursor,
    facts_from_header,
)
from core.gguf_shards import (
    SPLIT_COUNT,
    SPLIT_NO,
    SPLIT_TENSORS_COUNT,
    SourceFile,
    SourceModel,
    TensorSpan,
    model_stem,
    shard_name,
)
from core.gguf_stream import PiecePlan, plan_pieces
from core.manifest import Manifest, PieceInfo
from core.piece_sources import Mirror, MirrorFile, PieceRanges, Span, check_url, pad
from core.types import ModelFacts

_LIMITS = HeaderLimits()
NOT_COMPUTED = "not-computed"
"""The source's sha256 in a manifest of a model registered by URL: its pieces are hashed,
the published file as a whole never is (nobody reads its every byte in one stream)."""


def file_name(url: str) -> str:
    return PurePosixPath(urlsplit(url).path).name


def shard_urls(first_url: str, count: int) -> tuple[str, ...]:
    """The URLs of every shard of a set whose first shard is at `first_url`: the same
    folder, gguf-split's names (`NAME-00001-of-00003.gguf`)."""
    parts = urlsplit(first_url)
    path = PurePosixPath(parts.path)
    stem = model_stem(Path(path.name))
    if path.name != shard_name(stem, 1, count):
        raise SliceError(
            f"{first_url} is the first of {count} shards but is not named as gguf-split names "
            f"it ({shard_name('NAME', 1, count)}), so its other shards cannot be found"
        )
    return tuple(
        urlunsplit(parts._replace(path=str(path.with_name(shard_name(stem, i, count)))))
        for i in range(1, count + 1)
    )


def split_count(header: GgufHeader) -> tuple[int, int]:
    """(split.no, split.count) of a header; (0, 1) for a file that is not a shard."""
    count = header.metadata.get(SPLIT_COUNT, 0)
    no = header.metadata.get(SPLIT_NO, 0)
    if not isinstance(count, int) or not isinstance(no, int):
        raise GgufHeaderError("split.no and split.count must be integers")
    return (0, 1) if count <= 1 else (no, count)


def raw_kv(data: bytes, limits: HeaderLimits = _LIMITS) -> tuple[tuple[str, bytes], ...]:
    """Every metadata entry of the header in `data` as the bytes it occupies (key, type,
    value), as core.gguf_shards gives a local file's: a piece copies them as they are."""
    cur = _Cursor(BytesIO(data), limits)
    cur.take(4 + 4)  # magic and version, checked by parse_header before this is called
    cur.count("tensor count", limits.max_tensors)
    n_kv = cur.count("metadata count", limits.max_kv)
    out = []
    for _ in range(n_kv):
        start = cur.position
        key = cur.string()
        cur.value(int(cur.scalar("I")))
        out.append((key, data[start : cur.position]))
    return tuple(out)


def _spans(header: GgufHeader, shard: int, name: str, size: int) -> list[TensorSpan]:
    """The file's tensors where llama.cpp reads them: in header order, each padded to the
    alignment, inside the file (as core.gguf_shards._spans checks a local file)."""
    spans, expected = [], 0
    for t in header.tensors:
        if t.offset != expected:
            raise SliceError(
                f"{name}: tensor {t.name!r} has data offset {t.offset}, expected {expected} "
                "(tensor data must follow the header's order, as llama.cpp requires)"
            )
        start = header.data_offset + t.offset
        if start + t.n_bytes > size:
            raise SliceError(f"{name}: tensor {t.name!r} ends beyond the file's {size} bytes")
        expected += pad(t.n_bytes, header.alignment)
        spans.append(TensorSpan(t.name, t.shape, t.ggml_type, t.n_bytes, shard, start))
    return spans


def source_from_headers(
    files: Sequence[MirrorFile], headers: Sequence[tuple[GgufHeader, bytes]]
) -> tuple[SourceModel, GgufHeader]:
    """The published model as core.gguf_stream plans it, and the first header with every
    shard's tensors (what facts are read from)."""
    if not files or len(files) != len(headers):
        raise SliceError("one header per published file is needed")
    count = len(files)
    spans: list[TensorSpan] = []
    for i, (f, (header, _)) in enumerate(zip(files, headers, strict=True)):
        check_url(f.url)
        if split_count(header) != ((i, count) if count > 1 else (0, 1)):
            raise SliceError(
                f"{file_name(f.url)} is not shard {i + 1} of {count} (its split.no/split.count "
                f"say {split_count(header)})"
            )
        spans.extend(_spans(header, i, file_name(f.url), f.size))
    first, first_bytes = headers[0]
    declared = first.metadata.get(SPLIT_TENSORS_COUNT)
    if count > 1 and declared is not None and declared != len(spans):
        raise SliceError(f"the shards hold {len(spans)} tensors, split.tensors.count {declared}")
    names = [s.name for s in spans]
    if len(set(names)) != len(names):
        raise SliceError("tensors named more than once across shards")
    arch = first.architecture
    if arch not in layout.ARCH_RULES:
        raise UnsupportedModelError(
            f"{file_name(files[0].url)} is a {arch!r} model, an architecture not checked for "
            "exact layer cuts; Sangama slices: " + ", ".join(layout.supported_architectures())
        )
    merged = replace(first, tensors=tuple(t for h, _ in headers for t in h.tensors))
    source = SourceModel(
        tuple(SourceFile(Path(file_name(f.url)), f.size, 0) for f in files),
        arch,
        first.alignment,
        raw_kv(first_bytes),
        tuple(spans),
    )
    return source, merged


def plan_published(
    files: Sequence[MirrorFile], headers: Sequence[tuple[GgufHeader, bytes]], name: str = ""
) -> tuple[ModelFacts, list[PiecePlan], Mirror]:
    """The model's facts, its pieces (headers and sizes, as slicing would write them) and
    where each piece's tensor bytes lie in `files`."""
    source, merged = source_from_headers(files, headers)
    facts = facts_from_header(merged, name or model_stem(Path(file_name(files[0].url))))
    plans = plan_pieces(source, facts)
    pieces = {
        p.name: PieceRanges(
            len(p.header),
            source.alignment,
            tuple(Span(t.shard, t.offset, t.n_bytes) for t in p.tensors),
        )
        for p in plans
    }
    return facts, plans, Mirror(tuple(files), pieces)


def published_manifest(
    facts: ModelFacts, plans: Sequence[PiecePlan], mirror: Mirror, sha256: dict[str, str]
) -> Manifest:
    """The manifest once every piece is hashed (`sha256`: piece name -> digest)."""
    pieces = tuple(
        PieceInfo(p.name, p.file, p.kind, p.layer, sha256[p.name], p.size) for p in plans
    )
    return Manifest(facts, pieces, NOT_COMPUTED, sum(f.size for f in mirror.files), mirror)
