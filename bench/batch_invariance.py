"""The same answer alone and batched? N sessions on one whole-model stage, greedy.

Each session runs alone, then all N run in lockstep (their prompts in one decode, then
one row of each per decode); counted: sessions whose tokens, and whose every step's
logits, equal the alone run's. Side by side, each in a process of its own (ggml reads
its kernel switches once per process): `batch-variant` (SANGAMA_BATCH_VARIANT=1: one KV
cache shared by all sessions, the repacked layouts' 4-row kernel, the tiled matmul) and
`default` (a KV stream per session, batch-invariant kernels); `--gpu` adds the default
on the GPU backend (Vulkan device 0: Mesa's lavapipe where there is no GPU). See
docs/decisions/batch-invariance.md.

    .venv/bin/python bench/batch_invariance.py [--sessions 16] [--model default] [--gpu]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.gguf_reader import open_gguf
from core.gguf_slices import read_facts
from core.models import resolve_model
from core.stage import Stage, StepRequest, StepResult
from core.tokenizer import Tokenizer
from core.types import LayerRange, StageSpec

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain gravity to a child.",
    "List three colors.",
    "Why is the sky blue?",
    "Name a famous painter.",
    "What is 2+2?",
    "Tell me a joke.",
    "How do plants grow?",
    "What is Python?",
    "Describe the sea.",
    "Who wrote Hamlet?",
    "What is a star?",
    "Give me a recipe idea.",
    "What is rain?",
    "Say hello.",
)
Run = tuple[dict[int, list[int]], dict[int, list[np.ndarray]]]


def _run(stage: Stage, prompts: list[list[int]], ids: list[int], new: int) -> Run:
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    logits: dict[int, list[np.ndarray]] = {i: [] for i in ids}
    for i in ids:
        stage.open(f"s{i}")
    reqs = [StepRequest(f"s{i}", 0, tokens=np.asarray(prompts[i], np.int32)) for i in ids]
    for _ in range(new):
        results = stage.step(reqs)
        reqs = []
        for i, res in zip(ids, results, strict=True):
            assert isinstance(res, StepResult) and res.logits is not None
            row = res.logits[-1]
            tok = int(np.argmax(row))
            logits[i].append(row.copy())
            tokens[i].append(tok)
            start = len(prompts[i]) + len(tokens[i]) - 1
            reqs.append(StepRequest(f"s{i}", start, tokens=np.asarray([tok], np.int32)))
    for i in ids:
        stage.close(f"s{i}")
    return tokens, logits


MODES = ("batch-variant", "default")


def measure(model: Path, sessions: int, new: int, gpu: bool) -> dict[str, Any]:
    """In this process, as its environment says (SANGAMA_BATCH_VARIANT)."""
    tokenizer = Tokenizer.from_gguf(model)
    prompts = [
        tokenizer.encode_chat([("user", QUESTIONS[i % len(QUESTIONS)] + " " * (i // 16))])
        for i in range(sessions)
    ]
    n = read_facts(open_gguf(model)).n_layer
    slots = max(sessions, 2)
    spec = StageSpec(
        LayerRange(0, n), n, n_ctx=512 * slots, n_batch=512, n_seq_max=slots, use_gpu=gpu
    )
    stage = Stage.from_file(model, spec)
    try:
        t0 = time.perf_counter()
        alone = [_run(stage, prompts, [i], new) for i in range(sessions)]
        t_alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens, logits = _run(stage, prompts, list(range(sessions)), new)
        t_batched = time.perf_counter() - t0
        device = "GPU" if stage.engine.offload.on_gpu else "CPU"  # type: ignore[attr-defined]
    finally:
        stage.shutdown()
    same = sum(alone[i][0][i] == tokens[i] for i in range(sessions))
    exact = sum(
        all(np.array_equal(a, b) for a, b in zip(alone[i][1][i], logits[i], strict=True))
        for i in range(sessions)
    )
    return {
        "device": device,
        "sessions": sessions,
        "same_tokens": same,
        "bit_identical_logits": exact,
        "alone_s": round(t_alone, 2),
        "batched_s": round(t_batched, 2),
    }


def _in_own_process(mode: str, gpu: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("SANGAMA_BATCH_VARIANT", None)
    if mode == "batch-variant":
        env["SANGAMA_BATCH_VARIANT"] = "1"
    if gpu:
        # ggml skips CPU-type Vulkan devices (lavapipe) unless named
        env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    else:
        env["SANGAMA_DEVICE"] = "cpu"
    cmd = [sys.executable, __file__, "--only", mode, "--model", args.model]
    cmd += ["--sessions", str(args.sessions), "--tokens", str(args.tokens)]
    out = subprocess.run(
        cmd + (["--gpu"] if gpu else []), env=env, check=True, stdout=subprocess.PIPE
    )
    row: dict[str, Any] = json.loads(out.stdout)
    row["mode"] = mode
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--gpu", action="store_true", help="add the default mode on the GPU")
    parser.add_argument("--only", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = resolve_model(args.model)
    if args.only:  # one mode, in this process, its environment set by the parent
        print(json.dumps(measure(model, args.sessions, args.tokens, args.gpu)))
        return
    runs = [(mode, False) for mode in MODES] + ([("default", True)] if args.gpu else [])
    rows = [_in_own_process(mode, gpu, args) for mode, gpu in runs]
    if args.json:
        print(json.dumps({"model": model.name, "rows": rows}, indent=1))
        return
    print(f"{model.name}, {args.sessions} sessions, {args.tokens} greedy tokens each")
    head = ("mode", "device", "same tokens", "bit-identical", "alone s", "batched s")
    print(f"{head[0]:<14} {head[1]:<6} {head[2]:>12} {head[3]:>14} {head[4]:>8} {head[5]:>10}")
    for r in rows:
        n = r["sessions"]
        print(
            f"{r['mode']:<14} {r['device']:<6} {r['same_tokens']:>9}/{n:<2}"
            f" {r['bit_identical_logits']:>11}/{n:<2} {r['alone_s']:>8} {r['batched_s']:>10}"
        )


if __name__ == "__main__":
    main()
