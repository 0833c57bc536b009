"""Kill -> next token, and the rows each stage computes, when a replay keeps the last
stage's KV and when it does not, side by side in one run.

Each run: a real coordinator (--spares 1), three workers and a spare on loopback, a
joined client generating a greedy answer to a long prompt (about 300 tokens) through
RecoveringClient; the middle stage is killed with SIGKILL after the 5th token, the spare
takes its place and the client replays prompt + generated on the new chain. With reuse
(the default client) the replay names the session it continues and the last stage, which
the new route keeps, takes that session's KV over and computes only the final row; without
(`keep_kv=False`, as before) every stage computes the whole replay. Rows per stage come
from each worker's heartbeat counters (computed over the whole answer, and the rows a
replay did not compute); both answers must be equal.

    python -m bench.replay_reuse [--model GGUF] [--prompt 295] [--json]
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
    kill_to_next_token_s: float
    stall_s: float
    """The client's own figure: failure noticed -> first token on the new chain."""
    replayed: int
    """Positions the replay sent."""
    last_rows: int
    """Rows the last stage computed over the whole answer (the old session and its replay)."""
    last_reused: int
    """Replayed rows the last stage did not compute (it held them)."""
    spare_rows: int
    """Rows the stage that replaced the middle one computed (the whole replay, then decode)."""
    first_rows: int
    recoveries: int
    tokens: int
    load_avg: str


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


async def one_run(model: Path, root: Path, prompt: list[int], reuse: bool) -> tuple[Run, list[int]]:
    args = ["--spares", "1", "--stale-after", "2", "--dead-after", "4"]
    coord = CoordinatorProcess.start(root / "coordinator", model, min_stages=3, extra_args=args)
    children: list[Child] = []

    async def worker(name: str, wait: bool) -> Child:
        code = coord.admin.create_invite("worker")["code"]
        cmd = ["worker", "--join", code, "--identity-dir", str(root / name)]
        child = await spawn_sangama(name, cmd, root / f"{name}.log", 900, wait_ready=wait)
        children.append(child)
        return child

    try:
        chain = list(await asyncio.gather(*(worker(f"w{i}", True) for i in range(3))))
        await worker("spare", False)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, wait_settled, coord, 3, 1, 900.0)
        me = await loop.run_in_executor(
            None, join_swarm, coord.admin.create_invite("client")["code"], root / "me"
        )
        route, _ = await loop.run_in_executor(None, fetch_route, me)
        doomed = route.stages[1].node_id  # the middle one: the last stage survives
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
                out.extend(event.tokens)
                if len(out) == KILL_AFTER:
                    os.kill(victim.process.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                elif len(out) == KILL_AFTER + 1:
                    gap = time.monotonic() - killed_at
        load = Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"
        stages = [s.node_id for s in client.route.stages]
        await loop.run_in_executor(None, _stats, coord, stages[-1], N_TOKENS)
        await asyncio.sleep(1.5 * HEARTBEAT_S)  # one more beat: the whole answer counted
        first, spare, last = [
            await loop.run_in_executor(None, _stats, coord, node, 0) for node in stages
        ]
        recovery = client.recoveries[0] if client.recoveries else None
        run = Run(
            reuse,
            gap,
            0.0 if recovery is None else recovery.stall_s,
            0 if recovery is None else recovery.replayed,
            int(last.get("rows", 0)),
            int(last.get("rows_reused", 0)),
            int(spare.get("rows", 0)),
            int(first.get("rows", 0)),
            len(client.recoveries),
            len(out),
            load,
        )
        return run, out
    finally:
        await asyncio.gather(*(c.stop() for c in children))
        coord.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--model",
        type=Path,
        default=Path.home() / ".cache/sangama/models/gemma-3-270m-q4_k_m.gguf",
        help="GGUF (default: Gemma 3 270M as the model cache holds it)",
    )
    ap.add_argument("--prompt", type=int, default=295, help="prompt tokens")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    prompt = prompt_of(a.prompt)
    runs: list[Run] = []
    answers: list[list[int]] = []
    with TemporaryDirectory(prefix="sangama-replay-reuse-") as tmp:
        for reuse in (False, True):
            run, out = asyncio.run(
                one_run(a.model, Path(tmp) / ("reuse" if reuse else "fresh"), prompt, reuse)
            )
            runs.append(run)
            answers.append(out)
    same = answers[0] == answers[1] and len(answers[0]) == N_TOKENS
    if a.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "answers_equal": same}))
    else:
        print(
            f"{'replay':7} {'kill -> next token':>19} {'stall':>7} {'replayed':>8} "
            f"{'last rows':>9} {'reused':>6} {'spare rows':>10} {'first rows':>10} {'load':>5}"
        )
        for r in runs:
            print(
                f"{'reuse' if r.reuse else 'fresh':7} {r.kill_to_next_token_s:17.2f} s "
                f"{r.stall_s:5.2f} s {r.replayed:8} {r.last_rows:9} {r.last_reused:6} "
                f"{r.spare_rows:10} {r.first_rows:10} {r.load_avg:>5}"
            )
        print(f"{len(prompt)}-token prompt, {N_TOKENS} tokens; answers equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
