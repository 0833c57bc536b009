"""`sangama chat`: one question to a swarm, as a joined client or along a route file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.client.chat_run import print_report, stream_answer
from app.client.connect import ChatConnector, direct_connector, identity_connector
from app.config import Route
from app.credentials import load_credentials
from app.errors import ConfigError
from core.guessing import GuessPolicy
from core.models import resolve_model
from core.sampling_defaults import SamplingChoice
from net.wire.tensors import WireDtype


async def _chat(
    connect: ChatConnector,
    prompt: str,
    max_tokens: int,
    chat_format: bool,
    sampling: SamplingChoice,
    dtype: WireDtype,
    guesses: GuessPolicy,
) -> int:
    conn = await connect()
    try:
        report = await stream_answer(
            conn.client,
            conn.tokenizer,
            prompt,
            max_tokens,
            dtype,
            chat_format=chat_format,
            sampling=sampling,
            guesses=guesses,
        )
    finally:
        await conn.close()
    print_report(report, conn.stages)
    return 0


def run_chat_cli(
    *,
    route_path: Path | None,
    credentials: Path | None,
    identity: Path | None,
    node_id: str,
    model: str | None,
    prompt: str,
    max_tokens: int,
    chat_format: bool,
    sampling: SamplingChoice,
    wire_dtype: str,
    guesses: str = "adaptive",
) -> int:
    """Chat along a route file with static credentials, or as a joined client node.
    `model`: as a joined client, which of the swarm's models answers (its default when
    None); along a route file, the GGUF that holds the tokenizer."""
    if identity is not None:
        connect = identity_connector(identity, model=model or "default")
    else:
        if route_path is None or credentials is None:
            raise ConfigError("give --identity (a joined client) or --route with --credentials")
        route = Route.load(route_path)
        creds = load_credentials(credentials, node_id)
        connect = direct_connector(creds, route, resolve_model(model or route.model))
    dtype = WireDtype[wire_dtype.upper()]
    policy = GuessPolicy.parse(guesses)
    return asyncio.run(_chat(connect, prompt, max_tokens, chat_format, sampling, dtype, policy))
