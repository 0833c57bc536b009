"""Engine benchmark: whole model vs the same model chained as stages, for each engine build.

Prints a table like the seeds' and, with --json, one JSON object. Measures decode
ms/token and a 64-token prefill, split per stage, with the C capture callback and the
Python one. Each engine build runs in its own process, one after the other in the same
run: the shipped wheel (run-time CPU dispatch, .venv), the shipped wheel with weight
repacking off (what the blanket AMX work-around would have cost), and a -march=native
build (.venv-native, from `make engine-native`) where it exists. Not a test: numbers
depend on the machine.

    .venv/bin/python bench/engine.py [--model gemma-3-270m] [--cuts 0,6,12,18] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.lab.local_run import build_pipeline
from core.llama_engine import c_capture_available
from core.models import resolve_model, stage_files
from core.pipeline import LocalPipeline
from core.tokenizer import Tokenizer
from core.types import LayerRange

PROMPT = (
    "Volunteers around the world pool their home computers so that together they can run a "
    "language model far too large for any one of them. Each machine holds a few layers, and "
    "the hidden state of every token travels from one machine to the next until the last "
    "one picks the next word and sends it straight back to the person who asked the question."
)


def _measure(pipe: LocalPipeline, prompt: list[int], n_tokens: int, repeats: int) -> dict[str, Any]:
    prefill, decode, per_stage_prefill, per_stage_decode = [], [], [], []
    for _ in range(repeats):
        pipe.open("b")
        try:
            pipe.reset_timers()
            t0 = time.perf_counter()
            logits = pipe.forward("b", 0, prompt)
            t1 = time.perf_counter()
            prefill.append(t1 - t0)
            per_stage_prefill.append(list(pipe.stage_seconds))
            pipe.reset_timers()
            tok = int(logits[-1].argmax())
            t1 = time.perf_counter()
            for i in range(n_tokens):
                tok = int(pipe.forward("b", len(prompt) + i, [tok])[-1].argmax())
            decode.append((time.perf_counter() - t1) / n_tokens)
            per_stage_decode.append([s / n_tokens for s in pipe.stage_seconds])
        finally:
            pipe.close("b")
    best = min(range(repeats), key=lambda k: decode[k])
    return {
        "prefill_ms": statistics.median(prefill) * 1e3,
        "prefill_stage_ms": [s * 1e3 for s in per_stage_prefill[best]],
        "decode_ms_per_token": statistics.median(decode) * 1e3,
        "decode_stage_ms": [s * 1e3 for s in per_stage_decode[best]],
        "decode_tokens_per_s": 1.0 / statistics.median(decode),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--cuts", default="0,6,12,18")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one-build", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.one_build:
        return _all_builds(args)

    model = resolve_model(args.model)
    tok = Tokenizer.from_gguf(model)
    prompt = tok.encode(PROMPT)[:64]
    tok.close()
    cuts = [int(x) for x in args.cuts.split(",")]
    ranges = LayerRange.from_cuts(cuts)
    manifest, paths = stage_files(model, ranges)
    n_layer = manifest.facts.n_layer
    n_ctx = 512

    configs: list[tuple[str, list[Path], list[LayerRange], bool]] = [
        ("whole model", [model], [LayerRange(0, n_layer)], True),
        (f"{len(ranges)} stages, C capture", paths, ranges, True),
        (f"{len(ranges)} stages, Python capture", paths, ranges, False),
    ]
    if not c_capture_available():
        configs = [c for c in configs if "C capture" not in c[0]]
    rows = []
    # Interleave configurations across repeats so drift on a shared machine hits all alike.
    pipes = {
        name: build_pipeline(p, r, n_layer, n_ctx, 64, args.threads, c) for name, p, r, c in configs
    }
    try:
        for _ in range(2):  # warm-up: page in weights, build graphs
            for pipe in pipes.values():
                _measure(pipe, prompt, 4, 1)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in pipes}
        for _ in range(args.repeats):
            for name, pipe in pipes.items():
                results[name].append(_measure(pipe, prompt, args.tokens, 1))
    finally:
        for pipe in pipes.values():
            pipe.shutdown()
    for name, _, r, _ in configs:
        runs = results[name]
        best = min(runs, key=lambda x: x["decode_ms_per_token"])
        rows.append(
            {
                "config": name,
                "ranges": [str(x) for x in r],
                "decode_ms_per_token": statistics.median(x["decode_ms_per_token"] for x in runs),
                "decode_tokens_per_s": statistics.median(x["decode_tokens_per_s"] for x in runs),
                "prefill_64_ms": statistics.median(x["prefill_ms"] for x in runs),
                "decode_stage_ms": best["decode_stage_ms"],
                "prefill_stage_ms": best["prefill_stage_ms"],
            }
        )

    whole = rows[0]["decode_ms_per_token"]
    for row in rows:
        row["decode_vs_whole"] = whole / row["decode_ms_per_token"]
    from core.backends import backend_report

    backend = backend_report()
    report = {
        "build": f"CPU {backend.cpu_variant}"
        + (", dynamic" if backend.dynamic else ", built-in")
        + (", batch-variant" if os.environ.get("SANGAMA_BATCH_VARIANT") == "1" else ""),
        "disabled_buffer_types": list(backend.disabled_buffer_types),
        "model": model.name,
        "cuts": cuts,
        "threads": args.threads,
        "decode_tokens": args.tokens,
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"Engine benchmark: {model.name}, cuts {cuts}, {args.threads} threads, "
        f"{args.tokens} decode tokens x {args.repeats} (median)"
    )
    print(
        f"{'configuration':34} {'decode ms/tok':>13} {'tok/s':>7} {'vs whole':>8} "
        f"{'prefill 64':>10}  per-stage decode ms"
    )
    for row in rows:
        per = " / ".join(f"{x:.2f}" for x in row["decode_stage_ms"])
        print(
            f"{row['config']:34} {row['decode_ms_per_token']:13.2f} "
            f"{row['decode_tokens_per_s']:7.1f} "
            f"{row['decode_vs_whole']:8.2f} {row['prefill_64_ms']:8.1f} ms  {per}"
        )
    return 0


ROOT = Path(__file__).resolve().parent.parent


def _builds() -> list[tuple[str, str, dict[str, str]]]:
    """(label, interpreter, extra environment) of every build to measure, shipped first."""
    shipped = str(ROOT / ".venv" / "bin" / "python")
    if not Path(shipped).exists():
        shipped = sys.executable
    builds = [
        ("shipped", shipped, {}),
        ("shipped, batch-variant", shipped, {"SANGAMA_BATCH_VARIANT": "1"}),
    ]
    native = ROOT / ".venv-native" / "bin" / "python"
    if native.exists():
        builds.append(("native", str(native), {}))
    return builds


def _all_builds(args: argparse.Namespace) -> int:
    passthrough = [
        "--model",
        args.model,
        "--cuts",
        args.cuts,
        "--tokens",
        str(args.tokens),
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
    ]
    reports = []
    for label, python, extra in _builds():
        env = {**os.environ, **extra}
        out = subprocess.run(
            [python, __file__, "--one-build", "--json", *passthrough],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        report = json.loads(out)
        report["label"] = label
        reports.append(report)
    whole = reports[0]["rows"][0]["decode_ms_per_token"]
    for report in reports:
        for row in report["rows"]:
            row["decode_vs_shipped_whole"] = whole / row["decode_ms_per_token"]
    if args.json:
        print(json.dumps({"builds": reports}, indent=1))
        return 0
    first = reports[0]
    print(
        f"Engine benchmark: {first['model']}, cuts {first['cuts']}, {args.threads} threads, "
        f"{args.tokens} decode tokens x {args.repeats} (median); one process per build"
    )
    print(
        f"{'build':36} {'configuration':30} {'decode ms/tok':>13} {'tok/s':>7} "
        f"{'vs shipped':>10} {'prefill 64':>10}"
    )
    for report in reports:
        name = f"{report['label']} ({report['build'].split(',')[0]})"
        for row in report["rows"]:
            print(
                f"{name:36} {row['config']:30} {row['decode_ms_per_token']:13.2f} "
                f"{row['decode_tokens_per_s']:7.1f} {row['decode_vs_shipped_whole']:10.2f} "
                f"{row['prefill_64_ms']:8.1f} ms"
            )
    disabled = first["disabled_buffer_types"]
    print(f"weight layouts refused: {', '.join(disabled) if disabled else 'none on this CPU'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
