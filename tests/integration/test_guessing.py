"""Guessing on real 3-process chains: guesses verified in one trip, cut by keep_until.

Greedy output with n-gram guesses must equal plain greedy output token for token (a
solo run), on the tiny model and on Gemma; a seeded sampled run replays identically.
Gemma's workers keep llama.cpp's repacked Q4_K weights, whose kernels compute a k+1-row
decode slightly differently from k+1 one-row decodes (up to ~0.9 in a logit, measured),
which can flip a near-tie: the comparison is exact because every stage evaluates guessed
rows one at a time (WorkerConfig.exact_guesses, app.serving.steps.verify_rows).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy
from core.tokenizer import Tokenizer
from core.types import SamplingParams

pytestmark = pytest.mark.integration

SAMPLED = SamplingParams(temperature=0.7, top_k=2, seed=11)
"""Sampled, yet close enough to greedy that the text repeats and n-grams find guesses."""
RUNS = [
    ("none", SamplingParams()),
    ("4", SamplingParams()),
    ("adaptive", SamplingParams()),
    ("4", SAMPLED),
    ("4", SAMPLED),
]


async def _runs(model: Path, cuts: list[int], prompt: list[int], n: int) -> list[list[TokenEvent]]:
    out: list[list[TokenEvent]] = []
    async with LocalSwarm(model=str(model), cuts=cuts, n_ctx=512) as swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(swarm.client_credentials, swarm.route, swarm.tuning) as client:
            for setting, sampling in RUNS:
                policy = GuessPolicy.parse(setting)
                out.append(
                    [ev async for ev in client.generate(prompt, n, sampling, guesses=policy)]
                )
    return out


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.tokens]


def _check(runs: list[list[TokenEvent]], n: int) -> None:
    plain, fixed, adaptive, sampled, sampled_again = runs
    assert len(_tokens(plain)) == n and all(ev.n_guesses == 0 for ev in plain)
    for events in (fixed, adaptive):
        assert _tokens(events) == _tokens(plain)
        assert sum(ev.n_guesses for ev in events) > 0
        assert all(ev.n_accepted <= ev.n_guesses for ev in events)
    # Some guesses stood, so some trips confirmed several tokens: fewer trips than tokens.
    assert sum(ev.n_accepted for ev in fixed) > 0 and len(fixed) < n
    # Seeded sampling with guesses replays identically and stops at max_tokens.
    assert _tokens(sampled) == _tokens(sampled_again) and len(_tokens(sampled)) == n
    assert sum(ev.n_guesses for ev in sampled) > 0


def test_tiny_chain_guessed_greedy_equals_plain(tiny_llama: Path) -> None:
    prompt = [1, 5, 17, 42, 99, 7, 300, 2, 5, 17, 42]
    _check(asyncio.run(_runs(tiny_llama, [0, 3, 6, 8], prompt, 40)), 40)


def test_gemma_chain_guessed_greedy_equals_plain(gemma_path: Path) -> None:
    tok = Tokenizer.from_gguf(gemma_path)
    prompt = tok.encode(
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
    )
    tok.close()
    # 40 tokens: with exact_guesses off, the 4-guess run leaves plain decoding within them
    # (measured with this prompt and these cuts).
    runs = asyncio.run(_runs(gemma_path, [0, 6, 12, 18], prompt, 40))
    _check(runs, 40)
    # Some guesses were rejected, so keep_until cut every stage's cache, and the output
    # still equals plain decoding.
    assert any(ev.n_accepted < ev.n_guesses for ev in runs[1] + runs[2])
