"""Where a node keeps the model pieces it downloads (and the stage file made from them), and
how much of the volunteer's disk they may take.

Pieces are a cache: verified against the manifest, fetched again when missing. The desktop
app's default identity keeps them in the user cache dir (~/.cache/sangama/pieces on Linux),
which is where installers/README.md says they are and what `apt purge` with
/etc/sangama/purge-user-data removes; settings and identity stay in the config dir. A node
started with its own identity directory (`--identity-dir`, several nodes on one machine,
tests) keeps its pieces inside that directory, so such nodes never share half-written files.

The model name comes from the coordinator (an assignment, a route): it must be one safe
path component (coordinator.names), or a coordinator could have files written anywhere.

The cache has a cap (the volunteer's, else app.pieces_eviction.default_pieces_cap).
Before a stage's pieces are downloaded, `make_room` deletes files of stages this node no
longer serves, least recently used first (app.pieces_eviction.plan_eviction), or raises
PiecesCacheFull when the stage cannot fit. "Used" is recorded by the app itself, never
read from atime (often off or coarse): each model folder has a `last_used.json` that
`make_room` stamps for the stage it prepares, and the cache's `current.json` names that
stage, which `sangama pieces` keeps unless told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import PiecesCacheFull, PiecesError
from app.identity import default_identity_dir
from app.pieces_eviction import CachedFile, Eviction, default_pieces_cap, plan_eviction
from coordinator.names import check_name, name_problem
from core.manifest import MANIFEST_FILE, Manifest, PieceInfo
from core.models import cache_dir
from core.types import LayerRange

log = logging.getLogger(__name__)

LAST_USED_FILE = "last_used.json"
"""Per model folder: {"files": {path: unix seconds}}, stamped when a stage is prepared."""
CURRENT_FILE = "current.json"
"""In the cache's root: the stage this node last prepared (served, or stood by for)."""
STAGES = "stages"
"""The model folder's sub-folder for stage files (app.serving.serve.prepare_stage_file)."""
PART = ".part"
"""What downloads and the stage assembly write to before renaming into place."""
_BOOKKEEPING = frozenset({MANIFEST_FILE, LAST_USED_FILE})


def pieces_root(identity_dir: Path) -> Path:
    """The folder holding every model's pieces folder for the node of `identity_dir`."""
    if identity_dir.resolve() == default_identity_dir().resolve():
        return cache_dir() / "pieces"
    return identity_dir / "pieces"


def pieces_dir(identity_dir: Path, model: str) -> Path:
    """The folder for `model`'s pieces of the node whose identity lives in `identity_dir`.
    UnsafeName (a CoordinatorError) when `model` is not one safe path component."""
    check_name(model, "model name")
    return pieces_root(identity_dir) / model


@dataclass(frozen=True)
class CurrentStage:
    """The stage this node last prepared, as `current.json` records it."""

    model: str
    layers: LayerRange
    files: frozenset[str]

    @property
    def keys(self) -> frozenset[tuple[str, str]]:
        return frozenset((self.model, f) for f in self.files)


def stage_files(manifest: Manifest, layers: LayerRange) -> tuple[list[PieceInfo], str]:
    """The pieces a stage needs and its stage file's path in the model folder."""
    from core.gguf_slices import stage_file_name  # here: it loads numpy and gguf

    return manifest.pieces_for(layers), f"{STAGES}/{stage_file_name(manifest.facts, layers)}"


def make_room(
    identity_dir: Path,
    model: str,
    manifest: Manifest,
    layers: LayerRange,
    cap_bytes: int = 0,
    *,
    now: float | None = None,
) -> Eviction:
    """Before the pieces of `layers` are downloaded: evict files of other stages, least
    recently used first, until the cache plus what this stage still needs (missing
    pieces, and the stage file built from them) fits `cap_bytes` (0: the default share
    of the disk); then stamp this stage's files as used now. PiecesCacheFull, deleting
    nothing, when it cannot fit."""
    root = pieces_root(identity_dir)
    folder = pieces_dir(identity_dir, model)
    pieces, stage = stage_files(manifest, layers)
    used = [p.file for p in pieces] + [stage]
    own = frozenset(used + [f + PART for f in used])
    cached = cached_files(root)
    cap = cap_bytes if cap_bytes > 0 else default_cap(root, cached)
    plan = plan_eviction(
        cached, frozenset((model, f) for f in own), cap, _still_needed(folder, pieces, stage)
    )
    if not plan.fits:
        raise PiecesCacheFull(
            _full_message(model, layers, plan, cap, cap_bytes), plan.used_after, cap
        )
    if plan.evict:
        log.info(
            "evicting %d files (%s) of stages no longer served, to stay under the %s cap",
            len(plan.evict),
            size_text(sum(f.size for f in plan.evict)),
            size_text(cap),
        )
        remove_files(root, plan.evict, keep_model=model)
    folder.mkdir(parents=True, exist_ok=True)
    record_use(folder, used, time.time() if now is None else now)
    _write_json(
        root / CURRENT_FILE,
        {"model": model, "layers": [layers.start, layers.stop], "files": sorted(own)},
    )
    return plan


def _full_message(model: str, layers: LayerRange, plan: Eviction, cap: int, asked: int) -> str:
    whose = "" if asked > 0 else " (the default: half the free disk space)"
    return (
        f"the pieces cache cannot hold {layers} of {model}: they need {size_text(plan.used_after)} "
        f"on disk (the pieces and the stage file built from them), over the cap of "
        f"{size_text(cap)}{whose}; raise the cap (the app's Settings, 'Disk for model "
        f"pieces', or `sangama worker --pieces-cap {flag_size(plan.used_after)}`) or free "
        f"disk space"
    )


def _still_needed(folder: Path, pieces: Sequence[PieceInfo], stage: str) -> int:
    """Bytes this stage still adds to the cache: what its pieces lack (a part resumes
    where it stopped), and the stage file, about as large as its pieces, unless built."""
    needed = 0
    for p in pieces:
        final = _size(folder / p.file)
        have = final if final is not None else _size(folder / (p.file + PART)) or 0
        needed += 0 if final == p.size else max(0, p.size - min(have, p.size))
    if _size(folder / stage) is None:
        needed += sum(p.size for p in pieces)
    return needed


def default_cap(root: Path, cached: Iterable[CachedFile] = ()) -> int:
    """The cap when the volunteer set none, from the disk the cache is on, now."""
    usage = shutil.disk_usage(_existing(root))
    return default_pieces_cap(usage.free, usage.total, sum(f.size for f in cached))


def disk_total(root: Path) -> int:
    """The size of the disk the cache is on."""
    return shutil.disk_usage(_existing(root)).total


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def cached_files(root: Path) -> list[CachedFile]:
    """Every piece, part and stage file in the cache, with when it was last used (its
    `last_used.json` entry, else its write time)."""
    files = []
    for folder in _model_folders(root):
        stamps = _last_used(folder)
        for path, size, written in _files_of(folder):
            files.append(CachedFile(folder.name, path, size, stamps.get(path, written)))
    return files


def _model_folders(root: Path) -> list[Path]:
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    # A folder whose name could not come from a coordinator is not the cache's.
    return sorted(
        Path(e.path)
        for e in entries
        if e.is_dir(follow_symlinks=False) and name_problem(e.name) is None
    )


def _files_of(folder: Path) -> Iterator[tuple[str, int, float]]:
    for sub, prefix in ((folder, ""), (folder / STAGES, f"{STAGES}/")):
        try:
            entries = list(os.scandir(sub))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            if not e.is_file(follow_symlinks=False) or (not prefix and e.name in _BOOKKEEPING):
                continue
            st = e.stat(follow_symlinks=False)
            yield prefix + e.name, st.st_size, st.st_mtime


def _last_used(folder: Path) -> dict[str, float]:
    doc = _read_json(folder / LAST_USED_FILE)
    stamps = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(stamps, dict):
        return {}
    return {
        k: float(v)
        for k, v in stamps.items()
        if isinstance(k, str) and isinstance(v, int | float) and math.isfinite(v)
    }


def record_use(folder: Path, paths: Iterable[str], now: float) -> None:
    """Stamp `paths` (relative to the model folder) as used at `now`; entries of files
    that are gone are dropped, so the record stays as small as the folder."""
    present = {path for path, _size, _t in _files_of(folder)}
    stamps = {k: v for k, v in _last_used(folder).items() if k in present}
    stamps.update(dict.fromkeys(paths, now))
    _write_json(folder / LAST_USED_FILE, {"files": stamps})


def current_stage(root: Path) -> CurrentStage | None:
    """The stage this node last prepared, or None (never, or the record is unreadable)."""
    doc = _read_json(root / CURRENT_FILE)
    try:
        model, (start, stop), files = doc["model"], doc["layers"], doc["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            return None
        if name_problem(model) is not None:
            return None
        return CurrentStage(model, LayerRange(int(start), int(stop)), frozenset(files))
    except (KeyError, TypeError, ValueError):
        return None


def remove_files(root: Path, files: Iterable[CachedFile], keep_model: str | None = None) -> None:
    """Delete `files`; a model folder left with no cached file goes too (its manifest and
    record), unless it is `keep_model`'s (its stage is about to be downloaded)."""
    touched: set[str] = set()
    for f in files:
        try:
            (root / f.model / f.path).unlink(missing_ok=True)
        except OSError as exc:  # Windows: a file another program holds open
            log.warning("could not delete %s from the pieces cache: %s", f.path, exc)
        touched.add(f.model)
    for model in sorted(touched - {keep_model}):
        folder = root / model
        if any(True for _ in _files_of(folder)):
            continue
        for name in _BOOKKEEPING:
            (folder / name).unlink(missing_ok=True)
        # rmdir, never rmtree: anything the cache did not write stays, with its folder.
        with contextlib.suppress(OSError):
            (folder / STAGES).rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


@dataclass(frozen=True)
class Cleared:
    removed: tuple[CachedFile, ...]
    kept: tuple[CachedFile, ...]
    """Files of the stage this node last prepared, left in place."""
    current: CurrentStage | None


def clear(root: Path, model: str | None = None, everything: bool = False) -> Cleared:
    """Delete the cache's files (of `model` only, when given), except those of the stage
    this node last prepared unless `everything`."""
    cached = cached_files(root)
    if model is not None:
        check_name(model, "model name")
        if not (root / model).is_dir():
            raise PiecesError(f"no pieces of model {model!r} in {root}")
        cached = [f for f in cached if f.model == model]
    current = current_stage(root)
    keep = current.keys if current is not None and not everything else frozenset()
    removed = tuple(f for f in cached if f.key not in keep)
    remove_files(root, removed)
    if everything and current is not None and model in (None, current.model):
        (root / CURRENT_FILE).unlink(missing_ok=True)
    return Cleared(removed, tuple(f for f in cached if f.key in keep), current)


@dataclass(frozen=True)
class ModelUse:
    """One model's share of the cache, as `sangama pieces list` shows it."""

    model: str
    pieces: int
    """Complete pieces (not parts, not stage files)."""
    size: int
    """Bytes of every file: pieces, parts and stage files."""
    last_used: float
    in_use: int
    """Files of the stage this node last prepared."""


def model_uses(root: Path) -> list[ModelUse]:
    current = current_stage(root)
    keep = current.keys if current is not None else frozenset()
    by_model: dict[str, list[CachedFile]] = {}
    for f in cached_files(root):
        by_model.setdefault(f.model, []).append(f)
    return [
        ModelUse(
            model,
            sum(1 for f in files if "/" not in f.path and not f.path.endswith(PART)),
            sum(f.size for f in files),
            max(f.last_used for f in files),
            sum(1 for f in files if f.key in keep),
        )
        for model, files in sorted(by_model.items())
    ]


def cache_size(root: Path) -> int:
    return sum(f.size for f in cached_files(root))


def size_text(n_bytes: int) -> str:
    """Bytes as a person reads them: "512 B", "3.4 MiB", "41.2 GiB"."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def flag_size(n_bytes: int) -> str:
    """A size for `--pieces-cap` at least `n_bytes`, rounded up: "42G", "180M"."""
    if n_bytes >= 1 << 30:
        return f"{math.ceil(n_bytes / (1 << 30))}G"
    return f"{max(1, math.ceil(n_bytes / (1 << 20)))}M"


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, path)
