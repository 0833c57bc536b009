"""Soak: several clients generate greedy answers on a real loopback swarm while a seeded
chaos policy (bench/soak_chaos.py) kills -9 and restarts random workers, the coordinator
and the relay (a real coturn; every other worker is `--relay-only`, so part of the
chain's links run through it). Every answer must complete and equal its reference (the
whole model, uninterrupted); the memory of every process kind is sampled and must stay
bounded.

    .venv/bin/python bench/soak.py [--minutes 30] [--quick] [--clients 3] [--seed 1]
                                   [--no-relay] [--json]

The report: answers completed, tokens lost (must be 0), stalls (each recovery: failure
noticed -> next token; max and median), the stall each kind of fault caused (the longest
gap between two tokens of any client from the kill to the next fault), the longest gap
between two tokens, restarts survived per kind, RSS start/peak/end per process kind and
the load average. The exit code is 0 only when nothing was lost and memory stayed bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.client.generation import apply_event

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.recovering import RecoveringClient, Recovery
from app.client.route import route_avoiding
from app.config import Route
from app.identity import Identity
from app.lab.local_run import build_pipeline
from bench.soak_chaos import ChaosPolicy, Fault, Situation, Target, next_fault
from bench.soak_swarm import STALE_AFTER_S, SoakSwarm, rss_bounded
from core.types import LayerRange
from tests.support.tiny_models import write_tiny_model

N_LAYER = 8
NO_CHAOS = ChaosPolicy(chain_weight=0, spare_weight=0, coordinator_weight=0, relay_weight=0)
QUICK_POLICY = ChaosPolicy(coordinator_every=4, relay_every=3)
"""A short soak surely kills the coordinator and the relay too (rounds 3 and 4, 6, ...)."""
ANSWER_TIMEOUT_S = 300.0
"""An answer still running after this long is a hang: counted lost, not waited for."""


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    clients: int = 3
    workers: int = 5
    stages: int = 3
    tokens: int = 40
    prompts: int = 6
    seed: int = 1
    stale_after_s: float = STALE_AFTER_S
    policy: ChaosPolicy = field(default_factory=ChaosPolicy)
    relay: bool = True
    """Run coturn (and relay-only workers) and let the policy kill it."""


@dataclass
class Answer:
    client: int
    prompt: int
    expected: int
    received: int
    correct: int
    """Tokens equal to the reference, from the first (the common prefix)."""
    error: str
    recoveries: list[Recovery]
    max_gap_s: float


@dataclass
class Event:
    at_s: float
    fault: Fault
    back_s: float = 0.0
    """Kill -> the restarted process started (the coordinator: READY; coturn: answers STUN)."""
    at: float = 0.0
    """The kill, on the event loop's clock (the clock of `SoakRun.tokens`)."""


@dataclass
class SoakRun:
    config: SoakConfig
    answers: list[Answer] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    reconnects: dict[str, int] = field(default_factory=dict)
    """Why a client had to connect afresh between answers (by error type)."""
    reconnect_errors: dict[str, str] = field(default_factory=dict)
    """The first message of each type."""
    relayed: set[str] = field(default_factory=set)
    """Workers seen with their link onward through the relay (at any chaos round)."""
    tokens: list[tuple[float, float]] = field(default_factory=list)
    """Every token any client received: (arrival on the loop's clock, gap since that
    client's previous token or its request)."""
    started: float = field(default_factory=time.monotonic)


def prompts(n: int, seed: int, vocab: int = 512) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(4, 12))] for _ in range(n)]


def references(model: Path, asks: list[list[int]], tokens: int) -> list[list[int]]:
    whole = build_pipeline([model], [LayerRange(0, N_LAYER)], N_LAYER, 512, 64, 1, True)
    try:
        return [list(whole.generate(p, tokens).tokens) for p in asks]
    finally:
        whole.shutdown()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -------------------------------------------------------------------- clients


async def _fresh_client(me: Identity, run: SoakRun, stop_at: float) -> RecoveringClient | None:
    """A connected client on the coordinator's current route, retried while the
    coordinator is down or the route passes through a stage being replaced."""
    loop = asyncio.get_running_loop()

    async def avoiding(avoid: tuple[str, ...]) -> Route:
        return await loop.run_in_executor(None, route_avoiding, me, avoid)

    while loop.time() < stop_at + ANSWER_TIMEOUT_S:
        client: RecoveringClient | None = None
        try:
            route = await avoiding(())
            client = RecoveringClient(me.credentials(), route, avoiding)
            await client.connect()
            return client
        except Exception as exc:
            why = type(exc).__name__
            run.reconnects[why] = run.reconnects.get(why, 0) + 1
            run.reconnect_errors.setdefault(why, str(exc)[:300])
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
            await asyncio.sleep(1.0)
    return None


async def client_loop(
    index: int,
    me: Identity,
    asks: list[list[int]],
    refs: list[list[int]],
    run: SoakRun,
    stop_at: float,
) -> None:
    loop = asyncio.get_running_loop()
    client = await _fresh_client(me, run, stop_at)
    k = 0
    while client is not None and loop.time() < stop_at:
        p = (index + k) % len(asks)
        k += 1
        out: list[int] = []
        error = ""
        before = len(client.recoveries)
        last, gap = loop.time(), 0.0
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                async for event in client.generate(asks[p], run.config.tokens):
                    apply_event(out, event)
                    now = loop.time()
                    run.tokens.append((now, now - last))
                    gap, last = max(gap, now - last), now
        except Exception as exc:  # a lost answer is the soak's finding, not its end
            error = f"{type(exc).__name__}: {exc}"
        run.answers.append(
            Answer(
                index,
                p,
                len(refs[p]),
                len(out),
                common_prefix(out, refs[p]),
                error,
                client.recoveries[before:],
                gap,
            )
        )
        if error:
            with contextlib.suppress(Exception):
                await client.close()
            client = await _fresh_client(me, run, stop_at)
    if client is not None:
        with contextlib.suppress(Exception):
            await client.close()


# -------------------------------------------------------------------- chaos


async def situation(swarm: SoakSwarm, observer: Identity, last: Situation) -> Situation:
    by_node = {w.node_id: w.name for w in swarm.running_workers()}
    if not swarm.coordinator_up:
        return Situation(last.chain, last.spares, False, swarm.relay_up)
    try:
        route = await asyncio.get_running_loop().run_in_executor(None, route_avoiding, observer, ())
    except Exception:  # no route right now (a re-plan): keep the last view
        return last
    chain = tuple(by_node[s.node_id] for s in route.stages if s.node_id in by_node)
    spares = tuple(n for n in by_node.values() if n not in chain)
    return Situation(chain, spares, True, swarm.relay_up)


async def chaos_loop(swarm: SoakSwarm, observer: Identity, run: SoakRun, stop_at: float) -> None:
    loop = asyncio.get_running_loop()
    cfg = run.config
    now = Situation((), tuple(swarm.workers))
    round_no = 0
    await asyncio.sleep(cfg.policy.gap_s[0])  # the clients connect on a whole swarm first
    while loop.time() < stop_at:
        now = await situation(swarm, observer, now)
        run.relayed |= swarm.relayed_nodes()
        fault = next_fault(cfg.seed, round_no, now, cfg.policy)
        round_no += 1
        if fault is None:
            await asyncio.sleep(1.0)
            continue
        t0 = loop.time()
        event = Event(time.monotonic() - run.started, fault, at=t0)
        if fault.kind is Target.COORDINATOR:
            await swarm.kill_coordinator()
            await asyncio.sleep(fault.down_s)
            await swarm.restart_coordinator()
        elif fault.kind is Target.RELAY:
            swarm.kill_relay()
            await asyncio.sleep(fault.down_s)
            await swarm.restart_relay()
        else:
            swarm.kill_worker(fault.name)
            await asyncio.sleep(fault.down_s)
            await swarm.restart_worker(fault.name)
        event.back_s = loop.time() - t0
        run.events.append(event)
        await asyncio.sleep(fault.gap_s)


# -------------------------------------------------------------------- run and report


async def soak(cfg: SoakConfig, workdir: Path) -> dict[str, Any]:
    model = write_tiny_model(workdir / "tiny8.gguf", n_layer=N_LAYER)
    asks = prompts(cfg.prompts, cfg.seed)
    refs = references(model, asks, cfg.tokens)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    swarm = SoakSwarm(workdir, model, cfg.workers, cfg.stages, cfg.stale_after_s, cfg.relay)
    run = SoakRun(cfg)
    await swarm.start()
    try:
        loop = asyncio.get_running_loop()
        ids = [
            await loop.run_in_executor(None, swarm.join_client, f"c{i}") for i in range(cfg.clients)
        ]
        observer = await loop.run_in_executor(None, swarm.join_client, "observer")
        run.started = time.monotonic()
        stop_at = loop.time() + cfg.minutes * 60
        await asyncio.gather(
            chaos_loop(swarm, observer, run, stop_at),
            *(client_loop(i, ids[i], asks, refs, run, stop_at) for i in range(cfg.clients)),
        )
        swarm.sample()
    finally:
        await swarm.stop()
    return report(run, swarm, load_before)


def fault_stalls(events: list[Event], tokens: list[tuple[float, float]]) -> list[float]:
    """Per fault: the longest gap between two tokens of any client among the tokens that
    arrived after its kill and before the next fault's (0.0: no token came in between)."""
    out = []
    for i, e in enumerate(events):
        end = events[i + 1].at if i + 1 < len(events) else float("inf")
        out.append(max((g for t, g in tokens if e.at < t <= end), default=0.0))
    return out


def _by_kind(events: list[Event], stalls: list[float]) -> dict[str, dict[str, float]]:
    kinds: dict[str, list[float]] = {}
    for e, s in zip(events, stalls, strict=True):
        kinds.setdefault(e.fault.kind.value, []).append(s)
    return {
        k: {"max_s": round(max(v), 2), "median_s": round(statistics.median(v), 2)}
        for k, v in kinds.items()
    }


def report(run: SoakRun, swarm: SoakSwarm, load_before: list[str]) -> dict[str, Any]:
    answers = run.answers
    stalls = [r.stall_s for a in answers for r in a.recoveries]
    lost = sum(a.expected - a.correct for a in answers)
    restarts: dict[str, int] = {}
    for e in run.events:
        restarts[e.fault.kind.value] = restarts.get(e.fault.kind.value, 0) + 1
    memory = {k: s.summary() for k, s in swarm.rss.items()}
    bounded = all(rss_bounded(m) for m in memory.values())
    failed = [a for a in answers if a.error or a.correct != a.expected]
    per_fault = fault_stalls(run.events, run.tokens)
    return {
        "config": {**asdict(run.config), "policy": asdict(run.config.policy)},
        "duration_s": round(time.monotonic() - run.started, 1),
        "answers_completed": sum(1 for a in answers if not a.error and a.correct == a.expected),
        "answers_started": len(answers),
        "answers_failed": len(failed),
        "failures": [
            f"client {a.client} prompt {a.prompt}: "
            f"{a.error or f'token {a.correct} differs'}; recoveries replayed "
            f"{[r.replayed for r in a.recoveries]}"
            for a in failed
        ],
        "tokens_expected": sum(a.expected for a in answers),
        "tokens_lost": lost,
        "tokens_wrong": sum(a.received - a.correct for a in answers),
        "recoveries": len(stalls),
        "stall_max_s": round(max(stalls), 2) if stalls else 0.0,
        "stall_median_s": round(statistics.median(stalls), 2) if stalls else 0.0,
        "longest_token_gap_s": round(max((a.max_gap_s for a in answers), default=0.0), 2),
        "restarts_survived": sum(restarts.values()) if not failed else 0,
        "restarts": restarts,
        "stall_by_fault": _by_kind(run.events, per_fault),
        "relayed_links": len(run.relayed),
        "relay_restarts_survived": restarts.get(Target.RELAY.value, 0) if not failed else 0,
        "faults": [
            {
                "at_s": round(e.at_s, 1),
                "kill": e.fault.name,
                "down_s": round(e.fault.down_s, 1),
                "back_s": round(e.back_s, 1),
                "stall_s": round(stall, 2),
            }
            for e, stall in zip(run.events, per_fault, strict=True)
        ],
        "reconnects": run.reconnects,
        "reconnect_errors": run.reconnect_errors,
        "memory": memory,
        "memory_bounded": bounded,
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "ok": lost == 0 and not failed and bounded and bool(answers),
    }


def print_table(r: dict[str, Any]) -> None:
    print(
        f"soak: {r['duration_s']:.0f} s, seed {r['config']['seed']}, "
        f"{r['config']['clients']} clients, {r['config']['workers']} workers "
        f"({r['config']['stages']} stages), load {' '.join(r['loadavg_before'])} -> "
        f"{' '.join(r['loadavg_after'])}"
    )
    rows = [
        ("answers completed", f"{r['answers_completed']} of {r['answers_started']}"),
        (
            "tokens lost",
            f"{r['tokens_lost']} of {r['tokens_expected']} (wrong {r['tokens_wrong']})",
        ),
        ("recoveries", str(r["recoveries"])),
        ("stall max / median", f"{r['stall_max_s']:.2f} s / {r['stall_median_s']:.2f} s"),
        ("longest token gap", f"{r['longest_token_gap_s']:.2f} s"),
        ("restarts survived", f"{r['restarts_survived']} {r['restarts']}"),
        ("client reconnects", str(r["reconnects"])),
        ("relayed links", f"{r['relayed_links']} workers' links onward ran through coturn"),
    ]
    for name, value in rows:
        print(f"  {name:<20} {value}")
    print(f"  {'stall after a kill':<20} {'max':>8} {'median':>8}  (longest token gap, any client)")
    for kind, st in r["stall_by_fault"].items():
        print(f"    {kind:<18} {st['max_s']:>7.2f}s {st['median_s']:>7.2f}s")
    print(f"  {'memory (RSS MiB)':<20} {'start':>8} {'peak':>8} {'end':>8}")
    for kind, m in r["memory"].items():
        print(f"    {kind:<18} {m['start_mib']:>8.1f} {m['peak_mib']:>8.1f} {m['end_mib']:>8.1f}")
    print(f"  memory bounded: {r['memory_bounded']}")
    for why, message in r["reconnect_errors"].items():
        print(f"  reconnect after {why}: {message[:160]}")
    for f in r["failures"]:
        print(f"  FAILED {f}")
    print("OK" if r["ok"] else "NOT OK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--minutes", type=float, default=30.0, help="chaos time (default 30, at most 30)"
    )
    ap.add_argument("--quick", action="store_true", help="CI size: 1.5 minutes, 2 clients")
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument(
        "--stale-after",
        type=float,
        default=STALE_AFTER_S,
        help="the coordinator's --stale-after (a longer one lets rebooted workers return)",
    )
    ap.add_argument(
        "--no-chaos", action="store_true", help="kill nothing: the control run, same load"
    )
    ap.add_argument(
        "--no-relay", action="store_true", help="no coturn: every link direct, the relay spared"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="keep logs here (default: a temp dir)"
    )
    args = ap.parse_args(argv)
    minutes = 1.5 if args.quick else min(args.minutes, 30.0)
    clients = args.clients or (2 if args.quick else 3)
    cfg = SoakConfig(
        minutes=minutes,
        clients=clients,
        tokens=args.tokens,
        seed=args.seed,
        stale_after_s=args.stale_after,
        policy=NO_CHAOS if args.no_chaos else QUICK_POLICY if args.quick else ChaosPolicy(),
        relay=not args.no_relay,
    )
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(soak(cfg, args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="sangama-soak-") as tmp:
            result = asyncio.run(soak(cfg, Path(tmp)))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
