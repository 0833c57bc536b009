"""`sangama demo --static`: a loopback swarm of worker processes on fixed cuts, no
coordinator; it answers one question, or stays up behind the OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from app.api.access import default_key_path, load_or_create_key
from app.api.openai_api import DEFAULT_PORT
from app.api.openai_serve import announce, serve_api
from app.api.swarm_backend import SwarmBackend
from app.client.chat_run import demo_prompt, print_report, stream_answer
from app.client.connect import open_chat
from app.lab.local_run import even_cuts
from app.lab.local_swarm import LocalSwarm
from core.models import resolve_model, stage_files
from core.tokenizer import Tokenizer
from net.wire.tensors import WireDtype


def _starting(cuts: list[int]) -> None:
    print(f"Starting {len(cuts) - 1} workers on loopback (layers cut at {cuts}) ...", flush=True)


def demo_cuts(model: str, cuts: list[int] | None, stages: int) -> list[int]:
    """The given cuts, else `stages` even stages over the model's layers."""
    if cuts:
        return cuts
    manifest, _ = stage_files(resolve_model(model), [])
    return even_cuts(manifest.facts.n_layer, stages)


async def _demo(
    model: str, cuts: list[int], prompt: str | None, max_tokens: int, dtype: WireDtype
) -> int:
    t0 = time.perf_counter()
    _starting(cuts)
    swarm = LocalSwarm(model=model, cuts=cuts, threads=1)
    async with swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        for w in swarm.workers:
            host, port = w.config.listen
            layers, pid = w.config.layers, w.process.pid
            print(f"  {w.config.node_id}: {layers} on udp {host}:{port} (pid {pid})")
        conn = await open_chat(swarm.client_credentials, swarm.route, Path(swarm.route.model))
        text, chat = demo_prompt(conn.tokenizer, prompt)
        print(f"swarm ready in {time.perf_counter() - t0:.1f} s\n", flush=True)
        print(f"Q: {text}\nA: " if chat else text, end="", flush=True)
        try:
            report = await stream_answer(
                conn.client, conn.tokenizer, text, max_tokens, dtype, chat_format=chat
            )
        finally:
            await conn.close()
        print_report(report, len(swarm.workers))
    print("\nall workers stopped cleanly")
    return 0


def run_demo(
    model: str,
    cuts: list[int] | None,
    prompt: str | None,
    max_tokens: int,
    wire_dtype: str,
    stages: int = 3,
) -> int:
    dtype = WireDtype[wire_dtype.upper()]
    return asyncio.run(_demo(model, demo_cuts(model, cuts, stages), prompt, max_tokens, dtype))


async def serve_local_swarm(
    model: str,
    cuts: list[int] | None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    stages: int = 3,
) -> int:
    """`sangama demo --static --api-port P`: a loopback swarm behind the API until SIGINT."""
    cuts = demo_cuts(model, cuts, stages)
    _starting(cuts)
    async with LocalSwarm(model=model, cuts=cuts, threads=1) as swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        tokenizer = Tokenizer.from_gguf(Path(swarm.route.model))
        backend = SwarmBackend(
            swarm.client_credentials,
            swarm.route,
            tokenizer,
            tuning=swarm.tuning,
            # more requests than a stage holds sessions wait their turn, not refused
            max_concurrent=swarm.max_sessions,
        )
        try:
            key_path = default_key_path(None)
            await serve_api(
                backend,
                host,
                port,
                api_key=load_or_create_key(key_path),
                ready=announce(host, len(swarm.workers), key_path),
            )
        finally:
            await backend.aclose()
            tokenizer.close()
    print("all workers stopped cleanly", flush=True)
    return 0
