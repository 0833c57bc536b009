"""net.channel.Channel: frames that arrive right behind the handshake, before the dialler
has set `on_frame`, wait for it (in order) instead of vanishing. Two channels over
in-memory links pumped by hand; the protocol and its handshake are the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from net import wire
from net.channel import EARLY_FRAMES, Channel
from net.protocol import PeerConnection, PeerIdentity, Side

pytestmark = pytest.mark.unit


class MemoryLink:
    """A byte link that keeps what is sent for the test to hand over."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.on_data: Callable[[bytes], None] = lambda _data: None
        self.on_close: Callable[[str], None] = lambda _reason: None
        self.peer_address = ("memory", 0)
        self.outbox = bytearray()

    def send(self, data: bytes) -> None:
        self.outbox += data

    def flush(self) -> None:
        pass

    def close(self, reason: str = "closed", error_code: int = 0) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)

    def take(self) -> bytes:
        data = bytes(self.outbox)
        self.outbox.clear()
        return data


def _pair() -> tuple[Channel, MemoryLink, Channel, MemoryLink]:
    dialler = PeerConnection(
        Side.INITIATOR,
        make_proof=lambda nonce: b"proof:" + nonce,
        expected_peer=PeerIdentity("stage2", "worker"),
    )
    acceptor = PeerConnection(
        Side.ACCEPTOR,
        check_proof=lambda _data, _nonce: PeerIdentity("client", "client"),
        new_nonce=lambda: bytes(range(wire.MIN_NONCE)),
    )
    a_link, b_link = MemoryLink(), MemoryLink()
    return Channel(a_link, dialler), a_link, Channel(b_link, acceptor), b_link


def _tokens(step_id: int) -> wire.Tokens:
    return wire.Tokens("s1", step_id, (7,), (), 0, False, (), looped=True)


def _handshake_with_frames_behind(n: int) -> Channel:
    """The acceptor sends `n` TOKENS in the same bytes as its WELCOME; the dialler reads
    them all at once, before anyone set its `on_frame`."""
    dialler, a_link, acceptor, b_link = _pair()
    dialler.start()
    b_link.on_data(a_link.take())  # HELLO
    a_link.on_data(b_link.take())  # CHALLENGE
    b_link.on_data(a_link.take())  # PROOF -> WELCOME queued
    assert acceptor.authenticated.done()
    for i in range(n):
        acceptor.send(_tokens(i))
    a_link.on_data(b_link.take())  # WELCOME and the TOKENS together
    assert dialler.authenticated.done()
    return dialler


def test_frames_behind_the_welcome_reach_the_handler_set_later_in_order() -> None:
    async def scenario() -> None:
        dialler = _handshake_with_frames_behind(3)
        got: list[wire.Frame] = []
        dialler.on_frame = lambda _ch, frame: got.append(frame)
        assert got == [_tokens(0), _tokens(1), _tokens(2)]
        dialler.on_frame = lambda _ch, frame: got.append(frame)  # nothing is delivered twice
        assert len(got) == 3

    asyncio.run(scenario())


def test_early_frames_are_capped() -> None:
    async def scenario() -> None:
        dialler = _handshake_with_frames_behind(EARLY_FRAMES + 5)
        got: list[wire.Frame] = []
        dialler.on_frame = lambda _ch, frame: got.append(frame)
        assert got == [_tokens(i) for i in range(EARLY_FRAMES)]

    asyncio.run(scenario())
