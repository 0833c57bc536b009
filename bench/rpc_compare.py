"""Sangama vs llama.cpp RPC, the same model split 3 ways on loopback, side by side in one run.

At each one-way link delay (0, 5, 10 ms by default) this runs:

- **Sangama**: a 3-stage swarm (app.lab.local_swarm, as bench/swarm.py starts one), every
  link (client -> stage 0 -> 1 -> 2 -> client) through app.lab.wan.proxy. Push-forward
  round the ring: the last stage sends each next step to stage 0 (through the client's
  proxy, so with the same delay) and the tokens to the client beside it, so a token
  crosses three delayed links, once each (app.serving.links.ring).
- **llama.cpp RPC**: three `rpc-server`s holding a third of the layers each (split 1/1/1,
  everything offloaded), driven by the engine wheel's llama.cpp with ggml's RPC module
  (bench/rpc_client.py, greedy decode), every client-server link through the same delay
  lanes over TCP (bench/tcp_delay.py). A star through the client: every server costs at
  least one blocking round trip per token.

Both decode on the CPU with the same thread count per stage and, by default, weight
repacking off on both (`--repack 0`: the client's `use_extra_bufts` off, as llama-bench's
`--repack 0`; Sangama's default; `--repack 1` sets `SANGAMA_BATCH_VARIANT=1` for the
swarm). An rpc-server keeps weights in plain CPU buffers, so this is also what makes
the two run the same kernels; on CPUs where llama.cpp's AMX kernels crash it is
required. bench/rpc_build.py builds the server and the client module once (~10 min on
two cores, cached under ~/.cache/sangama/rpc/).

At each delay the two run `--rounds` times in turn (Sangama, then RPC); the table gives
the medians of their tok/s and of the rounds' ratios.

    .venv/bin/python bench/rpc_compare.py [--json] [--delays 0,5,10] [--tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.client.swarm_client import SwarmClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = "Write a short story about a lighthouse keeper who befriends a whale."
CUTS = [0, 6, 12, 18]


@dataclass(frozen=True)
class Row:
    delay_ms: float
    sangama_tps: float
    rpc_tps: float
    round_ratios: tuple[float, ...] = ()
    """Sangama / RPC of each round (one run of each, back to back); empty: one round."""

    @property
    def ratio(self) -> float:
        """Sangama / RPC decode tokens per second; > 1: Sangama is ahead. With rounds, the
        median of the rounds' ratios (this VM's speed drifts between minutes; each
        round's pair is taken seconds apart)."""
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return self.sangama_tps / self.rpc_tps if self.rpc_tps > 0 else float("inf")


def table(rows: Sequence[Row]) -> list[str]:
    lines = [f"{'one-way delay':>13} {'Sangama tok/s':>14} {'RPC tok/s':>10} {'ratio':>7}"]
    for r in rows:
        lines.append(
            f"{r.delay_ms:10.1f} ms {r.sangama_tps:14.2f} {r.rpc_tps:10.2f} {r.ratio:7.2f}"
        )
    return lines


def as_json(rows: Sequence[Row], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "rows": [{**asdict(r), "ratio": r.ratio} for r in rows]}


# ---------------------------------------------------------------- llama.cpp RPC


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"rpc-server on port {port} did not listen within {timeout} s")


@contextlib.contextmanager
def rpc_servers(
    binary: Path, n: int, threads: int, pids: list[int] | None = None
) -> Iterator[list[tuple[str, int]]]:
    """`n` rpc-servers on loopback; yields their addresses (their pids go into `pids`)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        addresses = []
        for _ in range(n):
            port = _free_port()
            proc = subprocess.Popen(
                [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(proc)
            if pids is not None:
                pids.append(proc.pid)
            _wait_listening(port, proc)
            addresses.append(("127.0.0.1", port))
        yield addresses
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def rpc_run(
    module: Path,
    server: Path,
    model: Path,
    delay_ms: float,
    tokens: int,
    threads: int,
    repack: int,
) -> dict[str, Any]:
    """bench/rpc_client.py's JSON: tokens/s, the tokens, CPU ms per token of each process."""
    from bench.tcp_delay import delayed_links

    pids: list[int] = []
    # Fresh servers per delay: each holds only what the last client sent it.
    with (
        rpc_servers(server, 3, threads, pids) as targets,
        delayed_links(targets, delay_ms) as links,
    ):
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("rpc_client.py")),
            "--module",
            str(module),
            "--rpc",
            ",".join(f"{h}:{p}" for h, p in links),
            "--model",
            str(model),
            "--prompt",
            PROMPT,
            "--tokens",
            str(tokens),
            "--threads",
            str(threads),
            "--repack",
            str(repack),
            "--watch-pids",
            ",".join(str(p) for p in pids),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------- Sangama


def prompt_ids(model: Path) -> list[int]:
    """PROMPT in `model`'s own tokens."""
    from core.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(model)
    try:
        return tok.encode(PROMPT)
    finally:
        tok.close()


@contextlib.asynccontextmanager
async def sangama_swarm(
    model: Path, threads: int, delay_ms: float = 0.0
) -> AsyncIterator[SwarmClient]:
    """A client of `model` split at CUTS over a LocalSwarm, every link `delay_ms` one
    way; the swarm is stopped and cleaned up on the way out."""
    from app.client.swarm_client import SwarmClient
    from app.lab.local_swarm import LocalSwarm

    swarm = LocalSwarm(
        model=str(model), cuts=CUTS, threads=threads, link_delays_ms=[delay_ms] * len(CUTS)
    )
    await swarm.start()
    try:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(
            swarm.client_credentials, swarm.route, swarm.tuning, step_timeout=60
        ) as client:
            yield client
    finally:
        await swarm.stop()
        swarm.cleanup()


async def sangama_tps(
    model: Path, delay_ms: float, tokens: int, threads: int
) -> tuple[float, list[int]]:
    prompt = prompt_ids(model)
    async with sangama_swarm(model, threads, delay_ms) as client:
        best, chosen = 0.0, []
        for _ in range(2):  # the first run warms caches and congestion windows
            events = [ev async for ev in client.generate(prompt, tokens + 1)]
            decode = events[1:]
            total_ms = sum(e.trip_ms for e in decode)
            best = max(best, len(decode) / (total_ms / 1e3))
            chosen = [t for e in events for t in e.tokens]
        return best, chosen


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--delays", default="0,5,10", help="one-way ms per link, comma separated")
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per run")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per stage / server")
    ap.add_argument("--repack", type=int, choices=[0, 1], default=0)
    ap.add_argument("--rounds", type=int, default=3, help="paired runs of both per delay")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from bench.rpc_build import build
    from core.models import GEMMA3, resolve_model

    binaries = build(os.cpu_count() or 2)
    model = resolve_model(GEMMA3)  # 18 blocks: CUTS split them 6/6/6, as the servers do
    if args.repack == 1:  # inherited by the swarm's workers
        os.environ["SANGAMA_BATCH_VARIANT"] = "1"
    load = [os.getloadavg()[0]]
    rows: list[Row] = []
    same: list[bool] = []
    for delay in [float(x) for x in args.delays.split(",")]:
        # Alternate the two at each delay so drift on a shared machine hits both alike.
        pairs: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            ours, our_tokens = asyncio.run(sangama_tps(model, delay, args.tokens, args.threads))
            result = rpc_run(
                binaries["libggml-rpc.so"],
                binaries["ggml-rpc-server"],
                model,
                delay,
                args.tokens,
                args.threads,
                args.repack,
            )
            theirs = float(result["tokens_per_s"])
            their_tokens = [int(t) for t in result["tokens"]]
            pairs.append((ours, theirs))
            same.append(our_tokens[: len(their_tokens)] == their_tokens[: len(our_tokens)])
        rows.append(
            Row(
                delay,
                statistics.median(p[0] for p in pairs),
                statistics.median(p[1] for p in pairs),
                tuple(a / b for a, b in pairs) if len(pairs) > 1 else (),
            )
        )
    load.append(os.getloadavg()[0])
    meta = {
        "model": model.name,
        "cuts": CUTS,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "repack": args.repack,
        "loadavg": load,
        "ratio_min": min(r.ratio for r in rows),
        "ratio_median": statistics.median(r.ratio for r in rows),
        "same_greedy_tokens": same,
    }
    if args.json:
        print(json.dumps(as_json(rows, meta), indent=1))
        return 0
    print(
        f"Sangama (3-stage swarm, push-forward round the ring) vs llama.cpp RPC "
        f"(3 rpc-servers, star), {model.name}, {args.tokens} tokens, {args.rounds} paired "
        f"round(s) a delay (medians), {args.threads} thread(s) per stage, "
        f"repack {args.repack}; load {load[0]:.1f} -> {load[1]:.1f}"
    )
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
