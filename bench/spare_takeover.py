"""Kill -> next token, with a warm spare and with a cold one, side by side in one run.

Each run: a real coordinator (--spares 1), three workers and a spare on loopback, a
joined client generating a greedy answer through RecoveringClient (as every product
client does); a chain worker is killed with SIGKILL after the 5th token. The spare's
downloads are capped (`--max-download`, a home line) so that what a cold spare must
fetch after the kill shows; a warm one fetched and pre-loaded the stage most at risk
beforehand (the coordinator's standby, coordinator/server/spare_policy.py; the worker's
app/serving/standby.py), and that stage is the one killed. Each run also times
kill -> the client noticed, kill -> the spare serving, and counts the spare's loads
after the kill (0: promoted as pre-loaded) and the replays the recovery took (1: the
first replay answered). Both answers must equal the same uninterrupted answer.
`--victim middle` (the default) has the middle worker declare the earliest departure,
so the spare stands by for the middle stage and the stage upstream of it must learn its
new next hop; `--victim at-risk` lets the spare policy choose from measured uptimes
(mostly the first stage, the last to start: it carries the tokenizer).

    python -m bench.spare_takeover [--model GGUF] [--max-download 4M] [--victim middle]
                                   [--warm-only] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from app.client.connect import avoiding_source
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.config import Route
from tests.support.spare_swarm import (
    TAKEOVER_ARGS,
    SpareSwarm,
    generate_killing,
    middle_leaves_first,
)

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 40
KILL_AFTER = 5

PHASE_LINES = {
    "spare_assigned_s": ("spare", "assigned layers"),
    "spare_starting_s": ("spare", "starting the stage"),
    "spare_worker_built_s": ("spare", "worker built"),
    "spare_started_s": ("spare", "stage started"),
    "spare_within_cap_s": ("spare", "within the cap"),
    "spare_serving_s": ("spare", "serving layers"),
    "upstream_retargeted_s": ("w", "next stage is now"),
}
"""Phase -> (whose log, the line's text); `sangama -v` timestamps each line."""


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
    replays: int
    """Replays the first recovery took (1: the first replay answered)."""
    tokens: int
    load_avg: str
    phases: dict[str, float] = field(default_factory=dict)
    """Kill -> each step of the takeover (seconds; absent: not seen)."""


def _log_times(path: Path, text: str) -> list[float]:
    """Wall-clock times of the log lines containing `text` (logging's asctime, local)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if text in line and line[:4].isdigit():
            with_ms = line[:23].replace(",", ".")
            out.append(dt.datetime.strptime(with_ms, "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return out


def phases(root: Path, killed_wall: float, routes: list[tuple[float, bool]]) -> dict[str, float]:
    """Kill -> each step: the client's first route request after the kill, the first one
    the coordinator answered with a route (a re-plan without the dead stage), the spare
    assigned (its heartbeat), the spare serving, the upstream stage forwarding to it."""
    after = [(t - killed_wall, ok) for t, ok in routes if t >= killed_wall]
    out: dict[str, float] = {}
    if after:
        out["client_asked_route_s"] = after[0][0]
        got = [t for t, ok in after if ok]
        if got:
            out["coordinator_rerouted_s"] = got[0]
        out["route_requests"] = float(len(after))
    for name, (who, text) in PHASE_LINES.items():
        logs = [root / "spare.log"] if who == "spare" else sorted(root.glob("w*.log"))
        times = [t - killed_wall for p in logs for t in _log_times(p, text) if t >= killed_wall]
        if times:
            out[name] = min(times)
    return {k: round(v, 2) for k, v in out.items()}


async def one_run(
    model: Path, root: Path, warm: bool, max_download: str, kill_which: str = "middle"
) -> tuple[Run, list[int]]:
    swarm = await SpareSwarm.start(
        root,
        model,
        chain_args=middle_leaves_first() if kill_which == "middle" else ((), (), ()),
        spare_args=["--max-download", max_download],
        coordinator_args=[*TAKEOVER_ARGS, *([] if warm else ["--cold-spares"])],
        verbose=True,
    )
    try:
        if warm:
            await swarm.until_spare_says("STANDBY")
        await swarm.settled()
        me = await swarm.join_client()
        route = await swarm.route(me)
        # The stage the spare stands by for (the one most at risk) dies; a cold run
        # kills the same position of the chain, the middle one.
        ready = swarm.standby_layers()
        doomed = next(
            (s.node_id for s in route.stages if (s.layers.start, s.layers.stop) == ready),
            route.stages[1].node_id,
        )
        victim = swarm.worker(doomed)
        source = avoiding_source(me)
        routes: list[tuple[float, bool]] = []

        async def timed_source(avoid: tuple[str, ...]) -> Route:
            try:
                got = await source(avoid)
            except Exception:
                routes.append((time.time(), False))
                raise
            routes.append((time.time(), True))
            return got

        client = RecoveringClient(
            me.credentials(), route, timed_source, RecoveryPolicy(route_wait_s=300)
        )
        walls: list[float] = []

        def kill() -> None:
            swarm.kill(victim)
            walls.append(time.time())

        async with client:
            out, killed_at, gap = await generate_killing(
                client,
                PROMPT,
                N_TOKENS,
                KILL_AFTER,
                kill,
            )
        load = Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"
        stall = client.recoveries[0].stall_s if client.recoveries else 0.0
        # Failures merged into one stall are joined by "; then " (RecoveringClient).
        replays = 1 + client.recoveries[0].failure.count("; then ") if client.recoveries else 0
        said = swarm.said
        up = next((t for t, x in said if x.startswith("READY")), killed_at)
        loads = sum(1 for t, x in said if x.startswith("LOADING") and t >= killed_at)
        steps = phases(root, walls[0], routes) if walls else {}
        steps["kill_to_next_token_s"] = round(gap, 2)
        run = Run(
            "warm" if warm else "cold",
            gap,
            gap - stall,
            up - killed_at,
            loads,
            len(client.recoveries),
            replays,
            len(out),
            load,
            steps,
        )
        return run, out
    finally:
        await swarm.stop()


def main(argv: list[str] | None = None) -> int:
    from core.models import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2 135M)")
    ap.add_argument("--max-download", default="4M", help="the spare's download cap per second")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warm-only", action="store_true", help="skip the cold run")
    ap.add_argument(
        "--victim",
        choices=("middle", "at-risk"),
        default="middle",
        help="the stage killed: the middle one, or the one the spare policy chose",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs' logs here")
    a = ap.parse_args(argv)
    model = a.model or default_model_path()
    runs: list[Run] = []
    answers: list[list[int]] = []
    with TemporaryDirectory(prefix="sangama-spares-") as scratch:
        tmp = a.keep or scratch
        for warm in (True,) if a.warm_only else (False, True):
            run, out = asyncio.run(
                one_run(
                    model,
                    Path(tmp) / ("warm" if warm else "cold"),
                    warm,
                    a.max_download,
                    a.victim,
                )
            )
            runs.append(run)
            answers.append(out)
    same = all(x == answers[0] for x in answers) and len(answers[0]) == N_TOKENS
    if a.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "answers_equal": same}))
    else:
        print(
            f"{'spare':6} {'kill -> next token':>19} {'noticed':>8} {'spare serving':>14} "
            f"{'loads':>5} {'recoveries':>10} {'replays':>7} {'tokens':>6} {'load':>5}"
        )
        for r in runs:
            print(
                f"{r.spare:6} {r.kill_to_next_token_s:17.2f} s {r.kill_to_noticed_s:6.2f} s "
                f"{r.kill_to_spare_serving_s:12.2f} s {r.loads_at_takeover:5} "
                f"{r.recoveries:10} {r.replays:7} {r.tokens:6} {r.load_avg:>5}"
            )
        print(f"spare download cap {a.max_download}/s; answers equal: {same}")
        print("kill -> each step of the takeover (s):")
        names = sorted(
            {k for r in runs for k in r.phases}, key=lambda k: runs[-1].phases.get(k, 1e9)
        )
        print(f"  {'step':<26}" + "".join(f"{r.spare:>8}" for r in runs))
        for k in names:
            print(f"  {k:<26}" + "".join(f"{r.phases.get(k, float('nan')):8.2f}" for r in runs))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
