"""app.client.connect: what a failed connection leaves behind (nothing), without sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

import app.client.connect as connect
from app.config import Route, RouteStage
from core.tokenizer import Tokenizer
from core.types import LayerRange
from net.channel import NodeCredentials

pytestmark = pytest.mark.unit

CREDS = cast(NodeCredentials, object())  # never read: the fakes stand in for the client
ROUTE = Route("m.gguf", (RouteStage("s0", ("127.0.0.1", 7000), LayerRange(0, 4)),))


class FakeTokenizer:
    closed = False
    n_vocab = 64

    def close(self) -> None:
        self.closed = True


class RefusingClient:
    """A SwarmClient whose first stage cannot be reached."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.closed = False

    async def connect(self) -> None:
        raise ConnectionError("no path")

    async def close(self) -> None:
        self.closed = True


def _recorder() -> tuple[list[str], connect.Closer]:
    calls: list[str] = []

    async def close() -> None:
        calls.append("closed")

    return calls, close


def test_a_tokenizer_that_fails_to_load_still_runs_the_closers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_tokenizer(_path: Path) -> FakeTokenizer:
        raise OSError("unreadable")

    monkeypatch.setattr(Tokenizer, "from_gguf", staticmethod(no_tokenizer))
    calls, close = _recorder()
    with pytest.raises(OSError):
        asyncio.run(connect.open_chat(CREDS, ROUTE, Path("t.gguf"), closers=(close,)))
    assert calls == ["closed"]


def test_a_client_that_cannot_connect_releases_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = FakeTokenizer()
    monkeypatch.setattr(Tokenizer, "from_gguf", staticmethod(lambda _p: tokenizer))
    monkeypatch.setattr(connect, "SwarmClient", RefusingClient)
    calls, close = _recorder()
    with pytest.raises(ConnectionError):
        asyncio.run(connect.open_chat(CREDS, ROUTE, Path("t.gguf"), closers=(close,)))
    assert calls == ["closed"]
    assert tokenizer.closed


def test_a_direct_connector_counts_the_route_s_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client(RefusingClient):
        async def connect(self) -> None:
            pass

    monkeypatch.setattr(Tokenizer, "from_gguf", staticmethod(lambda _p: FakeTokenizer()))
    monkeypatch.setattr(connect, "SwarmClient", Client)
    connector = connect.direct_connector(CREDS, ROUTE, Path("t.gguf"))

    async def open_it() -> connect.ChatConnection:
        return await connector()

    conn = asyncio.run(open_it())
    assert conn.stages == 1
    assert isinstance(conn.client, Client)
