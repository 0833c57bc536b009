"""What a per-layer norm range could catch that the fixed row checks do not.

A stage refuses incoming rows that are not finite, all zeros, or over a norm ceiling of
1e10 (app/serving/steps/row_checks.py). A tighter range, measured per layer, would also
refuse rows whose norm is merely unusual. This measures, per model, at several layer
boundaries, on the prompts of 16 chat questions and one long text:

- the honest spread of row norms there (min, median, max; the first position's row,
  the attention sink, apart from the rest), which a range must admit to stay free of
  false alarms;
- for single-bit flips (every bit of random values of random rows, uniform): the share
  the fixed checks refuse, the share whose row norm leaves that boundary's honest
  [min, max] (the most any range measured from honest rows could add, with no margin),
  and the share that move the norm by less than 0.1 % (no range can see them);
- for the test liar's noise (a normal draw of 0.1 % of each row's RMS): the norm change.

See docs/decisions/row-bounds.md.

    .venv/bin/python bench/row_bounds.py [--model default] [--flips 4000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.serving.chaos_lies import NOISE_SCALE
from app.serving.steps.row_checks import check_rows
from bench.batch_invariance import QUESTIONS
from core.gguf_reader import open_gguf
from core.gguf_slices import read_facts
from core.models import resolve_model, stage_files
from core.stage import Stage, StepRequest, StepResult
from core.tokenizer import Tokenizer
from core.types import LayerRange, StageSpec

F32 = npt.NDArray[np.float32]
LONG_TEXT = " ".join(
    [
        "The river rose through the night, and by morning the lower town was under water.",
        "People carried what they could to the church on the hill, where the bells rang",
        "every hour so that those still out in boats could find their way.",
    ]
    * 8
)


def rows_at(model: Path, boundary: int, n_layer: int, prompts: list[list[int]]) -> list[F32]:
    """Each prompt's rows after layers [0, boundary), as the next stage receives them."""
    longest = max(len(p) for p in prompts)
    layers = LayerRange(0, boundary)
    _manifest, (path,) = stage_files(model, [layers])
    spec = StageSpec(layers, n_layer, n_ctx=max(512, longest), n_batch=512, n_seq_max=1)
    stage = Stage.from_file(path, spec)
    out: list[F32] = []
    try:
        for i, prompt in enumerate(prompts):
            stage.open(f"p{i}")
            (result,) = stage.step([StepRequest(f"p{i}", 0, tokens=np.asarray(prompt, np.int32))])
            assert isinstance(result, StepResult) and result.hidden is not None, result
            out.append(result.hidden.copy())
            stage.close(f"p{i}")
    finally:
        stage.shutdown()
    return out


def spread(rows: list[F32]) -> dict[str, float]:
    norms = np.concatenate([np.linalg.norm(r[1:].astype(np.float64), axis=1) for r in rows])
    sinks = np.asarray([np.linalg.norm(r[0].astype(np.float64)) for r in rows])
    return {
        "min": float(norms.min()),
        "median": float(np.median(norms)),
        "max": float(norms.max()),
        "first_position_min": float(sinks.min()),
        "first_position_median": float(np.median(sinks)),
        "first_position_max": float(sinks.max()),
    }


def flips(rows: list[F32], honest: tuple[float, float], n: int, seed: int) -> dict[str, float]:
    """Shares of `n` random single-bit flips refused by the fixed checks, outside the
    honest range `honest`, and moving the row norm by under 0.1 %."""
    rng = np.random.default_rng(seed)
    fixed = outside = unseen = 0
    lo, hi = honest
    for _ in range(n):
        block = rows[int(rng.integers(len(rows)))]
        row = block[int(rng.integers(block.shape[0]))].copy()
        before = float(np.linalg.norm(row.astype(np.float64)))
        column, bit = int(rng.integers(row.shape[0])), int(rng.integers(32))
        row.view(np.uint32)[column] ^= np.uint32(1 << bit)
        with np.errstate(all="ignore"):
            if check_rows(row[None, :]) is not None:
                fixed += 1
                continue
            after = float(np.linalg.norm(row.astype(np.float64)))
        if not lo <= after <= hi:
            outside += 1
        if abs(after - before) < 1e-3 * before:
            unseen += 1
    return {
        "fixed_checks": fixed / n,
        "outside_range": outside / n,
        "norm_unmoved": unseen / n,
    }


def noise_change(rows: list[F32], seed: int) -> float:
    """The median relative norm change the test liar's noise makes."""
    rng = np.random.default_rng(seed)
    changes = []
    for block in rows:
        rms = np.sqrt(np.mean(np.square(block, dtype=np.float64), axis=1, keepdims=True))
        noisy = block + rng.normal(0.0, 1.0, block.shape) * rms * NOISE_SCALE
        before = np.linalg.norm(block.astype(np.float64), axis=1)
        changes.append(np.abs(np.linalg.norm(noisy, axis=1) - before) / before)
    return float(np.median(np.concatenate(changes)))


def measure(name: str, n_flips: int) -> dict[str, Any]:
    model = resolve_model(name)
    tokenizer = Tokenizer.from_gguf(model)
    prompts = [tokenizer.encode_chat([("user", q)]) for q in QUESTIONS]
    prompts.append(tokenizer.encode_chat([("user", LONG_TEXT)]))
    n_layer = read_facts(open_gguf(model)).n_layer
    cuts = sorted({1, n_layer // 4, n_layer // 2, 3 * n_layer // 4, n_layer - 1})
    found = []
    for i, boundary in enumerate(cuts):
        rows = rows_at(model, boundary, n_layer, prompts)
        honest = spread(rows)
        lowest = min(honest["min"], honest["first_position_min"])
        every = (lowest, max(honest["max"], honest["first_position_max"]))
        found.append(
            {
                "boundary": boundary,
                **honest,
                **flips(rows, every, n_flips, seed=i),
                "noise_norm_change": noise_change(rows, seed=i),
            }
        )
    return {"model": model.name, "n_layer": n_layer, "boundaries": found}


HEADER = (
    "| after layer | row norm min / median / max | first position median / max "
    "| flips: fixed checks | outside honest range | norm moved < 0.1 % | noise: norm change |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="default, a bundled name or a path")
    parser.add_argument("--flips", type=int, default=4000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(m, args.flips) for m in (args.model or ["default", "gemma-3-270m"])]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for res in results:
        print(f"{res['model']} ({res['n_layer']} layers)")
        print(HEADER)
        print("|---" * HEADER.count("|", 1) + "|")
        for b in res["boundaries"]:
            print(
                f"| {b['boundary']} | {b['min']:.3g} / {b['median']:.3g} / {b['max']:.3g} "
                f"| {b['first_position_median']:.3g} / {b['first_position_max']:.3g} "
                f"| {b['fixed_checks']:.1%} | {b['outside_range']:.1%} "
                f"| {b['norm_unmoved']:.1%} | {b['noise_norm_change']:.2%} |"
            )


if __name__ == "__main__":
    main()
