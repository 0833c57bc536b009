"""Where a piece's bytes can be read besides the coordinator: ranges of the published files.

A piece is a small GGUF of its own (core.gguf_stream): a header (GGUF magic, the model's
metadata, the piece's tensor table), then each of its tensors' bytes followed by zeros up
to the alignment. The tensor bytes are exactly ranges of the model's published files (one
GGUF or gguf-split shards), so a public mirror that answers HTTP range requests (the
hub's copy) can supply them; the header is a few kilobytes (the embedding piece's holds
the tokenizer: megabytes) and comes from the coordinator, which computes it from the
published file's header. A volunteer writes header, ranges and zeros in piece order and
gets the very file the slicer would have written, checked against the same sha256.

In the manifest this is one optional top-level field, `mirror`:

    "mirror": {"files": [{"url": "https://…/model.gguf", "size": 123}],
               "pieces": {"blk.000": {"header": 4096, "alignment": 32,
                                      "spans": [[0, 1234560, 884736], …]}}}

Each span is [file index, offset in that file, length] of one tensor's bytes, in piece
order. It lives beside `pieces`, not inside each piece entry, because workers before it
build each piece entry as PieceInfo(**entry) and would refuse a manifest with a new key
there; a top-level key they ignore, so a new coordinator still serves older volunteers.

Everything here is pure: the JSON schema with its bounds (a manifest comes from the
network), the piece's segments, which HTTP ranges to ask for, how a range's body maps
onto the piece, and when a source is demoted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.errors import SliceError

MAX_MIRROR_FILES = 4096
"""gguf-split sets have tens of shards; far more than any real one."""
MAX_SPANS = 1 << 16
"""Tensors of one piece: a MoE block has tens; bounded against a hostile manifest."""
MAX_URL = 2048
MAX_ALIGNMENT = 1 << 20
MAX_GAP = 64 << 10
"""Bytes between two of a piece's spans worth reading and discarding rather than making a
second request: a block's tensors lie one after the other (the padding between them is
under the alignment), and a request costs a round trip or more."""

HEADER = "header"
"""A segment read from the coordinator's copy of the piece (its header)."""
DATA = "data"
"""A segment read from a published file at the mirror."""
ZEROS = "zeros"
"""Padding after a tensor: written locally, read from nobody."""

_URL = re.compile(r"^https://[!-~]+$")


@dataclass(frozen=True)
class MirrorFile:
    """One published file: where it is, and its size (a file of another size is not it)."""

    url: str
    size: int


@dataclass(frozen=True)
class Span:
    """One tensor's bytes in a published file."""

    file: int
    """Index into Mirror.files."""
    offset: int
    length: int


@dataclass(frozen=True)
class PieceRanges:
    """How to build one piece: `header` bytes from the coordinator, then each span
    followed by zeros up to `alignment`."""

    header: int
    alignment: int
    spans: tuple[Span, ...]

    @property
    def size(self) -> int:
        return self.header + sum(pad(s.length, self.alignment) for s in self.spans)


@dataclass(frozen=True)
class Mirror:
    files: tuple[MirrorFile, ...]
    pieces: Mapping[str, PieceRanges]

    def ranges(self, piece: str) -> PieceRanges | None:
        return self.pieces.get(piece)

    @property
    def mirror_bytes(self) -> int:
        """Bytes of all pieces that the mirror supplies (tensor data)."""
        return sum(s.length for r in self.pieces.values() for s in r.spans)

    def to_doc(self) -> dict[str, Any]:
        return {
            "files": [{"url": f.url, "size": f.size} for f in self.files],
            "pieces": {
                name: {
                    "header": r.header,
                    "alignment": r.alignment,
                    "spans": [[s.file, s.offset, s.length] for s in r.spans],
                }
                for name, r in self.pieces.items()
            },
        }


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# ---------------------------------------------------------------- the manifest field


def _int(value: Any, what: str, low: int = 0, high: int = 1 << 50) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SliceError(f"malformed manifest mirror: {what} must be an integer in [{low}, {high}]")
    return value


def check_url(url: Any) -> str:
    """A mirror URL: HTTPS (a volunteer checks bytes by sha256, but what it asks for and
    from whom should not be readable on the way), printable ASCII, bounded."""
    if not isinstance(url, str) or len(url) > MAX_URL or not _URL.match(url):
        raise SliceError(f"malformed manifest mirror: {str(url)[:80]!r} is not an https:// URL")
    return url


def mirror_from_doc(doc: Any, piece_sizes: Mapping[str, int]) -> Mirror:
    """The manifest's `mirror` field, every value checked against its bounds and every
    piece's layout against its manifest size: SliceError otherwise."""
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise SliceError("malformed manifest mirror: not an object with files")
    raw_files, raw_pieces = doc["files"], doc.get("pieces")
    if len(raw_files) > MAX_MIRROR_FILES or not isinstance(raw_pieces, dict):
        raise SliceError("malformed manifest mirror: too many files, or no pieces")
    files = []
    for f in raw_files:
        if not isinstance(f, dict):
            raise SliceError("malformed manifest mirror: a file is not an object")
        files.append(MirrorFile(check_url(f.get("url")), _int(f.get("size"), "file size")))
    pieces: dict[str, PieceRanges] = {}
    for name, entry in raw_pieces.items():
        if name not in piece_sizes or not isinstance(entry, dict):
            raise SliceError(f"malformed manifest mirror: no piece {str(name)[:64]!r}")
        spans_doc = entry.get("spans")
        if not isinstance(spans_doc, list) or len(spans_doc) > MAX_SPANS:
            raise SliceError(f"malformed manifest mirror: spans of {name!r}")
        alignment = _int(entry.get("alignment"), "alignment", 1, MAX_ALIGNMENT)
        if alignment & (alignment - 1):
            raise SliceError(f"malformed manifest mirror: alignment {alignment} of {name!r}")
        spans = []
        for s in spans_doc:
            if not isinstance(s, list) or len(s) != 3:
                raise SliceError(f"malformed manifest mirror: a span of {name!r}")
            index = _int(s[0], "span file", 0, max(len(files) - 1, 0))
            span = Span(index, _int(s[1], "span offset"), _int(s[2], "span length"))
            if index >= len(files) or span.offset + span.length > files[index].size:
                raise SliceError(
                    f"malformed manifest mirror: a span of {name!r} is outside its file"
                )
            spans.append(span)
        ranges = PieceRanges(_int(entry.get("header"), "header size"), alignment, tuple(spans))
        if ranges.size != piece_sizes[name]:
            raise SliceError(
                f"malformed manifest mirror: {name!r} lays out {ranges.size} bytes, "
                f"the piece has {piece_sizes[name]}"
            )
        pieces[name] = ranges
    return Mirror(tuple(files), pieces)


# ---------------------------------------------------------------- segments and reads


@dataclass(frozen=True)
class PieceSegment:
    """A run of a piece's bytes and where they come from."""

    kind: str
    """HEADER, DATA or ZEROS."""
    start: int
    """Offset in the piece."""
    length: int
    file: int = -1
    source_offset: int = 0
    """For DATA: the file index and the offset there of the segment's first byte."""


def piece_segments(r: PieceRanges) -> tuple[PieceSegment, ...]:
    """The piece from its first byte to its last: header, then each span and its zeros."""
    out = [PieceSegment(HEADER, 0, r.header)] if r.header else []
    at = r.header
    for s in r.spans:
        if s.length:
            out.append(PieceSegment(DATA, at, s.length, s.file, s.offset))
        zeros = pad(s.length, r.alignment) - s.length
        if zeros:
            out.append(PieceSegment(ZEROS, at + s.length, zeros))
        at += pad(s.length, r.alignment)
    return tuple(out)


def segments_between(
    segments: Sequence[PieceSegment], start: int, stop: int | None = None
) -> tuple[PieceSegment, ...]:
    """The piece's bytes [start, stop): the segments cut to that window (a resumed
    download starts inside one; a range request may end inside one)."""
    out = []
    for seg in segments:
        lo = max(seg.start, start)
        hi = seg.start + seg.length if stop is None else min(seg.start + seg.length, stop)
        if hi <= lo:
            continue
        shift = lo - seg.start
        out.append(replace(seg, start=lo, length=hi - lo, source_offset=seg.source_offset + shift))
    return tuple(out)


KEEP, SKIP, FILL = "keep", "skip", "fill"
"""Ops of a read: KEEP n body bytes, SKIP n body bytes, FILL n zeros (no body used)."""


@dataclass(frozen=True)
class Read:
    """One request: bytes [start, stop) of a mirror file (file >= 0), of the piece at the
    coordinator (file == -1), or none at all (stop == start: zeros only); `ops` turn its
    body into the next piece bytes, in order."""

    file: int
    start: int
    stop: int
    ops: tuple[tuple[str, int], ...]

    @property
    def out_bytes(self) -> int:
        return sum(n for op, n in self.ops if op != SKIP)

    @property
    def from_mirror(self) -> bool:
        return self.file >= 0 and self.stop > self.start


def plan_reads(segments: Sequence[PieceSegment], max_gap: int = MAX_GAP) -> tuple[Read, ...]:
    """The fewest requests that give `segments` in order: consecutive spans of one file
    with at most `max_gap` bytes between them share a request (the gap is read and
    dropped: it is the source's own padding, whose bytes a piece does not take), padding
    is filled in locally."""
    reads: list[Read] = []
    cur: Read | None = None

    def close() -> None:
        nonlocal cur
        if cur is not None:
            reads.append(cur)
            cur = None

    for seg in segments:
        if seg.kind == ZEROS:
            if cur is None:
                reads.append(Read(-1, 0, 0, ((FILL, seg.length),)))
            else:
                cur = replace(cur, ops=(*cur.ops, (FILL, seg.length)))
            continue
        if seg.kind == HEADER:
            close()
            reads.append(Read(-1, seg.start, seg.start + seg.length, ((KEEP, seg.length),)))
            continue
        gap = seg.source_offset - cur.stop if cur is not None else -1
        if cur is not None and cur.file == seg.file and 0 <= gap <= max_gap:
            skip = ((SKIP, gap),) if gap else ()
            cur = replace(
                cur,
                stop=seg.source_offset + seg.length,
                ops=(*cur.ops, *skip, (KEEP, seg.length)),
            )
            continue
        close()
        cur = Read(
            seg.file, seg.source_offset, seg.source_offset + seg.length, ((KEEP, seg.length),)
        )
    close()
    return tuple(reads)


class BodyMismatch(Exception):
    """A body longer than its read asked for."""


def route_body(ops: Sequence[tuple[str, int]], chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The piece bytes a read's body gives, in order, as they arrive: KEEP passes body
    bytes on, SKIP drops them, FILL inserts zeros. Stops early (the caller sees fewer
    bytes than `Read.out_bytes`) when the body ends short; BodyMismatch when it runs long."""
    index, left = 0, ops[0][1] if ops else 0

    def fills() -> Iterator[bytes]:
        nonlocal index, left
        while index < len(ops) and (left == 0 or ops[index][0] == FILL):
            if ops[index][0] == FILL and left:
                yield bytes(left)
            index += 1
            left = ops[index][1] if index < len(ops) else 0

    yield from fills()
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            if index >= len(ops):
                raise BodyMismatch("the body is longer than the range asked for")
            n = min(left, len(view))
            if ops[index][0] == KEEP:
                yield bytes(view[:n])
            view, left = view[n:], left - n
            yield from fills()


# ---------------------------------------------------------------- source health


OK, TRANSIENT, WRONG = "ok", "transient", "wrong"
"""Outcomes of reading from a source: served the bytes; failed in a way worth another try
(a timeout, a dropped link, HTTP 5xx); served what cannot be the piece (a sha256 or size
mismatch, a file of the wrong size, a refusal)."""


@dataclass(frozen=True)
class SourceHealth:
    failures: int = 0
    """Transient failures in a row."""
    demoted: bool = False
    reason: str = ""


def after(
    health: SourceHealth, outcome: str, reason: str = "", max_failures: int = 3
) -> SourceHealth:
    """The source's health after one outcome. Wrong bytes demote it at once: a mirror
    that served one bad piece is not trusted with the rest. Transient failures demote it
    after `max_failures` in a row; a demoted source stays demoted."""
    if health.demoted:
        return health
    if outcome == OK:
        return SourceHealth()
    if outcome == WRONG:
        return SourceHealth(health.failures, True, reason)
    failures = health.failures + 1
    return SourceHealth(failures, failures >= max_failures, reason)
