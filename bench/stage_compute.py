"""Stage compute vs whole-model compute per decoded token (prints a table; --json one object).

The swarm's per-token compute is the sum of its stages' engine steps plus the last
stage's sampling; the whole model does the same work in one step. This measures both
side by side in one run, per token, split into:

- `decode_ms`: `llama_decode` alone (the model's own work);
- `step_ms`: `Stage.step`, what a worker reports as a stage's compute (batch building,
  checks, llama_decode, reading the hidden state or the logits out);
- `sample_ms`: the last stage turning its logits row into a token (core.sampling).

Two layouts: `inproc` (every stage in this process, one after the other: the engine's
own overhead) and `procs` (one process per stage, hidden states passed over pipes, as a
swarm on one machine runs them: adds what the processes cost each other, e.g. idle
threads spinning). Every process of `procs`, the whole model's too, waits for OpenMP
threads as a swarm's workers do (app.serving.machine.openmp: before that, its chain ran on
libgomp's default spin, 1.35x the whole model instead of 1.09x). Greedy and seeded top-k
sampling are both measured.

    .venv/bin/python bench/stage_compute.py [--json] [--tokens 32] [--threads 1] [--layout both]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

PROMPT = (
    "Volunteers around the world pool their home computers so that together they can run a "
    "language model far too large for any one of them."
)
SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "top-k 40": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 1},
}


@dataclass(frozen=True)
class StageJob:
    path: str
    start: int
    end: int
    n_layer: int
    threads: int
    n_ctx: int = 512


class StageServer:
    """One stage (or the whole model) answering step messages; samples if it is last."""

    def __init__(self, job: StageJob) -> None:
        from core.stage import Stage
        from core.types import LayerRange, StageSpec

        spec = StageSpec(
            LayerRange(job.start, job.end),
            job.n_layer,
            n_ctx=job.n_ctx,
            n_batch=64,
            n_seq_max=1,
            n_threads=job.threads,
        )
        self.stage = Stage.from_file(Path(job.path), spec)
        self.is_last = spec.is_last
        self.rng: np.random.Generator | None = None
        self.params: Any = None
        self.history: list[int] = []

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        from core.sampling import make_rng, sample
        from core.stage import StepFailure, StepRequest
        from core.types import SamplingParams

        kind = msg["kind"]
        if kind == "open":
            self.stage.open("b")
            self.params = SamplingParams(**msg["sampling"])
            self.rng = make_rng(self.params)
            self.history = []
            return {}
        if kind == "close":
            self.stage.close("b")
            return {}
        tokens = msg.get("tokens")
        req = StepRequest(
            "b",
            msg["start"],
            tokens=None if tokens is None else np.asarray(tokens, dtype=np.int32),
            hidden=msg.get("hidden"),
        )
        t0 = time.perf_counter()
        (res,) = self.stage.step([req])
        step_s = time.perf_counter() - t0
        if isinstance(res, StepFailure):
            raise res.error
        decode_s = getattr(self.stage.engine, "last_decode_s", float("nan"))
        reply: dict[str, Any] = {"step_ms": step_s * 1e3, "decode_ms": decode_s * 1e3}
        if tokens is not None:
            self.history.extend(tokens)
        if not self.is_last:
            reply["hidden"] = res.hidden
            return reply
        assert res.logits is not None and self.rng is not None
        t1 = time.perf_counter()
        tok = sample(res.logits[-1], self.params, self.rng, self.history)
        reply["sample_ms"] = (time.perf_counter() - t1) * 1e3
        reply["token"] = tok
        return reply

    def shutdown(self) -> None:
        self.stage.shutdown()


def _serve(job: StageJob, conn: Connection) -> None:
    from app.serving.machine.openmp import apply_stage_omp_settings

    apply_stage_omp_settings()  # before llama.cpp loads: threads wait as a worker's do
    server = StageServer(job)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        conn.send(server.handle(msg))
    server.shutdown()


def start_with_stage_omp_settings(proc: mp.process.BaseProcess) -> None:
    """Start a spawned child with the workers' OpenMP settings already in its environment.

    A spawned child imports the parent's main module before its target runs; where that
    module loads llama.cpp (bench/swarm.py does), libgomp reads the environment then, before
    `_serve` could set it, and the chain ran on libgomp's default spin (1.7-1.8x the whole
    model instead of 1.03-1.08). This process's own environment is as it was afterwards.
    """
    from app.serving.machine.openmp import STAGE_OMP_SETTINGS

    saved = {name: os.environ.get(name) for name in STAGE_OMP_SETTINGS}
    try:
        for name, value in STAGE_OMP_SETTINGS.items():
            os.environ.setdefault(name, value)
        proc.start()
    finally:
        for name, before in saved.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


class _Remote:
    def __init__(self, job: StageJob) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(job, child), daemon=True)
        start_with_stage_omp_settings(self.proc)
        if self.conn.recv() != "ready":
            raise RuntimeError("stage process did not start")

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.conn.send(msg)
        reply: dict[str, Any] = self.conn.recv()
        return reply

    def shutdown(self) -> None:
        self.conn.send(None)
        self.proc.join(30)


def _token(servers: list[Any], start: int, tokens: list[int]) -> list[dict[str, Any]]:
    msg: dict[str, Any] = {"kind": "step", "start": start, "tokens": tokens}
    replies = []
    for i, server in enumerate(servers):
        reply = server.handle(msg)
        replies.append(reply)
        if i + 1 < len(servers):
            # The next stage takes hidden states; the tokens go along for its history.
            msg = {"kind": "step", "start": start, "hidden": reply["hidden"]}
    return replies


def _generate(
    servers: list[Any], prompt: list[int], n_tokens: int, sampling: dict[str, Any]
) -> tuple[list[int], list[list[dict[str, Any]]]]:
    for s in servers:
        s.handle({"kind": "open", "sampling": sampling})
    try:
        replies = _token(servers, 0, prompt)
        tok = replies[-1]["token"]
        out, per_token = [tok], []
        for i in range(n_tokens):
            replies = _token(servers, len(prompt) + i, [tok])
            tok = replies[-1]["token"]
            out.append(tok)
            per_token.append(replies)
        return out, per_token
    finally:
        for s in servers:
            s.handle({"kind": "close"})


def _summary(per_token: list[list[dict[str, Any]]]) -> dict[str, Any]:
    n_stages = len(per_token[0])

    def med(key: str, i: int) -> float:
        return float(statistics.median(t[i].get(key, 0.0) for t in per_token))

    step = [med("step_ms", i) for i in range(n_stages)]
    decode = [med("decode_ms", i) for i in range(n_stages)]
    sample = med("sample_ms", n_stages - 1)
    return {
        "step_ms": step,
        "decode_ms": decode,
        "sample_ms": sample,
        "compute_ms": statistics.median(
            sum(r["step_ms"] for r in t) + t[-1]["sample_ms"] for t in per_token
        ),
    }


def measure(
    layout: str, args: argparse.Namespace, samplings: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The whole model and the chain, both loaded, run interleaved (`args.repeats` times
    each) under every sampling of `samplings` (default: SAMPLINGS)."""
    from core.models import resolve_model, stage_files
    from core.tokenizer import Tokenizer
    from core.types import LayerRange

    model = resolve_model(args.model)
    tok = Tokenizer.from_gguf(model)
    prompt = tok.encode(PROMPT)
    tok.close()
    cuts = [int(x) for x in args.cuts.split(",")]
    ranges = LayerRange.from_cuts(cuts)
    manifest, paths = stage_files(model, ranges)
    n_layer = manifest.facts.n_layer
    whole_jobs = [StageJob(str(model), 0, n_layer, n_layer, args.threads)]
    chain_jobs = [
        StageJob(str(p), r.start, r.stop, n_layer, args.threads)
        for p, r in zip(paths, ranges, strict=True)
    ]
    make = _Remote if layout == "procs" else StageServer
    # Both configurations stay loaded for the whole run, as a swarm's processes do.
    whole = [make(j) for j in whole_jobs]
    chain = [make(j) for j in chain_jobs]
    try:
        result: dict[str, Any] = {"layout": layout, "samplings": {}}
        for name, sampling in (SAMPLINGS if samplings is None else samplings).items():
            runs: dict[str, list[dict[str, Any]]] = {"whole": [], "chain": []}
            tokens: dict[str, list[int]] = {}
            _generate(whole, prompt, 4, sampling)  # warm-up: page in weights, build graphs
            _generate(chain, prompt, 4, sampling)
            for _ in range(args.repeats):  # interleaved: drift on a shared machine hits both
                for label, servers in (("whole", whole), ("chain", chain)):
                    toks, per_token = _generate(servers, prompt, args.tokens, sampling)
                    tokens[label] = toks
                    runs[label].append(_summary(per_token))
            best = {k: min(v, key=lambda s: s["compute_ms"]) for k, v in runs.items()}
            w, c = best["whole"], best["chain"]
            result["samplings"][name] = {
                "whole": w,
                "chain": c,
                "chain_vs_whole": c["compute_ms"] / w["compute_ms"],
                "same_tokens": tokens["whole"] == tokens["chain"],
            }
        return result
    finally:
        for s in [*whole, *chain]:
            s.shutdown()


def _full_chain(x: Any, params: Any, rng: np.random.Generator, history: list[int]) -> int:
    """The chain as `sample` ran it before its fast paths: every filter on the full vector."""
    from core.sampling import (
        apply_repetition_penalty,
        greedy,
        min_p_filter,
        softmax,
        top_k_filter,
        top_p_filter,
    )

    x = np.asarray(x, dtype=np.float32)
    if np.isnan(x).any() or np.isposinf(x).any() or not np.isfinite(x).any():
        raise ValueError("unusable logits")
    y = apply_repetition_penalty(x, history, params.repetition_penalty, params.repetition_window)
    if params.greedy:
        return greedy(y)
    y = min_p_filter(top_p_filter(top_k_filter(y, params.top_k), params.top_p), params.min_p)
    candidates = np.flatnonzero(np.isfinite(y))
    cumulative = np.cumsum(softmax(y[candidates], params.temperature))
    u = rng.random() * cumulative[-1]
    pick = min(int(np.searchsorted(cumulative, u, side="right")), candidates.size - 1)
    return int(candidates[pick])


def sampling_costs(n_vocab: int = 262_144, repeats: int = 30) -> dict[str, Any]:
    """ms per sampled token on one vocabulary-sized row: the old full-vector chain vs now."""
    from core.sampling import make_rng, sample
    from core.types import SamplingParams

    row = (np.random.default_rng(0).standard_normal(n_vocab) * 3).astype(np.float32)
    history = list(range(0, 4096, 64))
    out: dict[str, Any] = {}
    for name, kwargs in SAMPLINGS.items():
        params = SamplingParams(**kwargs)
        times: dict[str, float] = {}
        picks: dict[str, list[int]] = {}
        for label, fn in (("full_chain_ms", _full_chain), ("sample_ms", sample)):
            rng = make_rng(params)
            t0 = time.perf_counter()
            picks[label] = [fn(row, params, rng, history) for _ in range(repeats)]
            times[label] = (time.perf_counter() - t0) / repeats * 1e3
        out[name] = {**times, "same_tokens": picks["full_chain_ms"] == picks["sample_ms"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="gemma-3-270m", help="a bundled name or a GGUF")
    ap.add_argument("--cuts", default="0,6,12,18")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layout", choices=["inproc", "procs", "both", "none"], default="both")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    layouts = {"both": ["inproc", "procs"], "none": []}.get(args.layout, [args.layout])
    load_before = os.getloadavg()[0]
    costs = sampling_costs()
    results = [measure(layout, args) for layout in layouts]
    report = {
        "model": args.model,
        "cuts": args.cuts,
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "loadavg": [load_before, os.getloadavg()[0]],
        "sampling_one_row": costs,
        "layouts": results,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"Stage compute per token: {args.model}, cuts {args.cuts}, {args.threads} thread(s), "
        f"{args.tokens} tokens x {args.repeats} (best run, median token); "
        f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'layout':7} {'sampling':9} {'config':6} {'compute':>8} {'sample':>7}  "
        f"{'step ms per stage':24} {'llama_decode ms per stage':26} {'vs whole':>8} same"
    )
    for res in results:
        for name, row in res["samplings"].items():
            for label in ("whole", "chain"):
                r = row[label]
                steps = " / ".join(f"{x:.2f}" for x in r["step_ms"])
                decodes = " / ".join(f"{x:.2f}" for x in r["decode_ms"])
                ratio = f"{row['chain_vs_whole']:8.3f}" if label == "chain" else " " * 8
                same = ("yes" if row["same_tokens"] else "NO") if label == "chain" else ""
                print(
                    f"{res['layout']:7} {name:9} {label:6} {r['compute_ms']:8.2f} "
                    f"{r['sample_ms']:7.2f}  {steps:24} {decodes:26} {ratio} {same}"
                )
    print("sampling one 262k-entry row, ms per token: full-vector chain (before) vs sample()")
    for name, c in costs.items():
        print(
            f"  {name:9} {c['full_chain_ms']:7.2f} -> {c['sample_ms']:6.2f}"
            f"  same tokens: {'yes' if c['same_tokens'] else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
