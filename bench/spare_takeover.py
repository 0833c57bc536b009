"""Kill -> next token, with a warm spare and with a cold one, side by side in one run.

Each run: a real coordinator (--spares 1), three workers and a spare on loopback, a
joined client generating a greedy answer through RecoveringClient (as every product
client does); a chain worker is killed with SIGKILL after the 5th token. The spare's
downloads are capped (`--max-download`, a home line) so that what a cold spare must
fetch after the kill shows; a warm one fetched and pre-loaded the stage most at risk
beforehand (the coordinator's standby, coordinator/server/spare_policy.py; the worker's
app/serving/standby_stage.py), and that stage is the one killed. Each run also times
kill -> the client noticed, kill -> the spare serving, and counts the spare's loads
after the kill (0: promoted as pre-loaded). Both answers must equal the same
uninterrupted answer.

    python -m bench.spare_takeover [--model GGUF] [--max-download 4M] [--json]
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

from app.client.connect import avoiding_source
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route
from app.identity import join_swarm
from app.lab.processes import Child, spawn_sangama
from tests.support.coordinator_proc import CoordinatorProcess, wait_settled

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 40
KILL_AFTER = 5


@dataclass(frozen=True)
class Run:
    spare: str
    kill_to_next_token_s: float
    kill_to_noticed_s: float
    """Kill -> the client knows the answer broke (its probe found the stage gone)."""
    kill_to_spare_serving_s: float
    """Kill -> the spare prints READY (re-plan, its next heartbeat, the load if cold)."""
    loads_at_takeover: int
    """Stage loads the spare did after the kill: 0 when promoted pre-loaded."""
    recoveries: int
    tokens: int
    load_avg: str


async def _read(spare: Child, lines: list[tuple[float, str]]) -> None:
    """The spare's stdout lines with the time each came (READY, STANDBY, LOADING)."""
    assert spare.process.stdout is not None
    while line := await spare.process.stdout.readline():
        lines.append((time.monotonic(), line.decode().strip()))


async def _until_standby(lines: list[tuple[float, str]], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not any(x.startswith("STANDBY") for _, x in lines):
        if time.monotonic() > end:
            raise RuntimeError("the spare never stood by")
        await asyncio.sleep(0.2)


async def one_run(model: Path, root: Path, warm: bool, max_download: str) -> tuple[Run, list[int]]:
    args = ["--spares", "1", "--stale-after", "2", "--dead-after", "4"]
    coord = CoordinatorProcess.start(
        root / "coordinator",
        model,
        min_stages=3,
        extra_args=[*args, *([] if warm else ["--cold-spares"])],
    )
    children: list[Child] = []

    async def worker(name: str, wait: bool, extra: list[str]) -> Child:
        code = coord.admin.create_invite("worker")["code"]
        cmd = ["worker", "--join", code, "--identity-dir", str(root / name), *extra]
        child = await spawn_sangama(name, cmd, root / f"{name}.log", 300, wait_ready=wait)
        children.append(child)
        return child

    try:
        chain = list(await asyncio.gather(*(worker(f"w{i}", True, []) for i in range(3))))
        spare = await worker("spare", False, ["--max-download", max_download])
        loop = asyncio.get_running_loop()
        said: list[tuple[float, str]] = []
        reading = asyncio.ensure_future(_read(spare, said))
        if warm:
            await _until_standby(said)
        await loop.run_in_executor(None, wait_settled, coord, 3, 1, 300.0)
        me = await loop.run_in_executor(
            None, join_swarm, coord.admin.create_invite("client")["code"], root / "me"
        )
        route, _ = await loop.run_in_executor(None, fetch_route, me)
        # The stage the spare stands by for (the one most at risk) dies; a cold run
        # kills the same position of the chain, the middle one.
        standby = coord.admin.swarm().get("standby", {})
        ready = next(iter(standby.values()), None)
        doomed = next(
            (
                s.node_id
                for s in route.stages
                if [s.layers.start, s.layers.stop] == list(ready or ())
            ),
            route.stages[1].node_id,
        )
        victim = next(w for w in chain if w.ready_line.split()[1] == doomed)
        client = RecoveringClient(
            me.credentials(), route, avoiding_source(me), RecoveryPolicy(route_wait_s=300)
        )
        out: list[int] = []
        killed_at = gap = 0.0
        async with client:
            async for event in client.generate(PROMPT, N_TOKENS):
                out.extend(event.tokens)
                if len(out) == KILL_AFTER:
                    os.kill(victim.process.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                elif len(out) == KILL_AFTER + 1:
                    gap = time.monotonic() - killed_at
        load = Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"
        reading.cancel()
        stall = client.recoveries[0].stall_s if client.recoveries else 0.0
        ready = next((t for t, x in said if x.startswith("READY")), killed_at)
        loads = sum(1 for t, x in said if x.startswith("LOADING") and t >= killed_at)
        run = Run(
            "warm" if warm else "cold",
            gap,
            gap - stall,
            ready - killed_at,
            loads,
            len(client.recoveries),
            len(out),
            load,
        )
        return run, out
    finally:
        await asyncio.gather(*(c.stop() for c in children))
        coord.stop()


def main(argv: list[str] | None = None) -> int:
    from core.models import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2 135M)")
    ap.add_argument("--max-download", default="4M", help="the spare's download cap per second")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    model = a.model or default_model_path()
    runs: list[Run] = []
    answers: list[list[int]] = []
    with TemporaryDirectory(prefix="sangama-spares-") as tmp:
        for warm in (False, True):
            run, out = asyncio.run(
                one_run(model, Path(tmp) / ("warm" if warm else "cold"), warm, a.max_download)
            )
            runs.append(run)
            answers.append(out)
    same = answers[0] == answers[1] and len(answers[0]) == N_TOKENS
    if a.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "answers_equal": same}))
    else:
        print(
            f"{'spare':6} {'kill -> next token':>19} {'noticed':>8} {'spare serving':>14} "
            f"{'loads':>5} {'recoveries':>10} {'tokens':>6} {'load':>5}"
        )
        for r in runs:
            print(
                f"{r.spare:6} {r.kill_to_next_token_s:17.2f} s {r.kill_to_noticed_s:6.2f} s "
                f"{r.kill_to_spare_serving_s:12.2f} s {r.loads_at_takeover:5} "
                f"{r.recoveries:10} {r.tokens:6} {r.load_avg:>5}"
            )
        print(f"spare download cap {a.max_download}/s; answers equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
