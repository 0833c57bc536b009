"""Slicing as one stream: memory that does not grow with the model.

The source (one GGUF, or every shard of a gguf-split set, core.gguf_shards) is read once,
front to back, with plain chunked reads into one reusable buffer (`readinto`, CHUNK
bytes at a time) — never through a memory map, whose pages would stay resident: slicing
a 6 GB file through gguf-py's np.memmap held 5.7 GB. Each chunk goes to the sha256 of
the source and, when it belongs to a tensor, is written straight on to its piece (plain
chunked writes; the piece's sha256 follows along, so no piece is read back). Behind the
cursor, posix_fadvise(DONTNEED) tells the kernel the source's pages will not be read
again, so a 220 GB model does not push everything else out of the page cache.

This works because llama.cpp's layout is sequential: a GGUF's tensor data follow the
header in the header's order (gguf_shards checks it), and a piece's tensors are a
subsequence of the model's, in the same order. So each piece is written front to back
too, and only the pieces whose tensors are under the cursor are open.

Pieces are GGUF files byte-for-byte as gguf-py's GGUFWriter writes them (what the slicer
used before): the GGUF v3 header, general.architecture first, then the source's metadata
entries in file order, copied as raw bytes (the encoding GGUFWriter would give the same
values), tensor infos with offsets padded to the alignment, and each tensor's bytes
followed by zeros up to the alignment. The alignment is the source's (general.alignment
travels with the metadata; GGUF's default 32 otherwise). split.* keys are dropped: they
describe the published files, not a piece (gguf_layout.key_role).

Resuming: each piece is written to `<file>.part` and renamed when complete, then
recorded in `slice-journal.jsonl` (sha256 and size, under the source's file names,
sizes and modification times). A later run over the same source keeps a piece the
journal names when the file on disk has that size and sha256, and rewrites every other
one; a `.part` left by an interrupted run is simply written again. The journal is removed
once manifest.json is written.

The manifest's `source`: for one file, its sha256 and size; for a shard set, the sha256
of the shards' bytes one after the other in shard order (`cat NAME-*-of-*.gguf |
sha256sum`) and their total size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import Protocol

from core import gguf_layout as layout
from core.errors import SliceError, UnsupportedModelError
from core.gguf_shards import SourceModel, TensorSpan, model_stem, open_source
from core.gguf_slices import read_facts
from core.manifest import (
    BLOCK,
    EMBEDDING,
    HEAD,
    MANIFEST_FILE,
    MTP,
    SHARED,
    Manifest,
    PieceInfo,
    block_piece_name,
    sha256_file,
)
from core.types import ModelFacts

CHUNK = 8 << 20
"""Bytes per read: large enough that a read costs little beyond its copy."""
_DROP_BEHIND = 256 << 20
"""How far the cursor moves between posix_fadvise(DONTNEED) calls on the source."""
JOURNAL_FILE = "slice-journal.jsonl"
JOURNAL_FORMAT = "sangama-slice-journal/1"
PART_SUFFIX = ".part"

GGUF_MAGIC = 0x46554747  # b"GGUF" read as a little-endian u32
GGUF_VERSION = 3
_GGUF_STRING = 8  # GGUFValueType.STRING
_ARCH_KEY = "general.architecture"
_TOKENIZER_PREFIX = "tokenizer."
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")

SliceProgress = Callable[[int, int], None]
"""Called as bytes of the source are read: (bytes read so far, total bytes)."""


# ---------------------------------------------------------------- piece layout (pure)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _gguf_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def gguf_header(
    arch: str, kv: Sequence[bytes], tensors: Sequence[TensorSpan], alignment: int
) -> bytes:
    """Everything of a GGUF file before its first tensor's bytes, as GGUFWriter writes
    it: magic, version, counts, general.architecture, the given metadata entries (raw),
    the tensor infos (offsets packed in order, each padded to `alignment`), and zeros up
    to `alignment`."""
    out = bytearray(struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, len(tensors), len(kv) + 1))
    out += _gguf_string(_ARCH_KEY) + struct.pack("<I", _GGUF_STRING) + _gguf_string(arch)
    for entry in kv:
        out += entry
    offset = 0
    for t in tensors:
        out += _gguf_string(t.name) + struct.pack("<I", len(t.dims))
        out += b"".join(struct.pack("<Q", d) for d in t.dims)
        out += struct.pack("<IQ", t.ggml_type, offset)
        offset += _pad(t.n_bytes, alignment)
    out += bytes(_pad(len(out), alignment) - len(out))
    return bytes(out)


@dataclass(frozen=True)
class PiecePlan:
    """One piece to write: its manifest identity, tensors and exact bytes before data."""

    name: str
    kind: str
    layer: int | None
    tensors: tuple[TensorSpan, ...]
    header: bytes
    size: int

    @property
    def file(self) -> str:
        return f"{self.name}.gguf"


def piece_kv(source: SourceModel, with_tokenizer: bool) -> list[bytes]:
    """The metadata entries a piece carries: the source's, but for general.architecture
    (written first by the header), split.* (the published files' layout) and, outside the
    embedding piece, the tokenizer."""
    out = []
    for key, raw in source.kv:
        if key == _ARCH_KEY or layout.key_role(source.architecture, key) == layout.DROP:
            continue
        if with_tokenizer or not key.startswith(_TOKENIZER_PREFIX):
            out.append(raw)
    return out


def plan_pieces(source: SourceModel, facts: ModelFacts) -> list[PiecePlan]:
    """The pieces of the model in manifest order: embedding, one per trunk block, head,
    then shared and MTP pieces for models that have such tensors."""
    blocks: dict[int, list[TensorSpan]] = {i: [] for i in range(facts.n_layer)}
    by_place: dict[str, list[TensorSpan]] = {EMBEDDING: [], HEAD: [], SHARED: [], MTP: []}
    n_all = facts.n_layer + facts.n_mtp_layers
    for t in source.tensors:
        place = layout.tensor_place(facts.architecture, t.name)
        m = _BLOCK_TENSOR.match(t.name)
        if place == layout.BLOCK and m and int(m.group(1)) in blocks:
            blocks[int(m.group(1))].append(t)
        elif place == layout.BLOCK and m and int(m.group(1)) < n_all:
            by_place[MTP].append(t)  # the MTP block: the last stage's alone
        elif place == layout.BLOCK:
            raise SliceError(f"tensor {t.name!r} names a block beyond block_count")
        else:
            by_place[place].append(t)

    groups: list[tuple[str, str, int | None, list[TensorSpan]]] = [
        (EMBEDDING, EMBEDDING, None, by_place[EMBEDDING]),
        *((block_piece_name(i), BLOCK, i, blocks[i]) for i in range(facts.n_layer)),
        (HEAD, HEAD, None, by_place[HEAD]),
    ]
    if by_place[SHARED]:  # only models with global per-layer tensors get this piece
        groups.append((SHARED, SHARED, None, by_place[SHARED]))
    if by_place[MTP]:
        groups.append((MTP, MTP, None, by_place[MTP]))
    kv_plain = piece_kv(source, with_tokenizer=False)
    kv_embedding = piece_kv(source, with_tokenizer=True)
    plans = []
    for name, kind, layer, tensors in groups:
        kv = kv_embedding if kind == EMBEDDING else kv_plain
        header = gguf_header(source.architecture, kv, tensors, source.alignment)
        size = len(header) + sum(_pad(t.n_bytes, source.alignment) for t in tensors)
        plans.append(PiecePlan(name, kind, layer, tuple(tensors), header, size))
    return plans


# ---------------------------------------------------------------- the journal


def source_identity(source: SourceModel) -> list[list[object]]:
    """What a journal is valid for: the source files' names, sizes and mtimes."""
    return [[f.path.name, f.size, f.mtime_ns] for f in source.files]


def read_journal(out_dir: Path, identity: list[list[object]]) -> dict[str, tuple[str, int]]:
    """Pieces a previous run over the same source completed: file -> (sha256, size).
    A journal of another source, or an unreadable one, is ignored; a torn last line (the
    run was killed while writing it) is skipped."""
    done: dict[str, tuple[str, int]] = {}
    try:
        lines = (Path(out_dir) / JOURNAL_FILE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return done
    try:
        head = json.loads(lines[0]) if lines else {}
    except ValueError:
        return done
    if head.get("format") != JOURNAL_FORMAT or head.get("source") != identity:
        return done
    for line in lines[1:]:
        try:
            entry = json.loads(line)
            done[str(entry["file"])] = (str(entry["sha256"]), int(entry["size"]))
        except (ValueError, KeyError, TypeError):
            continue
    return done


class _Journal:
    """The record of completed pieces, one line each, flushed as each piece is renamed."""

    def __init__(self, out_dir: Path, identity: list[list[object]]) -> None:
        self._path = Path(out_dir) / JOURNAL_FILE
        self._file = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._file.write(json.dumps({"format": JOURNAL_FORMAT, "source": identity}) + "\n")
        self._file.flush()

    def record(self, file: str, sha256: str, size: int) -> None:
        self._file.write(json.dumps({"file": file, "sha256": sha256, "size": size}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def remove(self) -> None:
        self.close()
        self._path.unlink(missing_ok=True)


def kept_pieces(
    out_dir: Path, plans: Sequence[PiecePlan], journal: dict[str, tuple[str, int]]
) -> dict[str, str]:
    """Pieces already on disk as this run would write them: file -> sha256. A piece is kept
    when the journal names it with the planned size and the file has that size and sha256."""
    kept = {}
    for plan in plans:
        entry = journal.get(plan.file)
        path = Path(out_dir) / plan.file
        if entry is None or entry[1] != plan.size:
            continue
        try:
            if path.stat().st_size != plan.size:
                continue
        except OSError:
            continue
        if sha256_file(path) == entry[0]:
            kept[plan.file] = entry[0]
    return kept


# ---------------------------------------------------------------- the copy


class _Sink(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


class _PieceWriter:
    """One piece being written to its .part file, hashed as it goes."""

    def __init__(self, out_dir: Path, plan: PiecePlan) -> None:
        self.plan = plan
        self.final = Path(out_dir) / plan.file
        self.part = self.final.with_name(plan.file + PART_SUFFIX)
        self._file: FileIO = open(self.part, "wb", buffering=0)  # noqa: SIM115 - see finish()
        self._hash = hashlib.sha256()
        self._written = 0
        self._remaining = len(plan.tensors)
        self.update(plan.header)

    def update(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        view = memoryview(data)
        while view:  # a raw write may take less than it was given
            n = self._file.write(view)
            if n is None or n <= 0:
                raise OSError(f"cannot write {self.part}")
            view = view[n:]
        self._written += len(data)

    def tensor_done(self, n_bytes: int, alignment: int) -> bool:
        """Pad after a tensor; True when it was the piece's last."""
        self.update(bytes(_pad(n_bytes, alignment) - n_bytes))
        self._remaining -= 1
        return self._remaining == 0

    def finish(self) -> tuple[str, int]:
        self._file.close()
        if self._written != self.plan.size:
            raise SliceError(
                f"piece {self.plan.name}: wrote {self._written} bytes, planned {self.plan.size}"
            )
        os.replace(self.part, self.final)
        return self._hash.hexdigest(), self._written

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


class _SourceReader:
    """One source file read front to back into a reusable buffer, every byte passed to
    the source's sha256 and to the sinks given; the kernel told to drop what is behind."""

    def __init__(
        self,
        path: Path,
        buf: bytearray,
        source_hash: _Sink,
        counted: Callable[[int], None],
    ) -> None:
        self._path = path
        self._file: FileIO = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        self._fd = self._file.fileno()
        self._view = memoryview(buf)
        self._hash = source_hash
        self._counted = counted
        self.pos = 0
        self._dropped = 0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def copy(self, n: int, sink: _Sink | None) -> None:
        while n > 0:
            got = self._file.readinto(self._view[: min(n, len(self._view))])
            if not got:
                raise SliceError(f"{self._path} ended at byte {self.pos} while being read")
            chunk = self._view[:got]
            self._hash.update(chunk)
            if sink is not None:
                sink.update(chunk)
            n -= got
            self.pos += got
            self._counted(got)
            if hasattr(os, "posix_fadvise") and self.pos - self._dropped >= _DROP_BEHIND:
                os.posix_fadvise(self._fd, 0, self.pos, os.POSIX_FADV_DONTNEED)
                self._dropped = self.pos

    def close(self) -> None:
        self._file.close()


def _copy_all(
    source: SourceModel,
    plans: Sequence[PiecePlan],
    out_dir: Path,
    kept: dict[str, str],
    journal: _Journal,
    progress: SliceProgress | None,
) -> tuple[dict[str, tuple[str, int]], str]:
    """Read every source file once; write every piece not kept. Returns file -> (sha256,
    size) for every piece, and the source's sha256."""
    owner = {t.name: plan for plan in plans for t in plan.tensors if plan.file not in kept}
    results = {p.file: (kept[p.file], p.size) for p in plans if p.file in kept}
    open_pieces: dict[str, _PieceWriter] = {}
    source_hash = hashlib.sha256()
    buf = bytearray(CHUNK)
    total, done = source.size, 0

    def counted(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    def finish(writer: _PieceWriter) -> None:
        sha, size = writer.finish()
        results[writer.plan.file] = (sha, size)
        journal.record(writer.plan.file, sha, size)

    try:
        for empty in plans:  # pieces without tensors: their header is all of them
            if not empty.tensors and empty.file not in kept:
                finish(_PieceWriter(out_dir, empty))
        for index, f in enumerate(source.files):
            reader = _SourceReader(f.path, buf, source_hash, counted)
            try:
                for t in (t for t in source.tensors if t.shard == index):
                    reader.copy(t.offset - reader.pos, None)  # header, padding
                    plan = owner.get(t.name)
                    writer = None
                    if plan is not None:
                        writer = open_pieces.get(plan.file)
                        if writer is None:
                            writer = open_pieces[plan.file] = _PieceWriter(out_dir, plan)
                    reader.copy(t.n_bytes, writer)
                    if writer is not None and writer.tensor_done(t.n_bytes, source.alignment):
                        finish(open_pieces.pop(writer.plan.file))
                reader.copy(f.size - reader.pos, None)  # the last tensor's padding
            finally:
                reader.close()
    finally:
        for writer in open_pieces.values():
            writer.abandon()  # its .part stays: the next run writes it again
    if open_pieces:
        raise SliceError(f"pieces left unfinished: {sorted(open_pieces)}")
    return results, source_hash.hexdigest()


def slice_streamed(
    model_path: Path,
    out_dir: Path,
    name: str = "",
    progress: SliceProgress | None = None,
) -> Manifest:
    """Cut the model at `model_path` (one GGUF, or the first shard of a gguf-split set)
    into pieces under `out_dir`, resuming an interrupted run, and write manifest.json."""
    model_path, out_dir = Path(model_path), Path(out_dir)
    source, reader = open_source(model_path)
    if source.architecture not in layout.ARCH_RULES:
        raise UnsupportedModelError(
            f"{model_path.name} is a {source.architecture!r} model, an architecture not "
            "checked for exact layer cuts; Sangama slices: "
            + ", ".join(layout.supported_architectures())
        )
    try:
        facts = read_facts(reader, name or model_stem(model_path))
    except (TypeError, ValueError, KeyError) as exc:  # a key missing, or of the wrong type
        raise SliceError(f"{model_path}: metadata is missing or malformed ({exc!r})") from exc
    del reader  # its mapping: metadata only, and not needed past this point
    plans = plan_pieces(source, facts)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A manifest from an earlier run would describe pieces this run may be replacing.
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)
    identity = source_identity(source)
    kept = kept_pieces(out_dir, plans, read_journal(out_dir, identity))
    journal = _Journal(out_dir, identity)
    for plan in plans:  # a second interruption must not forget them
        if plan.file in kept:
            journal.record(plan.file, kept[plan.file], plan.size)
    try:
        results, source_sha = _copy_all(source, plans, out_dir, kept, journal, progress)
    except BaseException:
        journal.close()
        raise
    pieces = tuple(PieceInfo(p.name, p.file, p.kind, p.layer, *results[p.file]) for p in plans)
    manifest = Manifest(facts, pieces, source_sha, source.size)
    manifest.save(out_dir)
    journal.remove()
    return manifest
