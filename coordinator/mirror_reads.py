"""Reading a model's published files over HTTP range requests: headers and piece bytes.

Both ends use it: the coordinator reads a published model's headers (to plan its pieces)
and every tensor byte once (to hash them, or to serve a volunteer whose mirror failed),
and a volunteer reads its pieces' tensor bytes. Everything from the network is bounded:
a header by `max_header_bytes`, a range by its length, each read by `timeout` (a stalled
mirror is a failure, not a wait), and every answer is checked for being the range asked
of a file of the expected size: a mirror that serves another file is caught by its size
before its bytes are used, and whatever slips past is caught by the piece's sha256.

Errors are MirrorError with the outcome core.piece_sources.after() weighs: TRANSIENT
(worth another try, resuming) or WRONG (this source cannot give the piece).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from io import BytesIO

import requests
import urllib3

from coordinator.errors import CoordinatorError
from core.gguf_header import GgufHeader, GgufHeaderError, HeaderLimits, parse_header
from core.piece_sources import (
    TRANSIENT,
    WRONG,
    BodyMismatch,
    Mirror,
    PieceRanges,
    piece_segments,
    plan_reads,
    route_body,
    segments_between,
)
from net.rate import Throttle

MAX_HEADER_BYTES = 64 << 20
"""A published GGUF's header (metadata and tensor table): Qwen3.5-397B's is ~15 MB with
its tokenizer; more than this is not a model we would plan."""
FIRST_HEADER_READ = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+)")
_RETRYABLE = frozenset({408, 425, 429})

HeaderRead = Callable[[int, int], Iterable[bytes]]
"""Bytes [start, stop) of the piece's header, from wherever the caller has them."""


class MirrorError(CoordinatorError):
    """A published file could not be read as asked; `outcome` is TRANSIENT or WRONG."""

    def __init__(self, url: str, outcome: str, reason: str) -> None:
        super().__init__(f"mirror {url[:200]}: {reason}")
        self.url = url
        self.outcome = outcome
        self.reason = reason


@dataclass(frozen=True)
class RangeOptions:
    timeout: float = 30.0
    """Seconds to connect, and between any two reads of the body."""
    chunk_bytes: int = 1 << 20
    throttle: Throttle | None = None
    counted: Callable[[int], None] | None = None
    """Told every body byte received from the mirror (byte accounting by source)."""


def read_range(
    web: requests.Session, url: str, start: int, stop: int, size: int, opts: RangeOptions
) -> Iterator[bytes]:
    """Bytes [start, stop) of the file at `url`, whose size must be `size`, as they arrive.
    Ends early only by raising: a short body is TRANSIENT (resume), a long one WRONG."""
    if stop <= start:
        return
    headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    try:
        with web.get(
            url, headers=headers, stream=True, timeout=opts.timeout, verify=web.verify
        ) as resp:
            status = resp.status_code
            if status >= 500 or status in _RETRYABLE:
                raise MirrorError(url, TRANSIENT, f"HTTP {status}")
            if status != 206:
                # 200 would be the whole file: a mirror that ignores ranges is no mirror.
                raise MirrorError(url, WRONG, f"HTTP {status} to a range request")
            m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
            if m is None or int(m.group(1)) != start or int(m.group(2)) != stop - 1:
                raise MirrorError(url, WRONG, "answered another range than the one asked")
            if int(m.group(3)) != size:
                raise MirrorError(
                    url, WRONG, f"the file has {m.group(3)} bytes, not {size}: another file"
                )
            got = 0
            while chunk := resp.raw.read1(opts.chunk_bytes, decode_content=False):
                got += len(chunk)
                if got > stop - start:
                    raise MirrorError(url, WRONG, "sent more bytes than the range")
                if opts.counted is not None:
                    opts.counted(len(chunk))
                if opts.throttle is not None:
                    opts.throttle.take(len(chunk))
                yield chunk
            if got < stop - start:
                raise MirrorError(url, TRANSIENT, f"body ended at {got} of {stop - start} bytes")
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise MirrorError(url, TRANSIENT, f"{type(exc).__name__}: {exc}"[:300]) from exc


def piece_bytes(
    session: requests.Session,
    mirror: Mirror,
    ranges: PieceRanges,
    start: int,
    stop: int | None,
    header: HeaderRead,
    opts: RangeOptions,
) -> Iterator[bytes]:
    """The piece's bytes [start, stop) in order: its header from `header`, tensor bytes
    from the mirror (one request per run of adjacent tensors), padding made here.
    MirrorError when the mirror fails; fewer bytes than asked only by raising."""
    for read in plan_reads(segments_between(piece_segments(ranges), start, stop)):
        if read.file < 0:
            body: Iterable[bytes] = header(read.start, read.stop) if read.stop > read.start else ()
            url = "coordinator"
        else:
            f = mirror.files[read.file]
            body, url = read_range(session, f.url, read.start, read.stop, f.size, opts), f.url
        given = 0
        try:
            for out in route_body(read.ops, body):
                given += len(out)
                yield out
        except BodyMismatch as exc:
            raise MirrorError(url, WRONG, str(exc)) from exc
        if given != read.out_bytes:
            raise MirrorError(url, TRANSIENT, f"gave {given} of {read.out_bytes} bytes")


class _Growing:
    """The start of a remote file as a stream: reading past what has been fetched raises
    _NeedMore, so the header is fetched in doubling reads up to the cap."""

    def __init__(self, data: bytes, complete: bool) -> None:
        self._data = BytesIO(data)
        self._len = len(data)
        self._complete = complete

    def read(self, n: int) -> bytes:
        if self._data.tell() + n > self._len and not self._complete:
            raise _NeedMore
        return self._data.read(n)


class _NeedMore(Exception):
    pass


def read_remote_header(
    session: requests.Session,
    url: str,
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
    timeout: float = 30.0,
) -> tuple[GgufHeader, bytes, int]:
    """The GGUF header of the file at `url`, the bytes it was read from, and the file's
    size; only its first bytes are requested (1 MiB, doubling up to `max_header_bytes`).
    GgufHeaderError for a file that is not a GGUF or whose header exceeds the bounds;
    MirrorError when the server does not answer range requests as asked."""
    want = min(FIRST_HEADER_READ, max_header_bytes)
    size = -1
    while True:
        data, size = _head_bytes(session, url, want, timeout)
        complete = len(data) >= size or want >= max_header_bytes
        limits = HeaderLimits(max_header_bytes=max_header_bytes)
        try:
            header = parse_header(_Growing(data, complete), limits)  # type: ignore[arg-type]
        except _NeedMore:
            want = min(want * 2, max_header_bytes)
            continue
        return header, data, size


def _head_bytes(web: requests.Session, url: str, want: int, timeout: float) -> tuple[bytes, int]:
    """The file's first `want` bytes (fewer for a smaller file) and its size."""
    # The size comes from the first answer's Content-Range; a zero-length range cannot
    # be asked for, so this asks for at least one byte.
    chunks: list[bytes] = []
    try:
        with web.get(
            url,
            headers={"Range": f"bytes=0-{want - 1}", "Accept-Encoding": "identity"},
            stream=True,
            timeout=timeout,
            verify=web.verify,
        ) as resp:
            if resp.status_code == 416:
                raise GgufHeaderError(f"{url}: empty file")
            if resp.status_code != 206:
                raise MirrorError(url, WRONG, f"HTTP {resp.status_code} to a range request")
            m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
            if m is None or int(m.group(1)) != 0:
                raise MirrorError(url, WRONG, "answered another range than the one asked")
            size, expected = int(m.group(3)), int(m.group(2)) + 1
            got = 0
            while chunk := resp.raw.read1(1 << 20, decode_content=False):
                got += len(chunk)
                if got > expected:
                    raise MirrorError(url, WRONG, "sent more bytes than the range")
                chunks.append(chunk)
            if got != expected:
                raise MirrorError(url, TRANSIENT, f"body ended at {got} of {expected} bytes")
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise MirrorError(url, TRANSIENT, f"{type(exc).__name__}: {exc}"[:300]) from exc
    return b"".join(chunks), size
