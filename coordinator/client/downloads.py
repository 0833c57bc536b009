"""Download a stage's model pieces from the coordinator: several at once, resumable, verified.

Each piece streams into `dest/<file>.part`; an interrupted transfer resumes from the part's
size with an HTTP range request, and only a piece whose size and sha256 match its manifest
entry is renamed to `dest/<file>`. Pieces already present and valid cost no request.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import requests
import urllib3

from coordinator.client.unreachable import unreachable
from coordinator.errors import CoordinatorError
from core.errors import PieceCorruptError
from core.manifest import PieceInfo, verify_piece
from net.rate import Throttle

PART_SUFFIX = ".part"

_RETRYABLE_STATUS = frozenset({408, 425, 429})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class DownloadError(CoordinatorError):
    """A piece could not be fetched: the server refused it or the network kept failing.
    A CoordinatorError, so `sangama worker --join` and the tray report it as one."""

    def __init__(self, piece: str, reason: str) -> None:
        super().__init__(f"cannot download piece {piece!r}: {reason}")
        self.piece = piece
        self.reason = reason


@dataclass(frozen=True)
class DownloadProgress:
    piece: str
    """Name of the piece this report is about."""
    done_bytes: int
    total_bytes: int
    all_done_bytes: int
    """Bytes on disk over every requested piece; drops only when a piece restarts from zero."""
    all_total_bytes: int
    finished: bool
    """True exactly once per piece: it is verified and in place."""


ProgressCallback = Callable[[DownloadProgress], None]


class StoppedEarly(Exception):
    """Another piece failed; this worker stops early and keeps its .part for next time."""


class _Transient(Exception):
    """A failure worth another attempt, resuming from the .part."""


class _Mismatch(Exception):
    """The server's bytes cannot be this piece (size or sha256); worth one fresh start."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Progress:
    """Per-piece and overall byte counts; one lock makes callbacks serial and consistent."""

    def __init__(self, pieces: Sequence[PieceInfo], callback: ProgressCallback | None) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._done = {p.name: 0 for p in pieces}
        self._all_done = 0
        self._all_total = sum(p.size for p in pieces)

    def update(self, piece: PieceInfo, done: int, *, finished: bool = False) -> None:
        with self._lock:
            self._all_done += done - self._done[piece.name]
            self._done[piece.name] = done
            if self._callback is not None:
                self._callback(
                    DownloadProgress(
                        piece.name, done, piece.size, self._all_done, self._all_total, finished
                    )
                )


@dataclass(frozen=True)
class _Job:
    session: requests.Session
    base_url: str
    dest: Path
    chunk_bytes: int
    retries: int
    timeout: float
    backoff: float
    progress: _Progress
    stop: threading.Event
    throttle: Throttle | None = None


def download_pieces(
    session: requests.Session,
    base_url: str,
    pieces: Sequence[PieceInfo],
    dest: Path,
    *,
    parallel: int = 4,
    progress: ProgressCallback | None = None,
    chunk_bytes: int = 1 << 20,
    retries: int = 3,
    timeout: float = 30.0,
    backoff: float = 0.5,
    throttle: Throttle | None = None,
) -> list[Path]:
    """Fetch `pieces` from `{base_url}/{piece.file}` into `dest`; return their paths in order.

    Raises PieceCorruptError when a piece's bytes stay wrong after one fresh download, and
    DownloadError when the server refuses a piece or `retries` attempts in a row fail.
    `backoff` seconds (doubling) separate attempts. On any failure the other downloads stop,
    keeping their .part files so that the next call resumes them. `throttle` (the
    volunteer's download cap) is shared by the parallel downloads.
    """
    if parallel < 1 or chunk_bytes < 1 or retries < 1:
        raise ValueError("parallel, chunk_bytes and retries must be at least 1")
    dest = Path(dest)
    # The same file listed twice must not be written by two threads at once.
    unique = list({p.file: p for p in pieces}.values())
    for p in unique:
        _check_file_name(p)
    dest.mkdir(parents=True, exist_ok=True)
    job = _Job(
        session,
        base_url.rstrip("/"),
        dest,
        chunk_bytes,
        retries,
        timeout,
        backoff,
        _Progress(unique, progress),
        threading.Event(),
        throttle,
    )
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="download") as pool:
        futures: list[Future[Path]] = [pool.submit(_fetch_piece, job, p) for p in unique]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            # On a failure (or Ctrl-C here) the other workers stop at their next chunk.
            job.stop.set()
        wait(futures)
    errors = [f.exception() for f in futures]
    real = [e for e in errors if e is not None and not isinstance(e, StoppedEarly)]
    if real:
        raise real[0]
    paths = {p.file: f.result() for p, f in zip(unique, futures, strict=True)}
    return [paths[p.file] for p in pieces]


def format_progress(p: DownloadProgress, width: int = 10) -> str:
    """One line for a terminal, e.g. `[#####.....] 52% 130/250 MiB blk.007`."""
    total = p.all_total_bytes
    fraction = 1.0 if total <= 0 else min(max(p.all_done_bytes / total, 0.0), 1.0)
    filled = int(fraction * width)
    unit, scale = _unit(total)
    # Small totals need a decimal, or every step would read "0/1 MiB".
    digits = 1 if scale > 1 and total / scale < 10 else 0
    done_s = f"{p.all_done_bytes / scale:.{digits}f}"
    total_s = f"{total / scale:.{digits}f}"
    bar = "#" * filled + "." * (width - filled)
    return f"[{bar}] {int(fraction * 100):3d}% {done_s}/{total_s} {unit} {p.piece}"


def _unit(n: int) -> tuple[str, int]:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return unit, scale
    return "B", 1


def _check_file_name(piece: PieceInfo) -> None:
    # The manifest comes over the network: a name must never reach outside `dest`.
    f = piece.file
    if not f or f in (".", "..") or "/" in f or "\\" in f or "\0" in f or ":" in f:
        raise DownloadError(piece.name, f"unsafe file name {f!r}")


def _fetch_piece(job: _Job, piece: PieceInfo) -> Path:
    final = job.dest / piece.file
    part = job.dest / (piece.file + PART_SUFFIX)
    if final.exists():
        try:
            verify_piece(job.dest, piece)
        except PieceCorruptError:
            final.unlink()
        else:
            job.progress.update(piece, piece.size, finished=True)
            return final

    fresh_start_used = False
    failures = 0
    while True:
        if job.stop.is_set():
            raise StoppedEarly
        before = _size(part)
        try:
            _transfer(job, piece, part)
            verify_piece(job.dest, replace(piece, file=part.name))
        except (_Mismatch, PieceCorruptError) as exc:
            reason = exc.reason
            part.unlink(missing_ok=True)
            job.progress.update(piece, 0)
            if fresh_start_used:
                raise PieceCorruptError(piece.name, reason) from exc
            # A bad .part from an earlier run, or a flipped bit on the way: one clean retry.
            fresh_start_used = True
            continue
        except (_Transient, requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            # An attempt that added bytes resets the count: resuming is making progress.
            failures = 1 if _size(part) > before else failures + 1
            if failures >= job.retries:
                raise DownloadError(piece.name, f"{_describe(exc)} ({failures} attempts)") from exc
            if job.stop.wait(job.backoff * 2 ** (failures - 1)):
                raise StoppedEarly from exc
            continue
        os.replace(part, final)
        job.progress.update(piece, piece.size, finished=True)
        return final


def _transfer(job: _Job, piece: PieceInfo, part: Path) -> None:
    """Bring `part` to the piece's full length, resuming when the server allows."""
    offset = _size(part)
    if offset > piece.size:
        part.unlink()
        offset = 0
    job.progress.update(piece, offset)
    # identity: a range of a compressed body would not be a range of the file.
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    url = f"{job.base_url}/{quote(piece.file)}"
    # verify= explicitly: REQUESTS_CA_BUNDLE would otherwise override the session's CA.
    with job.session.get(
        url, headers=headers, stream=True, timeout=job.timeout, verify=job.session.verify
    ) as resp:
        status = resp.status_code
        if status == 416 and offset == piece.size:
            return  # the part was already complete; verification decides
        if status == 416:
            part.unlink(missing_ok=True)
            raise _Transient(f"server refused range from {offset} (416)")
        if status >= 500 or status in _RETRYABLE_STATUS:
            raise _Transient(f"HTTP {status}")
        if status == 206:
            start, total = _content_range(resp.headers.get("Content-Range", ""))
            if start != offset:
                part.unlink(missing_ok=True)
                raise _Transient(f"asked for bytes from {offset}, got from {start}")
            mode = "ab"
        elif status == 200:
            # The server ignored the range: the body is the whole file, so start over.
            offset, mode = 0, "wb"
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        else:
            raise DownloadError(piece.name, f"HTTP {status} from {url}")
        if total is not None and total != piece.size:
            raise _Mismatch(f"server offers {total} bytes, manifest says {piece.size}")
        done = offset
        with open(part, mode) as f:
            job.progress.update(piece, done)
            for chunk in _body(resp, job.chunk_bytes):
                if job.stop.is_set():
                    raise StoppedEarly
                if done + len(chunk) > piece.size:
                    raise _Mismatch(f"server sent more than the manifest's {piece.size} bytes")
                f.write(chunk)
                done += len(chunk)
                job.progress.update(piece, done)
                if job.throttle is not None:  # reading slower lets TCP slow the sender
                    job.throttle.take(len(chunk))
    if done < piece.size:
        raise _Transient(f"body ended at {done} of {piece.size} bytes")


def _body(resp: requests.Response, chunk_bytes: int) -> Iterator[bytes]:
    # read1 hands over bytes as they arrive; iter_content holds back a partial chunk and
    # loses it when the link drops, so the resume would start short of what was received.
    while chunk := resp.raw.read1(chunk_bytes, decode_content=True):
        yield chunk


def _content_range(value: str) -> tuple[int, int | None]:
    m = _CONTENT_RANGE.fullmatch(value.strip())
    if m is None:
        raise _Transient(f"unreadable Content-Range {value!r}")
    total = m.group(3)
    return int(m.group(1)), None if total == "*" else int(total)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, requests.RequestException | urllib3.exceptions.HTTPError):
        return unreachable(exc, "").why  # "connection refused", not urllib3's repr
    return str(exc)
