"""`sangama pieces list|clear`: the model pieces this PC keeps, and freeing the disk of them.

Everything is read from the cache's folder (app.pieces_cache), so it works with no worker
running and no coordinator. "In use" is the stage this node last prepared, as the cache
records it: whether a worker serves it right now cannot be told cheaply from here, so
`clear` keeps it unless told `--all --yes`.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from pathlib import Path

from app import pieces_cache
from app.errors import PiecesError
from app.pieces_cache import CurrentStage, size_text
from app.pieces_eviction import CachedFile

Handler = Callable[[argparse.Namespace], int]


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Handler]:
    p = sub.add_parser("pieces", help="the model pieces this PC keeps: list them, free the disk")
    actions = p.add_subparsers(dest="pieces_command", required=True)
    listing = actions.add_parser("list", help="models in the cache: pieces, size, last use")
    clearing = actions.add_parser(
        "clear",
        help="delete cached pieces: all but the stage this node last prepared, unless --all",
    )
    clearing.add_argument("--model", default=None, metavar="NAME", help="only this model's")
    clearing.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="also the stage this node last prepared, which a running worker may be "
        "serving from (needs --yes)",
    )
    clearing.add_argument("--yes", action="store_true", help="confirm --all")
    for q in (listing, clearing):
        where = q.add_mutually_exclusive_group()
        where.add_argument(
            "--identity",
            type=Path,
            default=None,
            metavar="DIR",
            help="a joined node's identity dir (default: the one sangama join keeps)",
        )
        where.add_argument(
            "--cache",
            type=Path,
            default=None,
            metavar="DIR",
            help="the pieces folder itself (default: where the identity keeps its pieces)",
        )
    return {"pieces": cmd_pieces}


def cmd_pieces(args: argparse.Namespace) -> int:
    root = cache_root(args.identity, args.cache)
    if args.pieces_command == "list":
        print(list_text(root))
        return 0
    current = pieces_cache.current_stage(root)
    if args.everything and not args.yes:
        raise PiecesError(
            "--all also deletes the stage this node last prepared"
            + (f" ({_stage_text(current)})" if current is not None else "")
            + ", which a running worker may be serving from, and this command cannot tell "
            "whether one runs: stop the worker first, then add --yes"
        )
    print(clear_text(root, pieces_cache.clear(root, args.model, args.everything)))
    return 0


def cache_root(identity: Path | None, cache: Path | None) -> Path:
    if cache is not None:
        return cache
    from app.identity import default_identity_dir

    return pieces_cache.pieces_root(identity or default_identity_dir())


def list_text(root: Path) -> str:
    uses = pieces_cache.model_uses(root)
    if not uses:
        return f"No pieces in {root}."
    current = pieces_cache.current_stage(root)
    rows = [("MODEL", "PIECES", "SIZE", "LAST USED", "IN USE")]
    for u in uses:
        in_use = "-"
        if u.in_use and current is not None and current.model == u.model:
            in_use = f"{current.layers} ({_count(u.in_use, 'file')})"
        rows.append((u.model, str(u.pieces), size_text(u.size), _when(u.last_used), in_use))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"Pieces in {root}: {_count(len(uses), 'model')}, {size_text(sum(u.size for u in uses))} "
        f"(the default cap here now: {size_text(pieces_cache.default_cap(root, _files(root)))})"
    ]
    for r in rows:
        lines.append(
            "  ".join(
                cell.rjust(w) if i in (1, 2) else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    if current is not None:
        lines.append("In use: the stage this node last prepared; a worker running now serves it.")
    return "\n".join(lines)


def clear_text(root: Path, cleared: pieces_cache.Cleared) -> str:
    removed = cleared.removed
    models = len({f.model for f in removed})
    lines = [
        f"Deleted {_count(len(removed), 'file')} ({size_text(_bytes(removed))}) of "
        f"{_count(models, 'model')} from {root}."
        if removed
        else f"Nothing to delete in {root}."
    ]
    if cleared.kept and cleared.current is not None:
        lines.append(
            f"Kept {_count(len(cleared.kept), 'file')} ({size_text(_bytes(cleared.kept))}): "
            f"{_stage_text(cleared.current)}, the stage this node last prepared (a running "
            "worker may be serving it); --all --yes deletes them too."
        )
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _stage_text(current: CurrentStage) -> str:
    return f"{current.layers} of {current.model}"


def _files(root: Path) -> list[CachedFile]:
    return pieces_cache.cached_files(root)


def _bytes(files: tuple[CachedFile, ...]) -> int:
    return sum(f.size for f in files)


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
