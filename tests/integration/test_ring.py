"""The ring on a real 3-process swarm (default model): the last stage sends each plain
decode step to the first stage itself, the client sends the prompt only, the tokens are
the whole model's, and a first stage that vanishes is a typed error, not a hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient, TokenEvent
from app.errors import ClientError, StageTimeout
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy
from core.tokenizer import Tokenizer
from net import wire
from tests.support.whole_model import whole_model_tokens

pytestmark = pytest.mark.integration

CUTS = [0, 6, 12, 18]
PROMPT = "The capital of France is"


class CountingClient(SwarmClient):
    """Counts the STEPs this client sends to the first stage."""

    steps_sent = 0

    def _send_first(self, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Step):
            self.steps_sent += 1
        super()._send_first(frame)


async def _collect(events: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [ev async for ev in events]


@pytest.fixture(scope="module")
def prompt_ids(gemma_path: Path) -> list[int]:
    tok = Tokenizer.from_gguf(gemma_path)
    ids = tok.encode(PROMPT)
    tok.close()
    return ids


def test_the_ring_carries_plain_decoding_and_keeps_the_whole_models_tokens(
    gemma_path: Path, prompt_ids: list[int]
) -> None:
    n = 12
    reference = whole_model_tokens(gemma_path, 18, prompt_ids, n)

    async def scenario() -> tuple[list[TokenEvent], int, list[TokenEvent], int, list[int | None]]:
        swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            # One at a time: two clients of one identity would share its reply link.
            ring = CountingClient(swarm.client_credentials, swarm.route)
            async with ring:
                looped = await _collect(ring.generate(prompt_ids, n))
                # Stopping at an end token the last stage does not know: it sent one
                # step past it; the CLOSE ends that, and the next answer is unharmed.
                at = next(i for i in range(2, n) if reference[i] not in reference[:i])
                stop = reference[at]
                ended = await _collect(ring.generate(prompt_ids, n, is_end=lambda t: t == stop))
                again = await _collect(ring.generate(prompt_ids, n))
            plain = CountingClient(swarm.client_credentials, swarm.route, ring=False)
            async with plain:
                own = await _collect(plain.generate(prompt_ids, n))
        finally:
            codes = await swarm.stop()
            swarm.cleanup()
        assert [t for ev in ended for t in ev.tokens] == reference[: at + 1]
        assert [t for ev in again for t in ev.tokens] == reference
        return looped, ring.steps_sent, own, plain.steps_sent, codes

    looped, ring_steps, own, plain_steps, codes = asyncio.run(scenario())
    assert codes == [0, 0, 0]
    assert [t for ev in looped for t in ev.tokens] == reference
    assert [t for ev in own for t in ev.tokens] == reference
    # The client sent the prompt (one chunk) and nothing else; every reply but the last
    # says the next step went round.
    assert ring_steps == 3  # one prompt chunk for each of its three generations
    assert [ev.looped for ev in looped] == [True] * (n - 1) + [False]
    assert plain_steps == n and not any(ev.looped for ev in own)
    assert all([t.stage for t in ev.timings] == [0, 6, 12] for ev in looped)


def test_a_first_stage_vanishing_mid_ring_is_a_typed_error(
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
                async for ev in client.generate(prompt_ids, 200):
                    assert got == 0 or ev.looped
                    got += 1
                    if got == 3:
                        swarm.kill(0)  # the stage the ring feeds vanishes
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
    assert not isinstance(err, StageTimeout), err  # detected, not waited out


def test_guessed_decoding_goes_round_the_ring_and_keeps_the_plain_answer(
    gemma_path: Path,
) -> None:
    """n-gram guesses proposed by the last stage: fewer trips than tokens, the client
    sends the prompt only, and the tokens are plain greedy decoding's."""
    tok = Tokenizer.from_gguf(gemma_path)
    prompt = tok.encode("one two three four five one two three four five one two three")
    tok.close()
    n = 24

    async def scenario() -> tuple[list[TokenEvent], list[TokenEvent], int]:
        async with LocalSwarm(model=str(gemma_path), cuts=CUTS) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            client = CountingClient(swarm.client_credentials, swarm.route)
            async with client:
                plain = await _collect(client.generate(prompt, n))
                before = client.steps_sent
                guessed = await _collect(client.generate(prompt, n, guesses=GuessPolicy.parse("4")))
                return plain, guessed, client.steps_sent - before

    plain, guessed, steps = asyncio.run(scenario())
    assert [t for ev in guessed for t in ev.tokens] == [t for ev in plain for t in ev.tokens]
    assert steps == 1  # the prompt; every guessed step went round
    assert all(ev.looped for ev in guessed[:-1])
    assert sum(ev.n_guesses for ev in guessed) > 0
    assert all(ev.n_accepted <= ev.n_guesses for ev in guessed)
    assert sum(ev.n_accepted for ev in guessed) > 0 and len(guessed) < n
