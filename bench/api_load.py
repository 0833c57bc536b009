"""Concurrent requests through the OpenAI-compatible API, as a new user would send them.

A whole loopback swarm on the default model (`sangama demo --static --api-port`, three
worker processes) answers N different greedy chat requests, first one at a time, then
all N at once. Counted: answers under load that are the same text as alone, and the
tokens per second of each way (completion tokens over wall time) with their ratio, the
gain batching gives. Side by side, each mode in a swarm of its own: `batch-variant`
(SANGAMA_BATCH_VARIANT=1: one KV cache shared by all sessions, the repacked layouts'
4-row gemm, the tiled matmul) and `default` (batch-invariant: a KV stream per session
and kernels that sum every row alone as batched). docs/decisions/batch-invariance.md.

    .venv/bin/python bench/api_load.py [--requests 16] [--tokens 48] [--model default]
        [--rounds 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.api.access import API_KEY_FILE  # noqa: E402
from app.ports import free_tcp_port  # noqa: E402

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain gravity to a child.",
    "List three colors and what they remind you of.",
    "Why is the sky blue?",
    "Name a famous painter and one of their works.",
    "What is 12 times 7?",
    "Tell me a joke about cats.",
    "How do plants grow?",
    "What is Python used for?",
    "Describe the sea in two sentences.",
    "Who wrote Hamlet?",
    "What is a star made of?",
    "Give me a recipe idea for dinner.",
    "Why does it rain?",
    "Say hello in three languages.",
)
MODES = ("batch-variant", "default")
READY_TIMEOUT_S = 300.0


class ApiSwarm:
    """`sangama demo --static --api-port P` in a process of its own, until closed."""

    def __init__(self, model: str, batch_variant: bool) -> None:
        self.config = tempfile.TemporaryDirectory(prefix="sangama-api-load-")
        self.port = free_tcp_port()
        env = dict(os.environ, XDG_CONFIG_HOME=self.config.name)
        env.pop("SANGAMA_BATCH_VARIANT", None)
        if batch_variant:
            env["SANGAMA_BATCH_VARIANT"] = "1"
        cmd = [str(ROOT / ".venv" / "bin" / "sangama"), "demo", "--static", "--model", model]
        self.process = subprocess.Popen(
            [*cmd, "--api-port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.http = requests.Session()

    def wait_ready(self) -> None:
        key_file = Path(self.config.name) / "sangama" / API_KEY_FILE
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the demo swarm exited with {self.process.returncode}")
            if key_file.exists():
                self.http.headers["Authorization"] = f"Bearer {key_file.read_text().strip()}"
                try:
                    if self.http.get(f"{self.base}/models", timeout=5).ok:
                        return
                except requests.ConnectionError:
                    pass
            time.sleep(0.5)
        raise SystemExit("the demo swarm's API did not answer in time")

    def ask(self, question: str, max_tokens: int) -> tuple[str, int]:
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        r = self.http.post(f"{self.base}/chat/completions", json=body, timeout=600)
        if not r.ok:
            raise SystemExit(f"the API answered {r.status_code}: {r.text[:300]}")
        out = r.json()
        return str(out["choices"][0]["message"]["content"]), int(out["usage"]["completion_tokens"])

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.config.cleanup()


def one_round(swarm: ApiSwarm, questions: list[str], max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    alone = [swarm.ask(q, max_tokens) for q in questions]
    t_alone = time.perf_counter() - t0
    with ThreadPoolExecutor(len(questions)) as pool:
        t0 = time.perf_counter()
        together = list(pool.map(lambda q: swarm.ask(q, max_tokens), questions))
        t_together = time.perf_counter() - t0
    alone_tps = sum(n for _, n in alone) / t_alone
    together_tps = sum(n for _, n in together) / t_together
    return {
        "same_as_alone": sum(a[0] == b[0] for a, b in zip(alone, together, strict=True)),
        "alone_tok_s": round(alone_tps, 1),
        "concurrent_tok_s": round(together_tps, 1),
        "ratio": round(together_tps / alone_tps, 3),
    }


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.requests)]
    swarm = ApiSwarm(args.model, batch_variant=mode == "batch-variant")
    try:
        swarm.wait_ready()
        swarm.ask(questions[0], 4)  # warm every stage once before timing
        rounds = [one_round(swarm, questions, args.tokens) for _ in range(args.rounds)]
    finally:
        swarm.close()
    return {
        "mode": mode,
        "requests": args.requests,
        "same_as_alone": min(r["same_as_alone"] for r in rounds),
        "alone_tok_s": statistics.median(r["alone_tok_s"] for r in rounds),
        "concurrent_tok_s": statistics.median(r["concurrent_tok_s"] for r in rounds),
        "ratio": statistics.median(r["ratio"] for r in rounds),
        "rounds": rounds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48, help="max_tokens of every request")
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=1, help="alone-then-together rounds a mode")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(mode, args) for mode in args.modes.split(",")]
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"model": args.model, "load_average": load, "modes": rows}, indent=2))
        return 0
    print(f"{args.requests} greedy chat requests of up to {args.tokens} tokens, model {args.model}")
    head = ("mode", "same as alone", "alone tok/s", "together tok/s", "ratio")
    print(f"{head[0]:<14} {head[1]:>13} {head[2]:>11} {head[3]:>14} {head[4]:>6}")
    for r in rows:
        same = f"{r['same_as_alone']}/{r['requests']}"
        print(
            f"{r['mode']:<14} {same:>13} {r['alone_tok_s']:>11} "
            f"{r['concurrent_tok_s']:>14} {r['ratio']:>6}"
        )
    print(f"load average at the end: {load:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
