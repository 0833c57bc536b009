"""A replay after a reroute keeps the KV of the stages that survived downstream of the
replaced one: real coordinator and worker processes, a chain and a spare. Three stages:
the middle stage is killed with SIGKILL after the 5th of 40 greedy tokens. The answer
equals the whole model's token for token, and the last stage (which the new route keeps)
took the old session's KV over: over the whole answer it computed every position exactly
once, the replay's rows it held were not computed again (counts from its heartbeat),
while the spare computed them all. Four stages: the second is killed, and the third and
the fourth both keep their KV."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route, route_avoiding
from app.config import Route
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from app.serving.coordinated import HEARTBEAT_S
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7, 3, 11, 64, 2, 8, 31]
N_TOKENS = 40
KILL_AFTER = 5


async def _worker(coord: CoordinatorProcess, wd: Path, name: str, wait: bool) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180, wait_ready=wait)


def _stats_when(
    coord: CoordinatorProcess, node: str, ready: Any, timeout: float = 30.0
) -> dict[str, Any]:
    """The node's heartbeat stats once `ready(stats)` holds (the next beats bring them)."""
    end = time.monotonic() + timeout
    stats: dict[str, Any] = {}
    while time.monotonic() < end:
        nodes = {n["node_id"]: n for n in coord.admin.swarm()["nodes"]}
        stats = nodes.get(node, {}).get("stats") or {}
        if ready(stats):
            return stats
        time.sleep(0.5)
    raise AssertionError(f"{node}'s stats never got there: {stats}")


def _second_stage_killed(
    tmp_path: Path, n_stages: int
) -> tuple[list[int], list[int], RecoveringClient, list[str], dict[str, Any]]:
    """A chain of `n_stages` workers of the tiny model and a spare; the second stage is
    killed with SIGKILL after the KILL_AFTER-th token of a greedy answer. Returns the
    whole model's tokens, the answer, the client, the first chain and the heartbeat
    stats of every stage of the new chain over the whole answer."""
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=n_stages,
        # No two-token probes of the chain: the test counts every row a stage computes.
        extra_args=[
            "--spares",
            "1",
            "--stale-after",
            "2",
            "--dead-after",
            "4",
            "--answer-probe-every",
            "0",
        ],
    )

    def whole_answer_stats(client: RecoveringClient, chain: list[str]) -> dict[str, Any]:
        new_chain = [s.node_id for s in client.route.stages]
        for kept in chain[2:]:
            _stats_when(coord, kept, lambda s: s.get("adopted", 0) >= 1 and s["steps"] >= N_TOKENS)
        time.sleep(1.5 * HEARTBEAT_S)  # one more beat: the counters are the whole answer's
        return {node: _stats_when(coord, node, lambda s: True) for node in new_chain}

    async def scenario() -> tuple[list[int], RecoveringClient, list[str], dict[str, Any]]:
        chain_workers = list(
            await asyncio.gather(
                *(_worker(coord, tmp_path, f"w{i}", True) for i in range(n_stages))
            )
        )
        spare = await _worker(coord, tmp_path, "spare", False)
        try:
            loop = asyncio.get_running_loop()
            me = await loop.run_in_executor(
                None, join_swarm, coord.admin.create_invite("client")["code"], tmp_path / "me"
            )
            route, _ = await loop.run_in_executor(None, fetch_route, me)
            chain = [s.node_id for s in route.stages]
            assert len(chain) == n_stages
            victim = next(w for w in chain_workers if w.ready_line.split()[1] == chain[1])

            async def avoiding(avoid: tuple[str, ...]) -> Route:
                return await loop.run_in_executor(None, route_avoiding, me, avoid)

            client = RecoveringClient(
                me.credentials(), route, avoiding, RecoveryPolicy(step_timeout_s=10.0)
            )
            out: list[int] = []
            async with client:
                async for event in client.generate(PROMPT, N_TOKENS):
                    apply_event(out, event)
                    if len(out) == KILL_AFTER:
                        os.kill(victim.process.pid, signal.SIGKILL)
            # The workers' heartbeats bring the counters while they still serve.
            stats = await loop.run_in_executor(None, whole_answer_stats, client, chain)
            return out, client, chain, stats
        finally:
            await asyncio.gather(*(w.stop() for w in [*chain_workers, spare]))

    try:
        return (expected, *asyncio.run(scenario()))
    finally:
        coord.stop()


def test_middle_stage_killed_the_last_stage_keeps_its_kv(tmp_path: Path) -> None:
    expected, out, client, chain, stats = _second_stage_killed(tmp_path, 3)
    last = chain[-1]
    assert out == expected  # every token, equal to the uninterrupted whole model
    assert client.recoveries, "the kill went unnoticed"
    first = client.recoveries[0]
    assert chain[1] in first.dead
    new_chain = [s.node_id for s in client.route.stages]
    assert new_chain[-1] == last and new_chain[1] != chain[1]
    stalls = [round(r.stall_s, 2) for r in client.recoveries]
    print(f"\nrecoveries: {[(r.failure, r.dead, r.replayed) for r in client.recoveries]}")
    print(f"stalls (s): {stalls}; last stage {last}: {stats[last]}")
    # The last stage held every replayed position but the newest: it computed only
    # that one, so over the whole answer each position was computed once (a replay
    # that broke again before its first token may add a row per extra recovery).
    positions = len(PROMPT) + N_TOKENS - 1
    assert positions <= stats[last]["rows"] <= positions + len(client.recoveries) - 1
    assert stats[last]["rows_reused"] >= first.replayed - 1 >= len(PROMPT) + KILL_AFTER - 1
    # The stage that replaced the middle one held nothing: it computed the replay.
    assert stats[new_chain[1]]["rows"] >= first.replayed
    assert stats[new_chain[1]]["rows_reused"] == 0


def test_second_of_four_stages_killed_the_stages_after_it_keep_their_kv(tmp_path: Path) -> None:
    """Four stages, the second killed: the replay's OPEN names the third stage's first
    layer, so the third and the last take the old session over and compute only the
    final replayed row (the third forwards only that row), the first and the spare
    compute the whole replay; the upstream stage learns its new next hop before the
    replay needs it, so the first replay answers. ~60 s."""
    expected, out, client, chain, stats = _second_stage_killed(tmp_path, 4)
    assert out == expected  # every token, equal to the uninterrupted whole model
    (first, *_) = client.recoveries
    print(f"\nrecoveries: {[(r.failure, r.dead, r.replays) for r in client.recoveries]}")
    assert chain[1] in first.dead
    # The first replay answered: the first stage did not forward it to the dead one.
    assert first.replays == 1, first.failure
    new_chain = [s.node_id for s in client.route.stages]
    assert new_chain[0] == chain[0] and new_chain[2:] == chain[2:]
    assert new_chain[1] != chain[1]
    positions = len(PROMPT) + N_TOKENS - 1
    counts = {n: (s["rows"], s["rows_reused"], s["adopted"]) for n, s in stats.items()}
    print(f"\nrows, rows reused, adopted: {counts}")
    for kept in chain[2:]:
        # Each position computed once over the whole answer: the replay's rows it
        # held were neither computed again nor (on the third stage) sent on.
        assert stats[kept]["adopted"] == 1
        assert stats[kept]["rows"] == positions
        assert stats[kept]["rows_reused"] == first.replayed - 1
    # The first stage feeds the spare every row: it computed the replay again.
    assert stats[chain[0]]["adopted"] == 0
    assert stats[chain[0]]["rows"] >= positions + first.replayed - 1
    assert stats[new_chain[1]]["rows_reused"] == 0
    assert stats[new_chain[1]]["rows"] >= first.replayed
