"""The model's own MTP head guessing ahead, on a real 3-process qwen35 chain over QUIC,
dense and MoE (qwen35moe, whose stages here hold one kind of layer each at both ends).

The tiny qwen35 (hybrid recurrent + attention, one MTP block) is sliced so the last
stage alone holds the MTP block; it runs the head after every verified token and sends
its guesses back with the tokens; the client sends them with its next step, every stage
evaluates them, the last stage verifies them and keep_until cuts the rejected rows
(seq_rm on attention, n_rs_seq snapshots on the recurrent layers). Greedy output with
MTP guesses equals the whole model's greedy output token for token. The fixture's head
is tied to the trunk's state (it guesses "the last token again") and its trunk often
repeats itself, so some guesses stand and some are rejected. ~25 s.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy
from core.pipeline import LocalPipeline
from core.stage import Stage
from core.types import LayerRange, SamplingParams, StageSpec
from tests.support.tiny_qwen35 import Qwen35Dims, write_qwen35_model

pytestmark = pytest.mark.integration

DIMS = Qwen35Dims()
PROMPT = [1, 5, 17, 42, 99, 7, 30, 2, 9, 11]
N = 40
SAMPLED = SamplingParams(temperature=0.7, top_k=2, seed=11)
RUNS = [
    ("none", SamplingParams()),
    ("mtp:4", SamplingParams()),
    ("mtp", SamplingParams()),  # adaptive, up to 6
    ("mtp+ngram:4", SamplingParams()),
    ("mtp:4", SAMPLED),
    ("mtp:4", SAMPLED),
]


# qwen35moe with routed and shared experts, its layers irregular: cut [0, 2, 4, 6], the
# first stage holds recurrent layers only and the last attention layers only.
MOE_DIMS = Qwen35Dims(moe=True, pattern=(True, True, False, True, False, False))


@pytest.fixture(scope="module", params=[DIMS, MOE_DIMS], ids=["qwen35", "qwen35moe"])
def qwen35_mtp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dims: Qwen35Dims = request.param
    path = tmp_path_factory.mktemp("qwen35mtp") / f"tiny-{dims.arch}-mtp.gguf"
    return write_qwen35_model(path, dims, mtp=True, tie_mtp_head=True, echo=0.35)


async def _runs(model: Path) -> list[list[TokenEvent]]:
    out: list[list[TokenEvent]] = []
    swarm = LocalSwarm(model=str(model), cuts=[0, 2, 4, 6], n_ctx=512, mtp_p_min=0.0)
    async with swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(swarm.client_credentials, swarm.route, swarm.tuning) as client:
            for setting, sampling in RUNS:
                policy = GuessPolicy.parse(setting)
                run = client.generate(PROMPT, N, sampling, guesses=policy)
                out.append([ev async for ev in run])
    return out


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.tokens]


def test_mtp_chain_guessing_equals_whole_model_greedy(qwen35_mtp: Path) -> None:
    whole = LocalPipeline(
        [Stage.from_file(qwen35_mtp, StageSpec(LayerRange(0, 6), 6, n_ctx=512, n_batch=64))]
    )
    try:
        reference = list(whole.generate(PROMPT, N).tokens)
    finally:
        whole.shutdown()
    plain, fixed, adaptive, combined, sampled, sampled_again = asyncio.run(_runs(qwen35_mtp))
    assert _tokens(plain) == reference and all(ev.n_guesses == 0 for ev in plain)
    for events in (fixed, adaptive, combined):
        assert _tokens(events) == reference
        # Counting: every trip gives its accepted guesses plus one token of its own.
        assert all(0 <= ev.n_accepted <= ev.n_guesses for ev in events)
        assert all(len(ev.tokens) == ev.n_accepted + 1 for ev in events[:-1])
        assert sum(ev.n_guesses for ev in events) > 0  # the last stage did send guesses
        # Some guesses stood: fewer trips than tokens, i.e. more than one token per trip.
        assert sum(ev.n_accepted for ev in events) > 0 and len(events) < N
    # Some were rejected too, so keep_until cut every stage (recurrent layers included)
    # and the output still equals the whole model's.
    assert any(ev.n_accepted < ev.n_guesses for ev in fixed + adaptive)
    assert max(ev.n_guesses for ev in fixed) <= 4
    # Seeded sampling with MTP guesses replays identically and stops at max_tokens.
    assert _tokens(sampled) == _tokens(sampled_again) and len(_tokens(sampled)) == N
    assert sum(ev.n_guesses for ev in sampled) > 0
