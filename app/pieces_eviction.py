"""How much disk the pieces cache may take, and which files to drop to stay under it (pure).

A volunteer's disk is theirs: pieces of stages this node no longer serves are a cache that
may go, least recently used first, to make room for the stage it is assigned now. Files
of the current stage are never chosen. Nothing here reads the disk or the clock: the
shell (app.pieces_cache) hands in what is there and when each file was last used, and
deletes what the plan names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_SHARE = 0.5
"""By default the cache may take half of the space that is free or already its own."""
KEEP_FREE_SHARE = 0.1
"""...and never so much that less than this share of the whole disk stays free."""


def default_pieces_cap(free_bytes: int, total_bytes: int, cache_bytes: int = 0) -> int:
    """The cap when the volunteer set none: half of what is free plus what the cache
    already holds (its own files count as room, or the cap would shrink as it fills and
    evict what it just downloaded), and never past the point where less than a tenth of
    the disk would stay free."""
    room = max(0, free_bytes) + max(0, cache_bytes)
    share = int(room * DEFAULT_SHARE)
    floor_free = int(max(0, total_bytes) * KEEP_FREE_SHARE)
    return max(0, min(share, room - floor_free))


@dataclass(frozen=True)
class CachedFile:
    """One file of the cache: a piece, a part of one, or a stage file built from them."""

    model: str
    path: str
    """Relative to the model's folder: "blk.003.gguf", "stages/m.0-4.gguf"."""
    size: int
    last_used: float
    """Unix seconds: when a stage needing it was last prepared (else its write time)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.path)


@dataclass(frozen=True)
class Eviction:
    """What to delete before downloading, and whether the stage then fits under the cap."""

    evict: tuple[CachedFile, ...]
    """Oldest first; empty when nothing needs to go, or when even all of it would not do."""
    fits: bool
    used_after: int
    """Bytes the cache holds once the evictions are done and the stage is downloaded
    (when it fits; else with every evictable file gone)."""
    short_by: int
    """Bytes past the cap even with every file of other stages gone; 0 when it fits."""
    kept_bytes: int
    """Bytes of the current stage's files already in the cache (never evicted)."""


def plan_eviction(
    cached: Iterable[CachedFile],
    keep: frozenset[tuple[str, str]],
    cap_bytes: int,
    needed_bytes: int,
) -> Eviction:
    """The files to delete so that the cache plus `needed_bytes` (still to download or
    build) stays within `cap_bytes`: files not in `keep` ((model, path) of the current
    stage), least recently used first, as few as do. When even deleting all of them
    would not make room, nothing is deleted: the caller refuses the stage instead."""
    files = list(cached)
    used = sum(f.size for f in files)
    needed = max(0, needed_bytes)
    kept_bytes = sum(f.size for f in files if f.key in keep)
    if used + needed <= cap_bytes:
        return Eviction((), True, used + needed, 0, kept_bytes)
    candidates = sorted(
        (f for f in files if f.key not in keep),
        # Oldest first; among equals the larger file first (fewer deletions), then by name
        # so that the same cache always gives the same plan.
        key=lambda f: (f.last_used, -f.size, f.model, f.path),
    )
    floor = used - sum(f.size for f in candidates) + needed
    if floor > cap_bytes:
        return Eviction((), False, floor, floor - cap_bytes, kept_bytes)
    chosen: list[CachedFile] = []
    total = used + needed
    for f in candidates:
        if total <= cap_bytes:
            break
        chosen.append(f)
        total -= f.size
    return Eviction(tuple(chosen), True, total, 0, kept_bytes)
