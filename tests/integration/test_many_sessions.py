"""A worker holds 256 sessions at once; the 257th is refused with OVERLOADED and a retry
hint, and the 256 finish with the tokens each gives alone: batched in one decode per
step, each on a KV stream of its own, a session's numbers are those it gets alone.

Real worker processes, real QUIC on loopback, one client connection carrying every
session: no limit sized for one request (frames in flight per link, streams, calls,
queues) may refuse before the stages' admission does. A tiny model keeps it quick
(~25 s on two shared cores).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.errors import Overloaded
from app.lab.local_run import build_pipeline
from app.lab.local_swarm import LocalSwarm
from core.types import LayerRange
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

SESSIONS = 256
PROMPT_LEN, NEW = 4, 6
RESERVED = PROMPT_LEN + NEW + 16  # what admission reserves per session (guess slack 16)
CUTS = [0, 4, 8]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("many") / "tiny8.gguf", n_layer=8)


def _prompt(k: int) -> list[int]:
    return [1 + (k * 7 + j * 13) % 500 for j in range(PROMPT_LEN)]


async def _rest(first: TokenEvent, gen: AsyncIterator[TokenEvent]) -> list[int]:
    tokens = list(first.tokens)
    async for ev in gen:
        tokens.extend(ev.tokens)
    return tokens


def test_256_sessions_run_together_and_the_257th_is_told_to_retry(tiny: Path) -> None:
    async def scenario() -> tuple[list[list[int]], Overloaded | None, list[int]]:
        swarm = LocalSwarm(
            model=str(tiny),
            cuts=CUTS,
            max_sessions=SESSIONS,
            n_ctx=RESERVED,
        )
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                gens: list[AsyncGenerator[TokenEvent, None]] = [
                    client.generate(_prompt(k), NEW)  # type: ignore[misc]
                    for k in range(SESSIONS)
                ]
                # A first token means the session is open on every stage of the chain.
                firsts = await asyncio.gather(*(g.__anext__() for g in gens))
                refused: Overloaded | None = None
                try:
                    async for _ in client.generate(_prompt(SESSIONS), NEW):
                        pass
                except Overloaded as exc:
                    refused = exc
                answers = await asyncio.gather(
                    *(_rest(f, g) for f, g in zip(firsts, gens, strict=True))
                )
                # Every slot and reservation came back: a new session runs again.
                again = [t async for ev in client.generate(_prompt(0), NEW) for t in ev.tokens]
        finally:
            codes = await swarm.stop()
            swarm.cleanup()
        assert codes == [0, 0]
        return answers, refused, again

    answers, refused, again = asyncio.run(scenario())
    assert refused is not None, "the 257th session must be refused"
    assert refused.retry_after_ms > 0 and refused.try_another_route
    assert "256 sessions" in refused.message
    assert all(len(a) == NEW for a in answers)

    # Alone: the whole model in this process, one session at a time, no batching.
    alone = build_pipeline([tiny], [LayerRange(0, 8)], 8, 64, 64, 1, True)
    try:
        solo = [list(alone.generate(_prompt(k), NEW).tokens) for k in range(SESSIONS)]
    finally:
        alone.shutdown()
    same = sum(a == s for a, s in zip(answers, solo, strict=True))
    assert same == SESSIONS, f"{same} of {SESSIONS} gave the tokens they give alone"
    assert again == solo[0]


def test_32_batched_requests_give_their_solo_tokens(tiny: Path) -> None:
    # Batched across sessions (the default), and also one decode per session
    # (WorkerConfig.reproducible): both give every request the tokens it gives alone.
    n = 32

    async def scenario(reproducible: bool) -> list[list[int]]:
        async with LocalSwarm(
            model=str(tiny), cuts=CUTS, max_sessions=n, n_ctx=64, reproducible=reproducible
        ) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:

                async def one(k: int) -> list[int]:
                    return [t async for ev in client.generate(_prompt(k), NEW) for t in ev.tokens]

                return list(await asyncio.gather(*(one(k) for k in range(n))))

    batched, one_by_one = asyncio.run(scenario(False)), asyncio.run(scenario(True))
    alone = build_pipeline([tiny], [LayerRange(0, 8)], 8, 64, 64, 1, True)
    try:
        solo = [list(alone.generate(_prompt(k), NEW).tokens) for k in range(n)]
    finally:
        alone.shutdown()
    assert batched == solo
    assert one_by_one == solo
