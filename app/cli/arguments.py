"""What the `sangama` command's arguments mean: the parsers of its values (cuts, layers,
threads, sizes, times) and the sampling options. Each refusal is one line for a person."""

from __future__ import annotations

import argparse
from itertools import pairwise

from app.errors import ConfigError
from core.sampling_defaults import SamplingChoice
from core.types import LayerRange, SamplingParams


def parse_cuts(text: str) -> list[int]:
    """Cut points, checked for what holds for any model; the model's own layers and
    allowed boundaries are checked once it is read (core.model_inputs.stage_ranges)."""
    try:
        cuts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cuts must be integers like 0,6,12,18, not {text!r}"
        ) from None
    if len(cuts) < 2 or cuts[0] != 0:
        raise argparse.ArgumentTypeError(
            f"cuts start at 0 and end at the model's layer count, e.g. 0,6,12,18; got {text!r}"
        )
    if any(b <= a for a, b in pairwise(cuts)):
        raise argparse.ArgumentTypeError(
            f"cuts must strictly increase, e.g. 0,6,12,18; got {text!r}"
        )
    return cuts


def parse_layers(text: str) -> LayerRange:
    """START:STOP, a stage's layers [START, STOP); the model's bounds are checked later."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return LayerRange(int(start), int(stop))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"layers are START:STOP with 0 <= START < STOP, e.g. 6:12; got {text!r}"
        ) from None


def parse_token_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"token ids are integers separated by commas: {text!r}"
        ) from None
    if not ids or min(ids) < 0 or len(ids) > 1 << 16:
        raise argparse.ArgumentTypeError("give 1 to 65536 token ids, each 0 or more")
    return ids


def parse_row_budget(text: str) -> int:
    """Rows per engine step: 1..llama.cpp's batch (WorkerConfig.row_budget's default)."""
    from app.config import WorkerConfig  # here: it loads the QUIC library

    most = WorkerConfig.row_budget
    value = int(text) if text.strip().isdigit() else 0
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"row budget must be 1..{most}, not {text!r}")
    return value


def parse_cpus(text: str) -> str:
    from core.cpu_placement import CpuListError, parse_cpu_list

    try:
        parse_cpu_list(text)
    except CpuListError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def parse_threads(text: str) -> int:
    """A thread count, or "auto" (0: the worker measures which count is fastest)."""
    if text.strip().lower() == "auto":
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"threads must be auto or >= 1, not {text!r}")
    return value


def add_sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)


def add_chat_sampling(p: argparse.ArgumentParser) -> None:
    """Like add_sampling, but unset values are the model's recommendation."""
    g = p.add_argument_group("sampling (default: the model's recommended settings)")
    g.add_argument("--greedy", action="store_true", help="always the most likely token")
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--repeat-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)


def chat_sampling(args: argparse.Namespace) -> SamplingChoice:
    given = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repeat_penalty,
        "seed": args.seed,
    }
    return SamplingChoice(
        greedy=args.greedy,
        overrides=tuple((k, v) for k, v in given.items() if v is not None),
    )


def sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repeat_penalty,
        seed=args.seed,
    )


def parse_when(text: str | None) -> float:
    """An ISO date-time (a zone, else local time) -> Unix seconds; None -> 0 (not said)."""
    if text is None:
        return 0.0
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--available-until: {text!r} is not an ISO date-time") from None
    return when.timestamp()


def parse_bytes(text: str) -> int:
    """'12G', '512M', '0' -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise ConfigError(f"memory size must look like 12G or 512M, not {text!r}") from None
