"""What a replay's exact shapes cost one stage: a replay's N generated rows evaluated one
at a time (app.serving.steps.replay_rows, N one-row decodes) against in one decode (as a
replay sent them before app.session.replay_shapes), side by side, on one third of a model's
layers (a stage of a three-stage chain: the first, a middle, the last; the last keeps
the final row's logits only in both).

Each figure is the median over `--repeats` replays of N rows after a prompt of
`--prompt` tokens (evaluated first, not timed), on a fresh session each time.

    python -m bench.replay_shapes [--model GGUF] [--prompt 295] [--rows 5,24,100]
                                  [--threads 2] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.serving.steps.replay_rows import rows_one_by_one
from core.models import default_model_path, stage_files
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange


def _stages(model: Path, threads: int, n_ctx: int) -> list[Stage]:
    from gguf import GGUFReader

    from core.gguf_slices import read_facts
    from core.types import StageSpec

    n_layer = read_facts(GGUFReader(model)).n_layer
    cuts = [round(i * n_layer / 3) for i in range(4)]
    ranges = LayerRange.from_cuts(cuts)
    _, paths = stage_files(model, ranges)
    return [
        Stage.from_file(
            p,
            StageSpec(
                r, n_layer, n_ctx=n_ctx, n_batch=512, n_seq_max=2, n_threads=threads, use_gpu=False
            ),
        )
        for p, r in zip(paths, ranges, strict=True)
    ]


def _inputs(stage: Stage, n: int, rng: np.random.Generator) -> dict[str, Any]:
    if stage.spec.is_first:
        return {"tokens": rng.integers(0, stage.engine.n_vocab, n).astype(np.int32)}
    return {"hidden": rng.standard_normal((n, stage.engine.n_embd)).astype(np.float32)}


def _one(stage: Stage, prompt: int, rows: int, alone: bool, rng: np.random.Generator) -> float:
    stage.open("r")
    try:
        (res,) = stage.step([StepRequest("r", 0, **_inputs(stage, prompt, rng))])
        assert isinstance(res, StepResult)
        req = StepRequest("r", prompt, **_inputs(stage, rows, rng))
        started = time.perf_counter()
        out = rows_one_by_one(stage, req) if alone else stage.step([req])[0]
        took = time.perf_counter() - started
        assert isinstance(out, StepResult), out
        return took * 1e3
    finally:
        stage.close("r")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2 135M)")
    ap.add_argument("--prompt", type=int, default=295)
    ap.add_argument("--rows", default="5,24,100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [int(x) for x in a.rows.split(",")]
    stages = _stages(a.model or default_model_path(), a.threads, 1024)
    rng = np.random.default_rng(0)
    table: list[dict[str, Any]] = []
    try:
        for n in rows:
            for i, stage in enumerate(stages):
                batched, alone = [], []
                _one(stage, a.prompt, n, False, rng)  # warm-up: first decodes of a shape
                _one(stage, a.prompt, n, True, rng)  # allocate its graph
                for _ in range(a.repeats):  # interleaved: the machine's load hits both alike
                    batched.append(_one(stage, a.prompt, n, False, rng))
                    alone.append(_one(stage, a.prompt, n, True, rng))
                mb, ma = statistics.median(batched), statistics.median(alone)
                table.append(
                    {
                        "rows": n,
                        "stage": ["first", "middle", "last"][i],
                        "one_decode_ms": mb,
                        "one_by_one_ms": ma,
                        "ratio": ma / mb,
                    }
                )
    finally:
        for stage in stages:
            stage.shutdown()
    load = Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"
    if a.json:
        print(json.dumps({"prompt": a.prompt, "threads": a.threads, "load": load, "rows": table}))
        return 0
    print(f"{'rows':>5} {'stage':6} {'one decode':>11} {'one by one':>11} {'ratio':>6}")
    for r in table:
        print(
            f"{r['rows']:5} {r['stage']:6} {r['one_decode_ms']:8.1f} ms "
            f"{r['one_by_one_ms']:8.1f} ms {r['ratio']:6.2f}"
        )
    print(f"after a {a.prompt}-token prompt, {a.threads} threads, load {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
