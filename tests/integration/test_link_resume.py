"""A path between two workers dies mid-generation: the link is re-established and the
running session continues, token for token, as if nothing had happened."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import numpy as np
import pytest

from app.client.swarm_client import SwarmClient
from app.credentials import issue_node, load_credentials
from app.lab.local_swarm import LocalSwarm
from core.tokenizer import Tokenizer
from net import wire
from net.channel import Channel, connect_channel
from net.errors import ErrorCode
from net.wire.tensors import WireDtype
from tests.support.whole_model import whole_model_tokens

pytestmark = pytest.mark.integration

CUTS = [0, 6, 12, 18]
PROMPT = "The capital of France is"
N_TOKENS = 24
IDLE_S = 2.0
"""Short QUIC idle timeout, so the dead path is noticed quickly."""


@pytest.fixture(scope="module")
def prompt(gemma_path: Path) -> list[int]:
    tok = Tokenizer.from_gguf(gemma_path)
    try:
        return tok.encode(PROMPT)
    finally:
        tok.close()


@pytest.fixture(scope="module")
def expected(gemma_path: Path, prompt: list[int]) -> list[int]:
    """The whole model's greedy tokens, once for the module: both cuts must give them
    (loading the whole model is a minute of this test's time on a 2-core machine)."""
    return whole_model_tokens(gemma_path, 18, prompt, N_TOKENS)


@pytest.mark.parametrize(
    ("cut", "resumed", "relinks", "client_relinks"),
    [
        # Both links between workers: each worker redials its next stage, which resumes.
        ("workers", (0, 1, 1), (1, 1, 0), 0),
        # The client's links to the first and the last stage: the client redials both.
        ("client", (1, 0, 0), (0, 0, 0), 1),
    ],
)
def test_dead_paths_are_replaced_and_the_session_continues(
    gemma_path: Path,
    prompt: list[int],
    expected: list[int],
    cut: str,
    resumed: tuple[int, ...],
    relinks: tuple[int, ...],
    client_relinks: int,
) -> None:

    async def scenario() -> tuple[list[int], int, int, list[str]]:
        # Every link through a (zero-delay) userspace proxy, so any can be cut:
        # client->stage0, stage0->stage1, stage1->stage2, stage2->client.
        swarm = LocalSwarm(
            model=str(gemma_path), cuts=CUTS, link_delays_ms=[0, 0, 0, 0], idle_timeout=IDLE_S
        )
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            proxies = swarm.proxies[1:3] if cut == "workers" else [swarm.proxies[i] for i in (0, 3)]
            loop = asyncio.get_running_loop()
            tokens: list[int] = []
            async with SwarmClient(
                swarm.client_credentials, swarm.route, tuning=swarm.tuning
            ) as client:
                async for ev in client.generate(prompt, N_TOKENS):
                    tokens.extend(ev.tokens)
                    if len(tokens) == 4:
                        # The paths go silent both ways, longer than the idle timeout:
                        # both ends declare them dead. Then they work again.
                        for proxy in proxies:
                            proxy.loss = 1.0
                            loop.call_later(IDLE_S * 2, setattr, proxy, "loss", 0.0)
                n_client_relinks = client.relinks
            flows = min(p.stats.flows for p in proxies)
        finally:
            await swarm.stop()
            logs = [
                (swarm.workdir / f"stage{i}.log").read_text(errors="replace")
                if swarm.workdir
                else ""
                for i in range(3)
            ]
            swarm.cleanup()
        return tokens, flows, n_client_relinks, logs

    tokens, flows, n_client_relinks, logs = asyncio.run(scenario())
    assert tokens == expected, "the resumed session produced other tokens"
    assert flows >= 2, "each cut link was dialled again (a new QUIC connection)"
    # One relink, or two when the client noticed its two dead links at different times.
    assert (n_client_relinks >= 1) if client_relinks else (n_client_relinks == 0)
    for log, n_resumed, n_relinks in zip(logs, resumed, relinks, strict=True):
        assert f"0 errors, {n_resumed} resumed, {n_relinks} relinks" in log, log[-3000:]


def _append_frame(into: list[wire.Frame], _channel: object, frame: wire.Frame) -> None:
    into.append(frame)


def test_only_the_upstream_that_opened_a_session_may_resume_it(gemma_path: Path) -> None:
    """A repeated OPEN resumes a session only from the node that opened it; another
    node of the same swarm reusing the session id is refused, and the session lives on."""

    async def scenario() -> tuple[list[wire.Frame], list[wire.Frame]]:
        swarm = LocalSwarm(model=str(gemma_path), cuts=[0, 9, 18])
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.workdir is not None
            ca = swarm.workdir / "ca"
            creds = {
                name: load_credentials(issue_node(ca, name, "worker", swarm.workdir / name), name)
                for name in ("owner", "intruder")
            }
            last = swarm.route.last
            got: dict[str, list[wire.Frame]] = {"owner": [], "intruder": []}
            channels: dict[str, Channel] = {}
            for name, c in creds.items():
                ch = await connect_channel(last.address, c, last.node_id)
                ch.on_frame = functools.partial(_append_frame, got[name])
                channels[name] = ch
            opened = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "owner", 4, 2)
            # small finite values: the stage refuses rows no model computes (all zeros)
            rows = np.full((2, 640), 0.01, dtype=np.float32).tobytes()
            # The owner's session first, answered, so that it is surely the older one (two
            # links' first frames may reach the stage in either order).
            channels["owner"].send(opened)
            channels["owner"].send(wire.Step("s1", 0, 0, (1, 2), rows, 2, 640, WireDtype.F32))
            for _ in range(100):
                if any(isinstance(f, wire.Tokens) for f in got["owner"]):
                    break
                await asyncio.sleep(0.1)
            channels["intruder"].send(opened)  # same id, same content, other node
            for _ in range(100):
                if got["intruder"]:
                    break
                await asyncio.sleep(0.1)
            for ch in channels.values():
                ch.close()
            return got["owner"], got["intruder"]
        finally:
            await swarm.stop()
            swarm.cleanup()

    owner, intruder = asyncio.run(scenario())
    assert [f.code for f in intruder if isinstance(f, wire.Error)] == [ErrorCode.NOT_OWNER]
    assert not [f for f in owner if isinstance(f, wire.Error)], owner
    assert [len(f.tokens) for f in owner if isinstance(f, wire.Tokens)] == [1]
