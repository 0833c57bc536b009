"""Drafting on real 3-process chains: guesses verified in one trip, cut by keep_until.

Greedy output with n-gram guesses must equal plain greedy output token for token (a
solo run), on the tiny model and on Gemma; a seeded sampled run replays identically.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from core.drafting import GuessPolicy
from core.tokenizer import Tokenizer
from core.types import SamplingParams

pytestmark = pytest.mark.integration

SETTINGS = ["none", "4", "adaptive"]


async def _runs(
    model: Path, cuts: list[int], prompt: list[int], n: int, sampling: SamplingParams
) -> dict[str, list[TokenEvent]]:
    out: dict[str, list[TokenEvent]] = {}
    async with LocalSwarm(model=str(model), cuts=cuts, n_ctx=512) as swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(swarm.client_credentials, swarm.route, swarm.tuning) as client:
            for setting in SETTINGS:
                policy = GuessPolicy.parse(setting)
                out[setting] = [
                    ev async for ev in client.generate(prompt, n, sampling, guesses=policy)
                ]
            out["again"] = [
                ev
                async for ev in client.generate(prompt, n, sampling, guesses=GuessPolicy.parse("4"))
            ]
    return out


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.tokens]


def test_tiny_chain_drafted_greedy_equals_plain(tiny_llama: Path) -> None:
    prompt = [1, 5, 17, 42, 99, 7, 300, 2, 5, 17, 42]
    runs = asyncio.run(_runs(tiny_llama, [0, 3, 6, 8], prompt, 40, SamplingParams()))
    plain = _tokens(runs["none"])
    assert len(plain) == 40
    assert all(ev.n_drafts == 0 for ev in runs["none"])
    for setting in ("4", "adaptive"):
        events = runs[setting]
        assert _tokens(events) == plain, setting
        proposed = sum(ev.n_drafts for ev in events)
        accepted = sum(ev.n_accepted for ev in events)
        assert proposed > 0 and 0 < accepted <= proposed, setting
        # Fewer trips than tokens: the guesses were confirmed in one trip each.
        assert len(events) < len(plain), setting
        assert all(ev.n_accepted <= ev.n_drafts for ev in events)


def test_gemma_chain_drafted_greedy_equals_plain_and_sampling_replays(gemma_path: Path) -> None:
    tok = Tokenizer.from_gguf(gemma_path)
    prompt = tok.encode(
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
    )
    tok.close()
    greedy = asyncio.run(_runs(gemma_path, [0, 6, 12, 18], prompt, 24, SamplingParams()))
    plain = _tokens(greedy["none"])
    for setting in ("4", "adaptive", "again"):
        assert _tokens(greedy[setting]) == plain, setting
    events = greedy["4"]
    assert sum(ev.n_accepted for ev in events) > 0
    # Some guesses were rejected, so keep_until cut every stage's cache, and the
    # output still equals plain decoding.
    assert any(ev.n_accepted < ev.n_drafts for ev in events)

    sampled = SamplingParams(temperature=0.8, seed=11)
    runs = asyncio.run(_runs(gemma_path, [0, 6, 12, 18], prompt, 24, sampled))
    assert _tokens(runs["4"]) == _tokens(runs["again"])  # seeded: replays identically
    assert len(_tokens(runs["4"])) == 24
    assert sum(ev.n_drafts for ev in runs["4"]) > 0
