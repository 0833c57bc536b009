"""Serving the OpenAI-compatible API: uvicorn in the running loop, and the ways to
start it (`sangama api` as a joined client or on a static route, `sangama demo
--api-port`, the desktop app). Joined clients connect as every client does
(app.client.connect)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from app.api.access import ApiAccess, HostRule, default_key_path, load_or_create_key
from app.api.openai_api import DEFAULT_MAX_TOKENS, DEFAULT_PORT, create_openai_app
from app.api.swarm_backend import Backend, SwarmBackend
from app.client.connect import avoiding_source, joined_links
from app.client.route import fetch_route
from app.config import Route
from coordinator.errors import CoordinatorError
from core.admission import LLAMA_MAX_SEQ
from core.tokenizer import Tokenizer
from net.channel import NodeCredentials

if TYPE_CHECKING:
    from app.identity import Identity

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: `serve_api`'s caller decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_api(
    backend: Backend | Sequence[Backend],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    api_key: str,
    stop: asyncio.Event | None = None,
    ready: Callable[[int], None] | None = None,
    log_level: str = "warning",
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> None:
    """Serve the API in the running loop until `stop` is set (default: SIGINT or SIGTERM).

    `ready` gets the bound port once the socket listens (useful with port 0). Localhost
    by default. Every request must carry `api_key` as its bearer token and a Host header
    naming the bound address or loopback (app.api.access: the API speaks with the
    volunteer's swarm identity, so a web page must not reach it).
    """
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
            except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
                break
    sock = _listen_socket(host, port)  # bound here, so "port in use" is a plain OSError
    bound = int(sock.getsockname()[1])
    app = ApiAccess(
        create_openai_app(backend, default_max_tokens=default_max_tokens),
        api_key,
        HostRule(host, bound),
    )
    server = _Server(
        uvicorn.Config(app, host=host, port=bound, log_level=log_level, timeout_graceful_shutdown=5)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and ready is not None:
            ready(bound)
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
        for sig in signals:
            loop.remove_signal_handler(sig)


def _listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


# ----------------------------------------------------------------------------- commands


def announce(host: str, n_stages: int, key_path: Path | None = None) -> Callable[[int], None]:
    def say(port: int) -> None:
        where = f"the API key is in {key_path}" if key_path else "API key as given"
        print(
            f"OpenAI-compatible API on http://{host}:{port}/v1 for a {n_stages}-stage swarm "
            f"({where}); Ctrl+C to stop",
            flush=True,
        )

    return say


async def serve_identity(
    identity: Identity,
    route: Route,
    tokenizer_path: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    max_concurrent: int = LLAMA_MAX_SEQ,
    stop: asyncio.Event | None = None,
    ready: Callable[[int], None] | None = None,
    more_models: Sequence[tuple[Route, Path]] = (),
) -> None:
    """The API as a joined client: links through the coordinator (ICE for peers behind
    NAT), a fresh route from the coordinator after the old one fails. Until `stop` is set
    (default: SIGINT or SIGTERM). Used by `sangama api`, `sangama demo --api-port` and the
    desktop app (submit it to the app's loop with its own `stop` event). The API key is
    the one kept beside the identity (app.api.access.API_KEY_FILE), made on first use.
    `route` is the swarm's default model's; `more_models` the routes and tokenizers of
    the other models it serves, each answered where a request names it."""
    loop = asyncio.get_running_loop()
    key_path = default_key_path(identity.directory)
    api_key = await loop.run_in_executor(None, load_or_create_key, key_path)

    def refresher(model: str) -> Callable[[], Awaitable[Route]]:
        async def refresh() -> Route:
            new_route, _ = await loop.run_in_executor(None, fetch_route, identity, model)
            return new_route

        return refresh

    # The default model is asked for as "default", the others by the name they serve.
    models = [("default", route, tokenizer_path)]
    models += [(r.model, r, path) for r, path in more_models]
    tokenizers: list[Tokenizer] = []
    try:
        for _, _, path in models:
            tokenizers.append(Tokenizer.from_gguf(path))
        links = await joined_links(identity)
        backends = [
            SwarmBackend(
                identity.credentials(),
                r,
                tokenizer,
                dialer=links.dialer,
                refresh_route=refresher(name),
                max_concurrent=max_concurrent,
                route_source=avoiding_source(identity, name),
            )
            for (name, r, _), tokenizer in zip(models, tokenizers, strict=True)
        ]
        try:
            await serve_api(
                backends if more_models else backends[0],
                host,
                port,
                api_key=api_key,
                stop=stop,
                ready=ready or announce(host, len(route.stages), key_path),
            )
        finally:
            for backend in backends:
                await backend.aclose()
            await links.stop()
    finally:
        for tokenizer in tokenizers:
            tokenizer.close()


def other_models(identity: Identity, default: Route) -> list[tuple[Route, Path]]:
    """The routes and tokenizers of the swarm's models beside its default (none from a
    coordinator that hosts one model, or predates listing them). A model with no route
    yet is left out, with a line saying so."""
    try:
        names = identity.client().models().names
    except CoordinatorError as exc:
        log.info("the coordinator lists no models (%s): serving its default", exc)
        return []
    found = []
    for name in names:
        if name == default.model:
            continue
        try:
            found.append(fetch_route(identity, name))
        except CoordinatorError as exc:
            print(f"model {name} left out: {exc}", file=sys.stderr, flush=True)
    return found


async def serve_joined_client(
    identity_dir: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    max_concurrent: int = LLAMA_MAX_SEQ,
) -> int:
    """`sangama api --identity DIR`: fetch the route, then serve until SIGINT or SIGTERM."""
    from app.identity import Identity

    loop = asyncio.get_running_loop()
    me = await loop.run_in_executor(None, Identity.load, identity_dir)
    route, tokenizer_path = await loop.run_in_executor(None, fetch_route, me)
    more = await loop.run_in_executor(None, other_models, me, route)
    await serve_identity(
        me, route, tokenizer_path, host, port, max_concurrent=max_concurrent, more_models=more
    )
    return 0


async def serve_static(
    route: Route,
    creds: NodeCredentials,
    tokenizer_path: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    max_concurrent: int = LLAMA_MAX_SEQ,
) -> int:
    """`sangama api --route R --credentials C`: a static swarm (no coordinator)."""
    key_path = default_key_path(None)
    api_key = load_or_create_key(key_path)
    tokenizer = Tokenizer.from_gguf(tokenizer_path)
    backend = SwarmBackend(creds, route, tokenizer, max_concurrent=max_concurrent)
    try:
        await serve_api(
            backend, host, port, api_key=api_key, ready=announce(host, len(route.stages), key_path)
        )
    finally:
        await backend.aclose()
        tokenizer.close()
    return 0


def run_api_cli(
    *,
    identity: Path | None,
    route_path: Path | None,
    credentials: Path | None,
    node_id: str,
    model: str | None,
    host: str,
    port: int,
    max_concurrent: int = LLAMA_MAX_SEQ,
) -> int:
    """`sangama api`: as a joined client (`identity`) or along a static route file."""
    if identity is not None:
        return asyncio.run(serve_joined_client(identity, host, port, max_concurrent))
    from app.credentials import load_credentials
    from app.errors import ConfigError
    from core.models import resolve_model

    if route_path is None or credentials is None:
        raise ConfigError("give --identity (a joined client) or --route with --credentials")
    route = Route.load(route_path)
    creds = load_credentials(credentials, node_id)
    tokenizer_path = resolve_model(model or route.model)
    return asyncio.run(serve_static(route, creds, tokenizer_path, host, port, max_concurrent))
