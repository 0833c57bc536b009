"""Kill -> next token, and the rows each stage computes, when a replay keeps the last
stage's KV and when it does not, side by side in one run.

Each run: a real coordinator (--spares 1), three workers and a spare on loopback, a
joined client generating a greedy answer to a long prompt (about 300 tokens) through
RecoveringClient; after the 5th token SIGKILL kills the stage the spare stands by for (the
middle one when that is the last stage, which must survive), the spare takes its place
and the client replays prompt + generated on the new chain. With reuse
(the default client) the replay names the session it continues and the last stage, which
the new route keeps, takes that session's KV over and computes only the final row; without
(`keep_kv=False`, as before) every stage computes the whole replay. The last stage keeps
the old session only for its resume grace (30 s): a takeover slower than that replays
everything either way. Rows per stage come
from each worker's heartbeat counters (computed over the whole answer, and the rows a
replay did not compute); both answers must be equal.

    python -m bench.replay_reuse [--model GGUF] [--prompt 295] [--json]

The default model is SmolLM2 135M (as bench.spare_takeover); Gemma 3 270M did not get
past the workers' start on this machine in the time there was (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from app.client.connect import avoiding_source
from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route
from app.identity import join_swarm
from app.lab.processes import Child, spawn_sangama
from app.serving.coordinated import HEARTBEAT_S
from tests.support.coordinator_proc import CoordinatorProcess, wait_settled

N_TOKENS = 24
KILL_AFTER = 5


@dataclass(frozen=True)
class Run:
    reuse: bool
    killed: int
    """The chain position killed (0 first, 1 middle)."""
    warm: bool
    """The spare had pre-loaded the killed stage."""
    kill_to_next_token_s: float
    stall_s: float
    """The client's own figure: failure noticed -> first token on the new chain."""
    replayed: int
    """Positions the replay sent."""
    last_rows: int
    """Rows the last stage computed over the whole answer (the old session and its replay)."""
    last_reused: int
    """Replayed rows the last stage did not compute (it held them)."""
    middle_rows: int
    """Rows the new chain's middle stage computed (the spare, or the old middle when the
    first stage was the one killed: its old session and the whole replay)."""
    first_rows: int
    """Rows the new chain's first stage computed."""
    recoveries: int
    tokens: int
    load_avg: str
    one_by_one: tuple[int, int, int] = (0, 0, 0)
    """Rows first, middle and last stage evaluated one at a time (a replay's generated
    tokens, each in a decode of its own: app.session.replay_shapes)."""


def _alone(stats: dict[str, Any]) -> int:
    return int(stats.get("rows_one_by_one", 0))


async def _read(spare: Child, lines: list[str]) -> None:
    assert spare.process.stdout is not None
    while line := await spare.process.stdout.readline():
        lines.append(line.decode().strip())


def prompt_of(n: int) -> list[int]:
    """A fixed prompt of `n` token ids (ordinary ids of any 32k+ vocabulary)."""
    return [2, *((i * 7919) % 20000 + 300 for i in range(n - 1))]


def _stats(coord: CoordinatorProcess, node: str, tokens_seen: int, timeout: float = 60.0) -> Any:
    """The node's heartbeat stats once they count the whole answer."""
    end = time.monotonic() + timeout
    stats: dict[str, Any] = {}
    while time.monotonic() < end:
        nodes = {n["node_id"]: n for n in coord.admin.swarm()["nodes"]}
        stats = nodes.get(node, {}).get("stats") or {}
        if stats.get("steps", 0) >= tokens_seen:
            return stats
        time.sleep(0.5)
    return stats


async def one_run(
    model: Path, root: Path, prompt: list[int], reuse: bool, worker_args: tuple[str, ...] = ()
) -> tuple[Run, list[int]]:
    args = ["--spares", "1", "--stale-after", "2", "--dead-after", "4"]
    coord = CoordinatorProcess.start(root / "coordinator", model, min_stages=3, extra_args=args)
    children: list[Child] = []

    async def worker(name: str, wait: bool) -> Child:
        code = coord.admin.create_invite("worker")["code"]
        cmd = ["worker", "--join", code, "--identity-dir", str(root / name), *worker_args]
        child = await spawn_sangama(name, cmd, root / f"{name}.log", 900, wait_ready=wait)
        children.append(child)
        return child

    try:
        chain = list(await asyncio.gather(*(worker(f"w{i}", True) for i in range(3))))
        spare = await worker("spare", False)
        said: list[str] = []
        reading = asyncio.ensure_future(_read(spare, said))
        loop = asyncio.get_running_loop()
        end = loop.time() + 900
        while not any(x.startswith("STANDBY") for x in said) and loop.time() < end:
            await asyncio.sleep(0.2)
        await loop.run_in_executor(None, wait_settled, coord, 3, 1, 900.0)
        me = await loop.run_in_executor(
            None, join_swarm, coord.admin.create_invite("client")["code"], root / "me"
        )
        route, _ = await loop.run_in_executor(None, fetch_route, me)
        # The stage the spare stands by for dies (a warm takeover, well inside the last
        # stage's resume grace) unless that is the last stage, which must survive: then
        # the middle one (a cold takeover).
        standby = list(next(iter(coord.admin.swarm().get("standby", {}).values()), ()))
        spans = [[s.layers.start, s.layers.stop] for s in route.stages]
        killed = spans.index(standby) if standby in spans[:-1] else 1
        doomed = route.stages[killed].node_id
        victim = next(w for w in chain if w.ready_line.split()[1] == doomed)
        client = RecoveringClient(
            me.credentials(),
            route,
            avoiding_source(me),
            RecoveryPolicy(route_wait_s=300),
            keep_kv=reuse,
        )
        out: list[int] = []
        killed_at = gap = 0.0
        async with client:
            async for event in client.generate(prompt, N_TOKENS):
                apply_event(out, event)
                if len(out) == KILL_AFTER:
                    os.kill(victim.process.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                elif len(out) == KILL_AFTER + 1:
                    gap = time.monotonic() - killed_at
        load = Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"
        reading.cancel()
        stages = [s.node_id for s in client.route.stages]
        await loop.run_in_executor(None, _stats, coord, stages[-1], N_TOKENS)
        await asyncio.sleep(1.5 * HEARTBEAT_S)  # one more beat: the whole answer counted
        first, middle, last = [
            await loop.run_in_executor(None, _stats, coord, node, 0) for node in stages
        ]
        recovery = client.recoveries[0] if client.recoveries else None
        run = Run(
            reuse,
            killed,
            standby in spans[:-1],
            gap,
            0.0 if recovery is None else recovery.stall_s,
            0 if recovery is None else recovery.replayed,
            int(last.get("rows", 0)),
            int(last.get("rows_reused", 0)),
            int(middle.get("rows", 0)),
            int(first.get("rows", 0)),
            len(client.recoveries),
            len(out),
            load,
            (_alone(first), _alone(middle), _alone(last)),
        )
        return run, out
    finally:
        await asyncio.gather(*(c.stop() for c in children))
        coord.stop()


def main(argv: list[str] | None = None) -> int:
    from core.models import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2 135M)")
    ap.add_argument("--prompt", type=int, default=295, help="prompt tokens")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--reproducible",
        action="store_true",
        help="workers --reproducible (each session on a KV stream of its own)",
    )
    ap.add_argument("--modes", default="fresh,reuse", help="which replays to run")
    a = ap.parse_args(argv)
    modes = [m == "reuse" for m in a.modes.split(",")]
    worker_args = ("--reproducible",) if a.reproducible else ()
    model = a.model or default_model_path()
    prompt = prompt_of(a.prompt)
    runs: list[Run] = []
    answers: list[list[int]] = []
    with TemporaryDirectory(prefix="sangama-replay-reuse-") as tmp:
        for reuse in modes:
            root = Path(tmp) / ("reuse" if reuse else "fresh")
            run, out = asyncio.run(one_run(model, root, prompt, reuse, worker_args))
            runs.append(run)
            answers.append(out)
    reference = uninterrupted(model, prompt)
    same = all(out == answers[0] for out in answers) and len(answers[0]) == N_TOKENS
    exact = [out == reference for out in answers]
    if a.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "answers_equal": same,
                          "equal_to_uninterrupted": exact, "answers": answers,
                          "uninterrupted": reference}))  # fmt: skip
    else:
        print(
            f"{'replay':7} {'killed':>6} {'spare':>5} {'kill -> next token':>19} {'stall':>7} "
            f"{'replayed':>8} "
            f"{'last rows':>9} {'reused':>6} {'middle rows':>11} {'first rows':>10} {'load':>5} "
            f"{'alone f/m/l':>11}"
        )
        for r in runs:
            print(
                f"{'reuse' if r.reuse else 'fresh':7} {r.killed:6} "
                f"{'warm' if r.warm else 'cold':>5} {r.kill_to_next_token_s:17.2f} s "
                f"{r.stall_s:5.2f} s {r.replayed:8} {r.last_rows:9} {r.last_reused:6} "
                f"{r.middle_rows:11} {r.first_rows:10} {r.load_avg:>5} "
                f"{'/'.join(map(str, r.one_by_one)):>11}"
            )
        print(f"{len(prompt)}-token prompt, {N_TOKENS} tokens; answers equal: {same}")
        for r, out, ok in zip(runs, answers, exact, strict=True):
            print(f"{'reuse' if r.reuse else 'fresh'}: equal to the uninterrupted run: {ok}")
            if not ok:
                print(f"  got  {out}\n  want {reference}")
    return 0 if all(exact) else 1


def uninterrupted(model: Path, prompt: list[int]) -> list[int]:
    """The whole model's greedy answer in one process (the reference)."""
    from gguf import GGUFReader

    from app.lab.local_run import build_pipeline
    from core.gguf_slices import read_facts
    from core.types import LayerRange

    n_layer = read_facts(GGUFReader(model)).n_layer
    whole = build_pipeline([model], [LayerRange(0, n_layer)], n_layer, 1024, 64, 2, True)
    try:
        return list(whole.generate(prompt, N_TOKENS).tokens)
    finally:
        whole.shutdown()


if __name__ == "__main__":
    sys.exit(main())
