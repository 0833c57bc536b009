"""A model registered by URL: planned from its published headers, its pieces hashed from
the mirror's bytes, served by the mirror with the coordinator as the fallback.

`sangama coordinator --model https://…/model.gguf` (or the first shard of a gguf-split
set) reads only each published file's header over HTTP range requests (at most
mirror_reads.MAX_HEADER_BYTES each), plans the pieces slicing would write
(core.published_model), and streams each piece's bytes from the mirror once to hash it.
The manifest then says where each piece's tensor bytes lie (core.piece_sources), so
volunteers fetch them from the mirror and the coordinator's uplink carries only piece
headers.

Nothing is kept but the manifest (and, with --keep-pieces, the pieces): the coordinator
still answers `GET …/pieces/{file}` for a volunteer whose mirror failed, by building
the asked bytes from the piece's header (in memory) and the mirror's ranges. A manifest
already made for the same files (URLs and sizes) is reused: no second hashing pass.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests
from starlette.responses import Response, StreamingResponse

from coordinator.errors import ModelNotHostable
from coordinator.mirror_reads import (
    MAX_HEADER_BYTES,
    MirrorError,
    RangeOptions,
    piece_bytes,
    read_remote_header,
)
from core.errors import CoreError, SliceError
from core.gguf_stream import PART_SUFFIX, PiecePlan
from core.manifest import Manifest
from core.piece_sources import Mirror, MirrorFile, check_url
from core.published_model import (
    plan_published,
    published_manifest,
    shard_urls,
    split_count,
)

log = logging.getLogger(__name__)

HASH_PARALLEL = 4
"""Pieces hashed at once: a few ranges in flight keep a long link busy."""
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class RemotePieces:
    """What serving a registered model's pieces needs: each piece's header and ranges."""

    mirror: Mirror
    headers: dict[str, bytes]
    """Piece file -> the piece's header bytes."""
    names: dict[str, str]
    """Piece file -> piece name."""
    sizes: dict[str, int]
    session: requests.Session
    timeout: float = 30.0

    def stream(self, file: str, start: int, stop: int) -> Iterator[bytes]:
        """Bytes [start, stop) of the piece `file`: header from memory, the rest from the
        mirror. MirrorError when the mirror fails (the response is then cut short, and the
        volunteer's sha256 check refuses the piece)."""
        header = self.headers[file]
        ranges = self.mirror.ranges(self.names[file])
        if ranges is None:
            raise SliceError(f"no ranges for piece {file!r}")

        def from_memory(a: int, b: int) -> Iterator[bytes]:
            yield header[a:b]

        opts = RangeOptions(timeout=self.timeout)
        yield from piece_bytes(self.session, self.mirror, ranges, start, stop, from_memory, opts)


def requested_range(value: str | None, size: int) -> tuple[int, int] | None:
    """[start, stop) of a single `bytes=a-b` or `bytes=a-` range within `size`; None for
    no Range header (the whole piece). ValueError for one that cannot be served (416)."""
    if value is None:
        return None
    m = _RANGE.match(value.strip())
    if m is None:
        raise ValueError(f"unsupported range {value[:64]!r}")
    start = int(m.group(1))
    stop = min(int(m.group(2)) + 1, size) if m.group(2) else size
    if start >= size or stop <= start:
        raise ValueError(f"range {value[:64]!r} outside the piece's {size} bytes")
    return start, stop


def piece_response(remote: RemotePieces, file: str, range_header: str | None) -> Response:
    """The answer to `GET …/pieces/{file}` for a piece the coordinator has no copy of: the
    whole piece, or the one range asked (a volunteer's header, or a resumed download)."""
    size = remote.sizes[file]
    try:
        window = requested_range(range_header, size)
    except ValueError:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
    start, stop = window or (0, size)
    headers = {"Content-Length": str(stop - start), "Accept-Ranges": "bytes"}
    if window is not None:
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    return StreamingResponse(
        remote.stream(file, start, stop),
        status_code=206 if window is not None else 200,
        headers=headers,
        media_type="application/octet-stream",
    )


def is_url(model: str) -> bool:
    return model.startswith(("https://", "http://"))


def register(
    url: str,
    data_dir: Path,
    *,
    keep_pieces: bool = False,
    session: requests.Session | None = None,
    timeout: float = 30.0,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> tuple[str, Path, Manifest, RemotePieces]:
    """Plan and hash the model published at `url`: its name, the folder its manifest (and
    kept pieces) live in, the manifest, and what serving its pieces needs.
    ModelNotHostable for a URL that is not a model Sangama can serve, or a mirror that
    cannot be read."""
    http = session or requests.Session()
    try:
        check_url(url)
        first, first_bytes, first_size = read_remote_header(
            http, url, max_header_bytes=max_header_bytes, timeout=timeout
        )
        no, count = split_count(first)
        if no != 0:
            raise SliceError(f"{url} is shard {no + 1} of {count}: give the first shard")
        urls = shard_urls(url, count) if count > 1 else (url,)
        headers = [(first, first_bytes)]
        sizes = [first_size]
        for other in urls[1:]:
            h, raw, size = read_remote_header(
                http, other, max_header_bytes=max_header_bytes, timeout=timeout
            )
            headers.append((h, raw))
            sizes.append(size)
        files = tuple(MirrorFile(u, s) for u, s in zip(urls, sizes, strict=True))
        facts, plans, mirror = plan_published(files, headers)
    except (CoreError, MirrorError) as exc:
        raise ModelNotHostable(f"--model {url}: {exc}") from exc
    remote = RemotePieces(
        mirror,
        {p.file: p.header for p in plans},
        {p.file: p.name for p in plans},
        {p.file: p.size for p in plans},
        http,
        timeout,
    )
    folder = data_dir / "models" / "remote" / hashlib.sha256(url.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _known(folder, facts.name, plans, mirror)
    if manifest is None:
        try:
            sha = _hash_all(remote, plans, folder if keep_pieces else None)
        except MirrorError as exc:
            raise ModelNotHostable(f"--model {url}: cannot read its pieces: {exc}") from exc
        manifest = published_manifest(facts, plans, mirror, sha)
        manifest.save(folder)
    elif keep_pieces:
        _keep(remote, plans, folder)
    return facts.name, folder, manifest, remote


def _known(folder: Path, name: str, plans: list[PiecePlan], mirror: Mirror) -> Manifest | None:
    """The manifest made earlier for these very files and pieces, if any."""
    try:
        old = Manifest.load(folder)
    except SliceError:
        return None
    same = (
        old.mirror is not None
        and old.mirror == mirror
        and old.facts.name == name
        and [(p.name, p.size) for p in old.pieces] == [(p.name, p.size) for p in plans]
    )
    return old if same else None


def _hash_all(remote: RemotePieces, plans: list[PiecePlan], keep: Path | None) -> dict[str, str]:
    """Each piece's sha256 from one read of its bytes, written to `keep` too if given."""

    def one(plan: PiecePlan) -> tuple[str, str]:
        digest = hashlib.sha256()
        part = None if keep is None else keep / (plan.file + PART_SUFFIX)
        out = None if part is None else open(part, "wb")  # noqa: SIM115 - closed below
        try:
            for chunk in remote.stream(plan.file, 0, plan.size):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
        finally:
            if out is not None:
                out.close()
        if part is not None and keep is not None:
            part.replace(keep / plan.file)
        log.info("hashed piece %s from the mirror", plan.name)
        return plan.name, digest.hexdigest()

    with ThreadPoolExecutor(HASH_PARALLEL, thread_name_prefix="hash") as pool:
        return dict(pool.map(one, plans))


def _keep(remote: RemotePieces, plans: list[PiecePlan], folder: Path) -> None:
    missing = [p for p in plans if not (folder / p.file).is_file()]
    if missing:
        _hash_all(remote, missing, folder)


def local_piece(folder: Path, file: str, size: int) -> Path | None:
    """The kept copy of a piece, if the coordinator has one of the right size."""
    path = folder / file
    try:
        return path if path.stat().st_size == size else None
    except OSError:
        return None
