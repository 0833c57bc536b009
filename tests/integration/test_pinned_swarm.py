"""A 2-thread swarm on loopback pins its stages (LocalSwarm's default): every worker's
compute threads end up on single CPUs of its own list, and the tokens stay the whole
model's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient
from app.lab.local_swarm import LocalSwarm
from core.cpu_placement import parse_cpu_list, spread_for_stage
from core.tokenizer import Tokenizer
from tests.support.whole_model import whole_model_tokens

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="pinning a 2-thread stage needs 2 usable CPUs",
    ),
]

CUTS = [0, 6, 12, 18]


def _single_cpu_threads(pid: int) -> dict[int, int]:
    """tid -> CPU for the threads of `pid` allowed on exactly one CPU."""
    pinned: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpus = os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended while we looked
            continue
        if len(cpus) == 1:
            pinned[int(tid)] = next(iter(cpus))
    return pinned


def test_a_two_thread_swarm_pins_its_teams_and_keeps_the_tokens(gemma_path: Path) -> None:
    tok = Tokenizer.from_gguf(gemma_path)
    prompt = tok.encode("The capital of France is")
    tok.close()
    n = 12
    reference = whole_model_tokens(gemma_path, 18, prompt, n)

    async def scenario() -> tuple[list[int], list[str], list[dict[int, int]]]:
        async with LocalSwarm(model=str(gemma_path), cuts=CUTS, threads=2) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                tokens = [t async for ev in client.generate(prompt, n) for t in ev.tokens]
            configs = [w.config for w in swarm.workers]
            pinned = [_single_cpu_threads(w.process.pid) for w in swarm.workers]
        return tokens, [c.cpus for c in configs], pinned

    tokens, cpus, pinned = asyncio.run(scenario())
    assert tokens == reference
    usable = tuple(sorted(os.sched_getaffinity(0)))
    for stage, (listed, threads) in enumerate(zip(cpus, pinned, strict=True)):
        chosen = parse_cpu_list(listed)
        assert chosen == spread_for_stage(usable, stage, 2), listed
        # A team's leader and its helper, each alone on a CPU of the stage's list:
        # every CPU of the list holds at least one of them, and no other CPU any.
        assert set(threads.values()) == set(chosen), (stage, threads, listed)
