"""`sangama demo` (a loopback swarm answers a question) and `sangama chat`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from app.client import SwarmClient
from app.config import Route
from app.credentials import load_credentials
from app.demo_swarm import print_report, stream_answer
from app.errors import ConfigError
from app.local_swarm import LocalSwarm
from coordinator.client.session import CoordinatorClient
from core.models import resolve_model
from core.tokenizer import Tokenizer
from core.types import SamplingParams
from net.channel import NodeCredentials
from net.quic import QuicTuning
from net.tensors import WireDtype


async def _demo(model: str, cuts: list[int], prompt: str, max_tokens: int, dtype: WireDtype) -> int:
    t0 = time.perf_counter()
    print(f"Starting {len(cuts) - 1} workers on loopback (layers cut at {cuts}) ...", flush=True)
    swarm = LocalSwarm(model=model, cuts=cuts, threads=1)
    async with swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        for w in swarm.workers:
            host, port = w.config.listen
            layers, pid = w.config.layers, w.process.pid
            print(f"  {w.config.node_id}: layers {layers} on udp {host}:{port} (pid {pid})")
        print(
            f"swarm ready in {time.perf_counter() - t0:.1f} s\n\n{prompt}",
            end="",
            flush=True,
        )
        tokenizer = Tokenizer.from_gguf(Path(swarm.route.model))
        try:
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                report = await stream_answer(client, tokenizer, prompt, max_tokens, dtype)
        finally:
            tokenizer.close()
        print_report(report, len(swarm.workers))
    print("\nall workers stopped cleanly")
    return 0


def run_demo(model: str, cuts: list[int], prompt: str, max_tokens: int, wire_dtype: str) -> int:
    return asyncio.run(_demo(model, cuts, prompt, max_tokens, WireDtype[wire_dtype.upper()]))


async def _chat(
    route: Route,
    creds: NodeCredentials,
    tokenizer_path: Path,
    prompt: str,
    max_tokens: int,
    chat_format: bool,
    sampling: SamplingParams,
    dtype: WireDtype,
    coordinator: CoordinatorClient | None = None,
) -> int:
    tokenizer = Tokenizer.from_gguf(tokenizer_path)
    router = None
    dial = None
    if coordinator is not None:  # a joined client: peers behind NAT are reached through ICE
        from app.links import channel_dialer, start_links

        link_dialer, router = await start_links(coordinator, creds, QuicTuning())
        dial = channel_dialer(link_dialer)
    try:
        async with SwarmClient(creds, route, dialer=dial) as client:
            report = await stream_answer(
                client,
                tokenizer,
                prompt,
                max_tokens,
                dtype,
                chat_format=chat_format,
                sampling=sampling,
            )
    finally:
        tokenizer.close()
        if router is not None:
            await router.stop()
    print_report(report, len(route.stages))
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
    sampling: SamplingParams,
    wire_dtype: str,
) -> int:
    """Chat along a route file with static credentials, or as a joined client node."""
    if identity is not None:
        from app.coordinated import fetch_route
        from app.identity import Identity

        me = Identity.load(identity)
        route, tokenizer_path = fetch_route(me)
        creds = me.credentials()
        coordinator: CoordinatorClient | None = me.client()
    else:
        if route_path is None or credentials is None:
            raise ConfigError("give --identity (a joined client) or --route with --credentials")
        route = Route.load(route_path)
        creds = load_credentials(credentials, node_id)
        tokenizer_path = resolve_model(model or route.model)
        coordinator = None
    dtype = WireDtype[wire_dtype.upper()]
    return asyncio.run(
        _chat(
            route,
            creds,
            tokenizer_path,
            prompt,
            max_tokens,
            chat_format,
            sampling,
            dtype,
            coordinator,
        )
    )
