"""A tiny real HTTP server for tests: serves a directory with Range support, plus faults.

Starlette's FileResponse does the ranges; uvicorn runs it in a background thread on a
loopback port chosen by the OS. Faults are switched per file name (the path under the
served directory) by mutating the server's fields, even while it runs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

START_PATIENCE_S = 10.0
"""How long to wait for uvicorn to start before calling it broken; never a speed claim."""


class _Abort(Exception):
    """Raised mid-body: uvicorn then closes the connection, as a dropped link would."""


class RangeServer:
    """Serve `root` over HTTP on 127.0.0.1; see `serve_dir`.

    Fault switches (keys are file names relative to `root`):
    - `fail_after_bytes[f] = n`: the next response for f sends n body bytes, then the
      connection drops. Used once, then removed.
    - `stall_after_bytes[f] = n`: the next response for f sends n body bytes, then goes
      silent (until the server stops), so the client's read times out. Used once.
    - `corrupt`: every response for f has its body bytes flipped (same length).
    - `corrupt_once`: like `corrupt`, for the next response only.
    - `status_override[f] = code`: every request for f is answered with that status.
    - `status_once[f] = code`: the next request for f is answered with that status.
    - `ignore_range`: requests for f get the whole file with 200, whatever their Range.

    Observations: `requests[f]` (count), `ranges[f]` (the Range header of each request,
    None when absent) and `sent_bytes[f]` (body bytes written out).
    """

    def __init__(self, root: Path, tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate chain, key) files to serve HTTPS with instead of HTTP."""
        self.root = Path(root).resolve()
        self.fail_after_bytes: dict[str, int] = {}
        self.stall_after_bytes: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.corrupt_once: set[str] = set()
        self.status_override: dict[str, int] = {}
        self.status_once: dict[str, int] = {}
        self.ignore_range: set[str] = set()
        self.requests: Counter[str] = Counter()
        self.ranges: dict[str, list[str | None]] = {}
        self.sent_bytes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self,
            ssl_certfile=str(tls[0]) if tls else None,
            ssl_keyfile=str(tls[1]) if tls else None,
            log_config=None,
            log_level=logging.CRITICAL,  # the injected aborts would log tracebacks
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def reset_counters(self) -> None:
        with self._lock:
            self.requests.clear()
            self.ranges.clear()
            self.sent_bytes.clear()

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + START_PATIENCE_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._closing.set()
        self._server.should_exit = True
        self._thread.join(timeout=START_PATIENCE_S)
        self._sock.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        name = str(scope["path"]).lstrip("/")
        headers: dict[str, str] = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
        }
        with self._lock:
            self.requests[name] += 1
            self.ranges.setdefault(name, []).append(headers.get("range"))
            status = self.status_once.pop(name, None) or self.status_override.get(name)
            cut = self.fail_after_bytes.pop(name, None)
            stall = self.stall_after_bytes.pop(name, None)
            flip = name in self.corrupt or _take(self.corrupt_once, name)
            whole = name in self.ignore_range

        path = (self.root / name).resolve()
        response: Response
        if status is not None:
            response = PlainTextResponse(f"injected {status}", status_code=status)
        elif not path.is_relative_to(self.root) or not path.is_file():
            response = PlainTextResponse("not found", status_code=404)
        else:
            response = FileResponse(path)
            if whole:
                scope = {**scope, "headers": [h for h in scope["headers"] if h[0] != b"range"]}
        await response(scope, receive, self._faulty_send(send, name, cut, stall, flip))

    def _faulty_send(
        self, send: Send, name: str, cut: int | None, stall: int | None, flip: bool
    ) -> Send:
        budget = cut if cut is not None else stall

        async def wrapped(message: Message) -> None:
            nonlocal budget
            if message["type"] != "http.response.body":
                await send(message)
                return
            body: bytes = message.get("body", b"")
            if flip:
                body = bytes(b ^ 0xFF for b in body)
            if budget is not None and len(body) >= budget:
                body, budget = body[:budget], 0
                await self._send_body(send, name, {**message, "body": body, "more_body": True})
                if stall is not None:
                    # Silent, not closed: only the client's read timeout can notice.
                    while not self._closing.is_set():
                        await asyncio.sleep(0.05)
                raise _Abort(f"injected fault after {cut if cut is not None else stall} bytes")
            if budget is not None:
                budget -= len(body)
            await self._send_body(send, name, {**message, "body": body})

        return wrapped

    async def _send_body(self, send: Send, name: str, message: MutableMapping[str, Any]) -> None:
        await send(message)
        with self._lock:
            self.sent_bytes[name] += len(message.get("body", b""))


def _take(names: set[str], name: str) -> bool:
    if name in names:
        names.discard(name)
        return True
    return False


@contextmanager
def serve_dir(path: Path, tls: tuple[Path, Path] | None = None) -> Iterator[RangeServer]:
    """Serve the files under `path` on a fresh loopback port for the `with` block."""
    server = RangeServer(path, tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
