"""Download a stage's pieces from the model's public mirror, the coordinator as fallback.

For each piece the manifest gives ranges for (core.piece_sources), the volunteer asks the
coordinator for the piece's header (a range of `GET …/pieces/{file}`: kilobytes) and the
mirror for its tensor bytes (one range request per run of adjacent tensors), writes them
with the padding into `dest/<file>.part` in piece order, and renames the part only once
its size and sha256 match the manifest, as coordinator.client.downloads does. Several
pieces are fetched at once; an interrupted piece resumes from its part's length.

When the mirror fails (an HTTP error, a stall past `timeout`, a short body, bytes of
another file, a piece whose sha256 is wrong) the failure is weighed by
core.piece_sources.after(): wrong bytes demote the mirror at once (the part is deleted),
transient failures after `retries` in a row. The piece then comes from the coordinator
(downloads.download_pieces, resuming a part whose bytes were not called wrong), and so
do the pieces after it. Nothing unverified is ever renamed into place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import requests
import urllib3

from coordinator.client.downloads import (
    PART_SUFFIX,
    DownloadError,
    DownloadProgress,
    ProgressCallback,
    StoppedEarly,
    download_pieces,
)
from coordinator.client.peer_pieces import (
    PEER_PARTS,
    Demoted,
    Peers,
    drop_peer_part,
    from_peers,
)
from coordinator.mirror_reads import MirrorError, RangeOptions, piece_bytes
from core.errors import PieceCorruptError
from core.manifest import PieceInfo, verify_piece
from core.piece_sources import OK, WRONG, Mirror, PieceRanges, SourceHealth, after
from net.rate import Throttle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchReport:
    """What a fetch did: the pieces' paths in order, and bytes received from each source."""

    paths: tuple[Path, ...]
    mirror_bytes: int
    coordinator_bytes: int
    demoted: str
    """Why the mirror was demoted; empty when it was not."""
    peer_bytes: int = 0
    """Bytes received from peers (coordinator.client.peer_pieces)."""
    demoted_peers: tuple[str, ...] = ()
    """Peers given up during the fetch."""
    peer_reasons: tuple[tuple[str, str], ...] = ()
    """Each peer given up, with why."""


class _FetchState:
    """Shared by the piece threads: the mirror's health, byte counts and progress."""

    def __init__(self, pieces: Sequence[PieceInfo], callback: ProgressCallback | None) -> None:
        self.lock = threading.Lock()
        self.health = SourceHealth()
        self.mirror_bytes = 0
        self.coordinator_bytes = 0
        self.peer_bytes = 0
        self.peers_demoted = Demoted()
        self.stop = threading.Event()
        self._callback = callback
        self._done = {p.name: 0 for p in pieces}
        self._total = sum(p.size for p in pieces)

    def weigh(self, outcome: str, reason: str, max_failures: int) -> SourceHealth:
        with self.lock:
            before, self.health = self.health, after(self.health, outcome, reason, max_failures)
        if self.health.demoted and not before.demoted:  # said once, whichever piece did it
            log.warning("mirror demoted (%s): the coordinator serves the rest", reason)
        return self.health

    def usable(self) -> bool:
        with self.lock:
            return not self.health.demoted

    def add(self, mirror: int = 0, coordinator: int = 0, peer: int = 0) -> None:
        with self.lock:
            self.mirror_bytes += mirror
            self.coordinator_bytes += coordinator
            self.peer_bytes += peer

    def progress(self, piece: PieceInfo, done: int, finished: bool = False) -> None:
        with self.lock:
            self._done[piece.name] = done
            if self._callback is not None:
                self._callback(
                    DownloadProgress(
                        piece.name,
                        done,
                        piece.size,
                        sum(self._done.values()),
                        self._total,
                        finished,
                    )
                )


def fetch_pieces(
    session: requests.Session,
    base_url: str,
    mirror: Mirror | None,
    pieces: Sequence[PieceInfo],
    dest: Path,
    *,
    mirror_session: requests.Session | None = None,
    parallel: int = 4,
    progress: ProgressCallback | None = None,
    chunk_bytes: int = 1 << 20,
    retries: int = 3,
    timeout: float = 30.0,
    backoff: float = 0.5,
    throttle: Throttle | None = None,
    peers: Peers | None = None,
) -> FetchReport:
    """Fetch `pieces` into `dest`: from peers that hold them when `peers` is given
    (coordinator.client.peer_pieces), then from the mirror where the manifest gives
    ranges (tensor bytes from `mirror`, headers from `{base_url}/{file}`), from the
    coordinator otherwise and whenever the mirror fails. Errors as
    downloads.download_pieces raises them."""
    if parallel < 1 or chunk_bytes < 1 or retries < 1:
        raise ValueError("parallel, chunk_bytes and retries must be at least 1")
    unique = list({p.file: p for p in pieces}.values())
    if mirror is None and peers is None:
        before = _part_bytes(dest, unique)
        paths = download_pieces(
            session,
            base_url,
            pieces,
            dest,
            parallel=parallel,
            progress=progress,
            chunk_bytes=chunk_bytes,
            retries=retries,
            timeout=timeout,
            backoff=backoff,
            throttle=throttle,
        )
        return FetchReport(tuple(paths), 0, sum(p.size for p in unique) - before, "")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    state = _FetchState(unique, progress)
    http = mirror_session or requests.Session()
    opts = RangeOptions(
        timeout=timeout,
        chunk_bytes=chunk_bytes,
        throttle=throttle,
        counted=lambda n: state.add(mirror=n),
    )

    def one(piece: PieceInfo) -> Path:
        if peers is not None and not (dest / piece.file).exists():
            path = _from_peers(peers, piece, dest, state, chunk_bytes, throttle)
            if path is not None:
                return path
        ranges = None if mirror is None else mirror.ranges(piece.name)
        if mirror is not None and ranges is not None and state.usable():
            path = _from_mirror(
                session, base_url, http, mirror, ranges, piece, dest, state, opts, retries, backoff
            )
            if path is not None:
                return _landed(dest, piece, path)
        path = _from_coordinator(
            session, base_url, piece, dest, state, chunk_bytes, retries, timeout, backoff, throttle
        )
        return _landed(dest, piece, path)

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="piece") as pool:
        futures: list[Future[Path]] = [pool.submit(one, p) for p in unique]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            state.stop.set()
        wait(futures)
    errors = [f.exception() for f in futures]
    real = [e for e in errors if e is not None and not isinstance(e, StoppedEarly)]
    if real:
        raise real[0]
    by_file = {p.file: f.result() for p, f in zip(unique, futures, strict=True)}
    if state.peer_bytes or peers is not None:
        log.info(
            "pieces: %d bytes from peers, %d from the mirror, %d from the coordinator",
            state.peer_bytes,
            state.mirror_bytes,
            state.coordinator_bytes,
        )
    return FetchReport(
        tuple(by_file[p.file] for p in pieces),
        state.mirror_bytes,
        state.coordinator_bytes,
        state.health.reason if state.health.demoted else "",
        state.peer_bytes,
        tuple(sorted(state.peers_demoted.reasons())),
        tuple(sorted(state.peers_demoted.reasons().items())),
    )


def _from_peers(
    peers: Peers,
    piece: PieceInfo,
    dest: Path,
    state: _FetchState,
    chunk_bytes: int,
    throttle: Throttle | None,
) -> Path | None:
    """The piece from a peer (coordinator.client.peer_pieces), counted as peer bytes."""
    staged = dest / PEER_PARTS
    seen = [max(_size(staged / piece.file), _size(staged / (piece.file + PART_SUFFIX)))]

    def report(p: DownloadProgress) -> None:
        if p.done_bytes > seen[0]:
            state.add(peer=p.done_bytes - seen[0])
        seen[0] = p.done_bytes
        state.progress(piece, p.done_bytes, p.finished)

    return from_peers(
        peers,
        piece,
        dest,
        state.peers_demoted,
        state.stop,
        chunk_bytes=chunk_bytes,
        throttle=throttle,
        progress=report,
    )


def _landed(dest: Path, piece: PieceInfo, path: Path) -> Path:
    drop_peer_part(dest, piece)
    return path


def _part_bytes(dest: Path, pieces: Sequence[PieceInfo]) -> int:
    """Bytes already on disk (parts and complete pieces), which cost no download."""
    total = 0
    for p in pieces:
        for path in (Path(dest) / p.file, Path(dest) / (p.file + PART_SUFFIX)):
            try:
                total += min(path.stat().st_size, p.size)
                break
            except OSError:
                continue
    return total


def _from_mirror(
    session: requests.Session,
    base_url: str,
    http: requests.Session,
    mirror: Mirror,
    ranges: PieceRanges,
    piece: PieceInfo,
    dest: Path,
    state: _FetchState,
    opts: RangeOptions,
    retries: int,
    backoff: float,
) -> Path | None:
    """The piece built from its header and the mirror's bytes and verified, or None when
    the mirror failed it (the caller then asks the coordinator)."""
    final, part = dest / piece.file, dest / (piece.file + PART_SUFFIX)
    if final.exists():
        try:
            verify_piece(dest, piece)
        except PieceCorruptError:
            final.unlink()
        else:
            state.progress(piece, piece.size, finished=True)
            return final
    while state.usable():
        if state.stop.is_set():
            raise StoppedEarly
        done = _size(part)
        if done > piece.size:
            part.unlink()
            done = 0
        state.progress(piece, done)
        try:
            with open(part, "ab") as out:
                for chunk in _piece_stream(
                    session, base_url, http, mirror, ranges, piece, done, state, opts
                ):
                    out.write(chunk)
                    done += len(chunk)
                    state.progress(piece, done)
            verify_piece(dest, replace(piece, file=part.name))
        except MirrorError as exc:
            if exc.outcome == WRONG:
                part.unlink(missing_ok=True)
            log.info("mirror failed piece %s: %s", piece.name, exc)
            health = state.weigh(exc.outcome, exc.reason, retries)
            if not health.demoted and state.stop.wait(backoff * 2 ** max(health.failures - 1, 0)):
                raise StoppedEarly from exc
            continue
        except PieceCorruptError as exc:
            part.unlink(missing_ok=True)
            state.weigh(WRONG, f"piece {piece.name}: {exc.reason}", retries)
            return None
        state.weigh(OK, "", retries)
        part.replace(final)
        state.progress(piece, piece.size, finished=True)
        return final
    return None


def _piece_stream(
    session: requests.Session,
    base_url: str,
    http: requests.Session,
    mirror: Mirror,
    ranges: PieceRanges,
    piece: PieceInfo,
    start: int,
    state: _FetchState,
    opts: RangeOptions,
) -> Iterator[bytes]:
    def header(a: int, b: int) -> Iterator[bytes]:
        for chunk in _coordinator_range(session, base_url, piece, a, b, opts.timeout):
            state.add(coordinator=len(chunk))
            yield chunk

    for chunk in piece_bytes(http, mirror, ranges, start, piece.size, header, opts):
        if state.stop.is_set():
            raise StoppedEarly
        yield chunk


def _coordinator_range(
    web: requests.Session,
    base_url: str,
    piece: PieceInfo,
    start: int,
    stop: int,
    timeout: float,
) -> Iterator[bytes]:
    """Bytes [start, stop) of the piece at the coordinator: its header, for the mirror has
    none. A failure here is the coordinator's, so it is raised as a DownloadError, never
    counted against the mirror."""
    url = f"{base_url.rstrip('/')}/{quote(piece.file)}"
    headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    try:
        with web.get(url, headers=headers, stream=True, timeout=timeout, verify=web.verify) as resp:
            if resp.status_code != 206:
                raise DownloadError(piece.name, f"HTTP {resp.status_code} for its header")
            got = 0
            while chunk := resp.raw.read1(1 << 20, decode_content=False):
                got += len(chunk)
                if got > stop - start:
                    raise DownloadError(piece.name, "the coordinator sent a longer header")
                yield chunk
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise DownloadError(piece.name, f"header: {exc}"[:300]) from exc


def _from_coordinator(
    session: requests.Session,
    base_url: str,
    piece: PieceInfo,
    dest: Path,
    state: _FetchState,
    chunk_bytes: int,
    retries: int,
    timeout: float,
    backoff: float,
    throttle: Throttle | None,
) -> Path:
    """The piece from the coordinator, resuming any part the mirror left (its bytes were
    not called wrong; the sha256 check has the last word either way)."""
    seen = [_size(dest / (piece.file + PART_SUFFIX))]

    def report(p: DownloadProgress) -> None:
        if p.done_bytes > seen[0]:
            state.add(coordinator=p.done_bytes - seen[0])
        seen[0] = p.done_bytes
        state.progress(piece, p.done_bytes, p.finished)

    if (dest / piece.file).exists():
        seen[0] = piece.size  # a complete piece on disk costs no request
    (path,) = download_pieces(
        session,
        base_url,
        [piece],
        dest,
        parallel=1,
        progress=report,
        chunk_bytes=chunk_bytes,
        retries=retries,
        timeout=timeout,
        backoff=backoff,
        throttle=throttle,
    )
    return path


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
