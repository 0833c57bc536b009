"""Guessing ahead with 16 sessions in one batch: each session's greedy output equals its
solo plain run (a KV stream per session and batch-invariant kernels: batching never
changes a session's arithmetic, nor does a verification's row count), and the guesses
really ran (counts).

Real worker processes, real QUIC on loopback; the tiny random-weight model keeps it
quick (~30 s on two shared cores).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_run import build_pipeline
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy
from core.types import LayerRange
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

SESSIONS = 16
NEW = 24
CUTS = [0, 4, 8]


def _prompt(k: int) -> list[int]:
    """A phrase said twice and begun a third time, so the n-gram lookup finds guesses."""
    phrase = [1 + (k * 7 + j * 13) % 500 for j in range(5)]
    return [*phrase, 9, *phrase, 9, *phrase[:3]]


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.tokens]


def test_16_guessing_sessions_in_one_batch_give_their_solo_tokens(tmp_path: Path) -> None:
    tiny = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    policies = [GuessPolicy.fixed(4), GuessPolicy()]  # fixed 4 and adaptive, alternating

    async def scenario() -> list[list[TokenEvent]]:
        async with LocalSwarm(model=str(tiny), cuts=CUTS, max_sessions=SESSIONS, n_ctx=96) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:

                async def one(k: int) -> list[TokenEvent]:
                    gen = client.generate(_prompt(k), NEW, guesses=policies[k % 2])
                    return [ev async for ev in gen]

                return list(await asyncio.gather(*(one(k) for k in range(SESSIONS))))

    runs = asyncio.run(scenario())
    alone = build_pipeline([tiny], [LayerRange(0, 8)], 8, 64, 64, 1, True)
    try:
        solo = [list(alone.generate(_prompt(k), NEW).tokens) for k in range(SESSIONS)]
    finally:
        alone.shutdown()
    same = sum(_tokens(r) == s for r, s in zip(runs, solo, strict=True))
    assert same == SESSIONS, f"{same} of {SESSIONS} guessing sessions gave their solo tokens"
    proposed = sum(ev.n_guesses for r in runs for ev in r)
    accepted = sum(ev.n_accepted for r in runs for ev in r)
    assert proposed > 0 and all(ev.n_accepted <= ev.n_guesses for r in runs for ev in r)
    # Guesses that stood confirmed several tokens in one trip: fewer trips than tokens.
    assert accepted > 0 and sum(len(r) for r in runs) < SESSIONS * NEW
