"""A real swarm on loopback (the default model) where one worker lies on purpose
(app.serving.chaos_lies): the next stage refuses rows no model computes before its
engine sees them, the client hears which check failed and whom to suspect, and an
honest swarm's answers raise no alarm."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.generation import answer_of
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy, accused
from app.client.swarm_client import SwarmClient
from app.config import Route
from app.errors import RowsRefused
from app.lab.local_run import build_pipeline
from app.lab.local_swarm import LocalSwarm
from core.tokenizer import Tokenizer
from core.types import LayerRange
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.integration

CUTS = [0, 10, 20, 30]
PROMPT = "The capital of France is"


def _prompt(model: Path) -> list[int]:
    tok = Tokenizer.from_gguf(model)
    try:
        return tok.encode(PROMPT)
    finally:
        tok.close()


async def _answer(
    swarm: LocalSwarm, prompt: list[int], n: int, dtype: WireDtype = WireDtype.F32
) -> list[int]:
    assert swarm.route is not None and swarm.client_credentials is not None
    async with SwarmClient(swarm.client_credentials, swarm.route, swarm.tuning) as client:
        return [t async for ev in client.generate(prompt, n, wire_dtype=dtype) for t in ev.tokens]


@pytest.mark.parametrize(
    ("liar", "kind", "checks"),
    [
        (0, "zeros", {"zero-row"}),
        (1, "flip", {"not-finite", "norm-ceiling"}),
    ],
)
def test_the_stage_after_a_liar_refuses_its_rows_and_the_client_knows_whom(
    smollm2_path: Path, liar: int, kind: str, checks: set[str]
) -> None:
    prompt = _prompt(smollm2_path)

    async def scenario() -> tuple[RowsRefused, list[str]]:
        swarm = LocalSwarm(
            model=str(smollm2_path),
            cuts=CUTS,
            worker_env={liar: {"SANGAMA_TEST_LIE": kind, "SANGAMA_TEST_LIE_SEED": "3"}},
        )
        async with swarm:
            with pytest.raises(RowsRefused) as caught:
                await _answer(swarm, prompt, 4)
            assert swarm.route is not None
            stages = [(s.node_id, s.layers.start, s.layers.stop) for s in swarm.route.stages]
            alive = [w.alive for w in swarm.workers]
        assert alive == [True, True, True]  # a refusal is a typed answer, not a crash
        return caught.value, list(accused(caught.value, stages))

    error, suspects = asyncio.run(scenario())
    assert error.error_code is ErrorCode.STAGE_ERROR
    assert error.check in checks
    assert error.from_layer == CUTS[liar + 1]  # refused by the stage right after the liar
    assert suspects == [f"stage{liar}"]


def test_an_honest_swarm_and_a_plausible_lie_raise_no_alarm(smollm2_path: Path) -> None:
    """The checks never refuse an honest step (f32 or bf16 rows); small noise, a lie
    that looks like a model's rows, passes them too (spot checks are for those)."""
    prompt = _prompt(smollm2_path)

    async def scenario() -> tuple[list[int], list[int], list[int], str]:
        honest = LocalSwarm(model=str(smollm2_path), cuts=CUTS)
        async with honest:
            answer = await _answer(honest, prompt, 12)
            halved = await _answer(honest, prompt, 12, WireDtype.BF16)
        noisy = LocalSwarm(
            model=str(smollm2_path), cuts=CUTS, worker_env={1: {"SANGAMA_TEST_LIE": "noise"}}
        )
        async with noisy:
            lied = await _answer(noisy, prompt, 12)
            assert noisy.workdir is not None
            log = (noisy.workdir / "stage1.log").read_text(encoding="utf-8", errors="replace")
        return answer, halved, lied, log

    answer, halved, lied, log = asyncio.run(scenario())
    assert len(answer) == len(halved) == len(lied) == 12  # no step refused
    assert "lies on purpose" in log  # the noise was there all the same


def test_an_answer_survives_a_stage_that_lies_now_and_then(smollm2_path: Path) -> None:
    """Each refused step breaks the answer with RowsRefused; the client replays what it
    has (the liar is the only node for its layers here, so through it again; the
    refusing stage kept the session for the replay to take over) and the answer ends
    as the whole model's, token for token."""
    prompt = _prompt(smollm2_path)
    n = 10
    whole = build_pipeline([smollm2_path], [LayerRange(0, 30)], 30, 1024, 64, 1, True)
    try:
        expected = list(whole.generate(prompt, n).tokens)
    finally:
        whole.shutdown()
    lie = {"SANGAMA_TEST_LIE": "zeros", "SANGAMA_TEST_LIE_RATE": "0.2",
           "SANGAMA_TEST_LIE_SEED": "4"}  # fmt: skip

    async def scenario() -> tuple[list[int], RecoveringClient]:
        swarm = LocalSwarm(model=str(smollm2_path), cuts=CUTS, worker_env={1: lie})
        async with swarm:
            route, creds = swarm.route, swarm.client_credentials
            assert route is not None and creds is not None

            async def same_route(_avoid: tuple[str, ...]) -> Route:
                return route

            client = RecoveringClient(
                creds, route, same_route, RecoveryPolicy(step_timeout_s=20.0), swarm.tuning
            )
            async with client:
                out = await answer_of(client.generate(prompt, n))
        return out, client

    out, client = asyncio.run(scenario())
    assert out == expected
    assert client.recoveries  # the liar did lie, and was caught
    for recovery in client.recoveries:
        assert "rows refused at layer 20 (zero-row)" in recovery.failure
        assert "stage1" in recovery.dead
