"""A 3-stage chain on the GPU against the same chain on the CPU: tokens, tok/s, VRAM per stage.

Run by bench/gpu_check.sh on a machine with a GPU (it may have no network: everything
it needs is in the repository and the venv carried with it). Without the default model
(too large to carry) it writes a random-weight model big enough to keep a GPU busy.

    python bench/gpu_check.py [--model PATH|gemma-3-270m] [--cuts 0,6,12,18] [--tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.lab.local_run import build_pipeline
from core.backends import backend_report
from core.models import resolve_model, stage_files
from core.pipeline import LocalPipeline
from core.types import LayerRange


def _model(arg: str, scratch: Path) -> Path:
    if arg != "random":
        try:
            return resolve_model(arg)
        except Exception as exc:  # the model package is not carried to GPU machines
            print(f"model {arg!r} unavailable ({exc}); using a random-weight model")
    from tests.support.tiny_models import write_tiny_model

    scratch.mkdir(parents=True, exist_ok=True)
    return write_tiny_model(
        scratch / "gpu-check.gguf",
        n_layer=18,
        n_embd=1024,
        n_head=16,
        n_head_kv=4,
        n_ff=4096,
        n_vocab=8192,
    )


def _greedy(pipe: LocalPipeline, prompt: list[int], n: int) -> tuple[list[int], float]:
    pipe.open("g")
    try:
        tok = int(pipe.forward("g", 0, prompt)[-1].argmax())
        out = [tok]
        t0 = time.perf_counter()
        for i in range(n - 1):
            tok = int(pipe.forward("g", len(prompt) + i, [tok])[-1].argmax())
            out.append(tok)
        return out, (n - 1) / (time.perf_counter() - t0)
    finally:
        pipe.close("g")


def _stage_rows(pipe: LocalPipeline) -> list[dict[str, Any]]:
    rows = []
    for stage in pipe.stages:
        engine: Any = stage.engine
        plan = engine.offload
        rows.append(
            {
                "layers": str(stage.spec.layers),
                "backend": engine.backend.describe(plan),
                "gpu_layers": plan.layers_on_device,
                "planned_device_mib": plan.device_bytes / 2**20,
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--cuts", default="0,6,12,18")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/sangama-gpu-check"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    report = backend_report()
    model = _model(args.model, args.scratch)
    cuts = [int(x) for x in args.cuts.split(",")]
    ranges = LayerRange.from_cuts(cuts)
    manifest, paths = stage_files(model, ranges)
    n_layer = manifest.facts.n_layer
    prompt = list(range(1, 33))
    result: dict[str, Any] = {
        "model": model.name,
        "cuts": cuts,
        "devices": [d.__dict__ for d in report.devices],
        "cpu_variant": report.cpu_variant,
    }
    for label, use_gpu in (("cpu", False), ("gpu", True)):
        free_before = {d.name: d.free_bytes for d in _fresh_devices()}
        pipe = build_pipeline(paths, ranges, n_layer, 512, 64, args.threads, True, use_gpu)
        try:
            free_after = {d.name: d.free_bytes for d in _fresh_devices()}
            _greedy(pipe, prompt, 4)  # warm-up: graphs, first uploads
            tokens, tps = _greedy(pipe, prompt, args.tokens)
            result[label] = {
                "tokens": tokens,
                "tokens_per_s": tps,
                "stages": _stage_rows(pipe),
                "device_mib_taken": {
                    name: (free_before[name] - free_after.get(name, 0)) / 2**20
                    for name in free_before
                    if name != "CPU"
                },
            }
        finally:
            pipe.shutdown()
    same = result["cpu"]["tokens"] == result["gpu"]["tokens"]
    on_gpu = all(row["gpu_layers"] > 0 for row in result["gpu"]["stages"])
    result["tokens_equal"] = same
    result["every_stage_on_gpu"] = on_gpu
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"GPU check: {model.name}, cuts {cuts}, CPU variant {report.cpu_variant}")
        for label in ("cpu", "gpu"):
            r = result[label]
            print(
                f"  {label}: {r['tokens_per_s']:.1f} tok/s; device MiB taken "
                f"{ {k: round(v) for k, v in r['device_mib_taken'].items()} }"
            )
            for row in r["stages"]:
                print(
                    f"    {row['layers']:>10}  {row['backend']:48} "
                    f"planned {row['planned_device_mib']:.0f} MiB"
                )
        print(f"  greedy tokens equal: {same}; every stage on the GPU: {on_gpu}")
    return 0 if same and on_gpu else 1


def _fresh_devices() -> list[Any]:
    # The report is cached at start-up; memory must be read now.
    from core.backends import current_devices

    return current_devices()


if __name__ == "__main__":
    raise SystemExit(main())
