"""A real 3-process swarm on loopback (default model): exactness, bf16, failures, bad frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.errors import ClientError, StageFailed, StageTimeout
from app.lab.local_run import build_pipeline
from app.lab.local_swarm import LocalSwarm
from core.tokenizer import Tokenizer
from core.types import LayerRange
from net import wire
from net.channel import Channel, connect_channel
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.integration

CUTS = [0, 6, 12, 18]
PROMPT = "The capital of France is"


async def _collect(events: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [ev async for ev in events]


def _whole_model(gemma: Path, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    whole = build_pipeline([gemma], [LayerRange(0, 18)], 18, 1024, 64, 2, True)
    try:
        gen = whole.generate(prompt, n, keep_logits=True)
    finally:
        whole.shutdown()
    assert gen.logits is not None
    return list(gen.tokens), gen.logits


@pytest.fixture(scope="module")
def prompt_ids(gemma_path: Path) -> list[int]:
    tok = Tokenizer.from_gguf(gemma_path)
    ids = tok.encode(PROMPT)
    tok.close()
    return ids


def test_swarm_equals_whole_model_and_bf16_keeps_the_answer(
    gemma_path: Path, prompt_ids: list[int]
) -> None:
    n = 16
    ref_tokens, ref_logits = _whole_model(gemma_path, prompt_ids, n)

    async def scenario() -> tuple[list[TokenEvent], list[TokenEvent], list[int | None]]:
        swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS, return_logits=True)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                f32 = await _collect(client.generate(prompt_ids, n, wire_dtype=WireDtype.F32))
                bf16 = await _collect(client.generate(prompt_ids, n, wire_dtype=WireDtype.BF16))
        finally:
            codes = await swarm.stop()
            swarm.cleanup()
        return f32, bf16, codes

    f32, bf16, codes = asyncio.run(scenario())
    assert codes == [0, 0, 0], "workers stop cleanly on SIGTERM"
    tokens = [t for ev in f32 for t in ev.tokens]
    assert tokens == ref_tokens
    logits = np.stack([ev.logits for ev in f32 if ev.logits is not None])
    assert float(np.abs(logits - ref_logits).max()) == 0.0
    # Every event carries one timing per stage, in chain order.
    assert all([t.stage for t in ev.timings] == [0, 6, 12] for ev in f32)
    # bf16 keeps 8 mantissa bits of each hidden state. What that must keep, whatever the
    # CPU's kernels: the first tokens of a short factual answer, and logits of the same
    # context pointing the same way. Once a token differs the contexts differ, so logits
    # are compared only while the tokens agree.
    bf16_tokens = [t for ev in bf16 for t in ev.tokens]
    assert bf16_tokens[:4] == ref_tokens[:4]
    pairs = zip(bf16_tokens, ref_tokens, strict=False)
    agree = next((i for i, (a, b) in enumerate(pairs) if a != b), n)
    bf16_logits = np.stack([ev.logits for ev in bf16 if ev.logits is not None])[: agree + 1]
    same = ref_logits[: len(bf16_logits)]
    deviation = float(np.abs(bf16_logits - same).max())
    cosine = float(
        (bf16_logits[0] @ same[0]) / (np.linalg.norm(bf16_logits[0]) * np.linalg.norm(same[0]))
    )
    print(
        f"bf16 wire: {agree}/{n} tokens equal; max |logit deviation| {deviation:.3f} while"
        f" equal; first-step cosine {cosine:.5f}"
    )
    assert deviation > 0.0, "the bf16 wire must really round the hidden states"
    assert cosine > 0.99


def test_a_killed_worker_gives_the_client_a_typed_error_not_a_hang(
    gemma_path: Path, prompt_ids: list[int]
) -> None:
    async def scenario() -> BaseException | None:
        swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            client = SwarmClient(swarm.client_credentials, swarm.route, step_timeout=60.0)
            await client.connect()
            got = 0
            try:
                async for _ev in client.generate(prompt_ids, 200):
                    got += 1
                    if got == 3:
                        swarm.kill(1)  # the middle stage vanishes mid-generation
            except ClientError as exc:
                return exc
            finally:
                await client.close()
            return None
        finally:
            await swarm.stop()
            swarm.cleanup()

    err = asyncio.run(scenario())
    assert isinstance(err, ClientError), err
    # Not the 60 s deadline: the failure was detected and reported along the chain.
    assert not isinstance(err, StageTimeout), err
    assert "stage1" in str(err)


def test_bad_frames_from_an_authenticated_peer_close_only_that_session(
    gemma_path: Path, prompt_ids: list[int]
) -> None:
    async def scenario() -> tuple[list[wire.Frame], list[int]]:
        swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            first = swarm.route.first
            got: list[wire.Frame] = []
            rogue: Channel = await connect_channel(
                first.address, swarm.client_credentials, first.node_id
            )
            rogue.on_frame = lambda _ch, f: got.append(f)
            spec = wire.SamplingSpec()
            # a STEP for a session this connection never opened
            rogue.send(wire.Step("nobody", 0, 0, (1, 2), None, 2, 0, WireDtype.F32))
            # a session opened properly, then rows that skip positions
            rogue.send(wire.Open("s1", "m", WireDtype.F32, spec, "client", 8, 2))
            rogue.send(wire.Step("s1", 0, 5, (1, 2), None, 2, 0, WireDtype.F32))
            # hidden rows sent to the first stage, which takes tokens
            rogue.send(wire.Open("s2", "m", WireDtype.F32, spec, "client", 8, 1))
            rogue.send(wire.Step("s2", 0, 0, (), b"\0" * 640 * 4, 1, 640, WireDtype.F32))
            for _ in range(100):
                if len([f for f in got if isinstance(f, wire.Error)]) >= 3:
                    break
                await asyncio.sleep(0.05)
            # The worker still serves a well-behaved client end to end.
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                tokens = [
                    t for ev in await _collect(client.generate(prompt_ids, 4)) for t in ev.tokens
                ]
            rogue.close()
            return got, tokens
        finally:
            await swarm.stop()
            swarm.cleanup()

    got, tokens = asyncio.run(scenario())
    errors = {f.session: f.code for f in got if isinstance(f, wire.Error)}
    assert errors.get("nobody") == ErrorCode.NOT_OWNER
    assert errors.get("s1") == ErrorCode.MISSING_POSITIONS  # rows not continuing the cache
    assert errors.get("s2") == ErrorCode.BAD_SHAPE
    assert len(tokens) == 4


def test_a_session_on_a_stage_that_is_full_is_refused_with_a_typed_error(
    gemma_path: Path, prompt_ids: list[int]
) -> None:
    async def scenario() -> BaseException | None:
        swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS, max_sessions=1)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                first = cast(AsyncGenerator[TokenEvent, None], client.generate(prompt_ids, 50))
                await first.__anext__()  # session one holds the only slot on every stage
                try:
                    await _collect(client.generate(prompt_ids, 4))
                except ClientError as exc:
                    return exc
                finally:
                    await first.aclose()
            return None
        finally:
            await swarm.stop()
            swarm.cleanup()

    err = asyncio.run(scenario())
    assert isinstance(err, StageFailed) and err.code == "OVERLOADED", err
