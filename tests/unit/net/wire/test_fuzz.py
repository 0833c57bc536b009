"""Hostile bytes against the frame decoder and the peer connection: stateful fuzzing.

test_wire.py fuzzes one frame at a time; here whole streams are: valid frames in any split,
then garbage, mutated frames, oversized length prefixes and streams cut inside a frame, in
any order, on one `FrameDecoder` and on an authenticated `PeerConnection`. Every outcome is
a frame or a typed `FrameError` (never another exception), what the decoder holds back
stays under one frame's cap, an oversized prefix is refused as soon as its 4 bytes are in,
a failed stream stays failed, and whatever the connection answers is itself a valid frame.
Bounded (examples and steps) to a few seconds in CI.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from net.errors import ErrorCode, FrameError
from net.protocol import (
    Authenticated,
    ConnectionFailed,
    PeerConnection,
    PeerFrame,
    PeerIdentity,
    SessionRejected,
    Side,
)
from net.wire import HEADER, Frame, FrameDecoder, Hello, Limits, Open, Proof, Step, encode
from net.wire.tensors import decode_rows
from tests.support.fuzzing import fuzz_settings
from tests.unit.net.wire.test_wire import frames

pytestmark = pytest.mark.unit

LIMITS = Limits(max_frame_bytes=2048)
"""Small enough that oversized prefixes are cheap to build, large enough for `frames`."""

STATEFUL = fuzz_settings(steps=25)
"""Bounded by the fuzz-ci profile (examples, a deadline per example): tests/support/fuzzing.py."""

garbage = st.binary(min_size=1, max_size=64)
cuts = st.lists(st.integers(0, 10_000), max_size=6)
edits = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4)
oversized = st.integers(LIMITS.max_frame_bytes - HEADER.size + 1, 2**32 - 1)


def pieces(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in zip([0, *marks], [*marks, len(data)], strict=True)]


def mutated(frame: Frame, changes: list[tuple[int, int]]) -> bytes:
    data = bytearray(encode(frame, LIMITS))
    for where, value in changes:
        data[where % len(data)] = value
    return bytes(data)


def check_decoded(frame: Frame) -> None:
    """A decoded frame is usable as it is: its hidden rows, if any, decode to an array."""
    if isinstance(frame, Step) and frame.hidden is not None:
        rows = decode_rows(frame.hidden, frame.wire_dtype, frame.n_rows, frame.width)
        assert rows.shape == (frame.n_rows, frame.width)


# ---------------------------------------------------------------- the stream decoder


class DecoderStream(RuleBasedStateMachine):
    """One stream, fed by a hostile peer. While nothing but valid frames went in, exactly
    those frames come out; after garbage anything may, but only frames or FrameErrors."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = FrameDecoder(LIMITS)
        self.clean = True
        """Only whole valid frames were fed: the stream sits at a frame boundary."""
        self.failed: ErrorCode | None = None

    def feed(self, data: bytes) -> list[Frame] | FrameError:
        try:
            got = self.decoder.feed(data)
        except FrameError as exc:
            assert isinstance(exc.code, ErrorCode)
            if self.failed is None:
                self.failed = exc.code
            return exc
        # Never anything else: an unexpected exception fails the test right here.
        assert self.failed is None, "a failed stream gave frames"
        for frame in got:
            check_decoded(frame)
        return got

    @rule(batch=st.lists(frames, min_size=1, max_size=4), points=cuts)
    def valid_frames(self, batch: list[Frame], points: list[int]) -> None:
        got: list[Frame] = []
        outcome: list[Frame] | FrameError = []
        for piece in pieces(b"".join(encode(f, LIMITS) for f in batch), points):
            outcome = self.feed(piece)
            if isinstance(outcome, FrameError):
                break
            got += outcome
        if self.failed is None and self.clean:
            assert got == batch
            assert self.decoder.buffered == 0

    @rule(data=garbage)
    def garbage(self, data: bytes) -> None:
        self.clean = False
        self.feed(data)

    @rule(frame=frames, changes=edits, points=cuts)
    def mutated_frame(
        self, frame: Frame, changes: list[tuple[int, int]], points: list[int]
    ) -> None:
        self.clean = False
        for piece in pieces(mutated(frame, changes), points):
            if isinstance(self.feed(piece), FrameError):
                break

    @precondition(lambda self: self.clean and self.failed is None)
    @rule(length=oversized, tail=st.binary(max_size=32), split=st.integers(0, 3))
    def oversized_prefix(self, length: int, tail: bytes, split: int) -> None:
        prefix = struct.pack(">I", length)
        assert self.feed(prefix[:split]) == []
        outcome = self.feed(prefix[split:] + tail)  # refused with its 4th byte, whatever follows
        assert isinstance(outcome, FrameError) and outcome.code is ErrorCode.TOO_LARGE
        assert self.decoder.buffered == 0  # nothing of it kept

    @precondition(lambda self: self.clean and self.failed is None)
    @rule(frame=frames, cut=st.integers(1, 10_000))
    def cut_inside_a_frame(self, frame: Frame, cut: int) -> None:
        data = encode(frame, LIMITS)
        assert self.feed(data[: cut % len(data)] or data[:1]) == []
        with pytest.raises(FrameError) as info:
            self.decoder.end_of_stream()
        assert info.value.code is ErrorCode.MALFORMED
        self.failed = ErrorCode.MALFORMED

    @rule()
    def end_of_stream(self) -> None:
        try:
            self.decoder.end_of_stream()
        except FrameError as exc:
            assert self.failed is not None or self.decoder.buffered == 0
            self.failed = self.failed or exc.code
        else:
            assert self.failed is None and self.decoder.buffered == 0

    @invariant()
    def holds_less_than_one_frame(self) -> None:
        assert self.decoder.buffered < LIMITS.max_frame_bytes
        if self.failed is not None:
            assert self.decoder.buffered == 0
            with pytest.raises(FrameError):  # failed stays failed
                self.decoder.feed(b"")


TestDecoderStream = DecoderStream.TestCase
TestDecoderStream.settings = STATEFUL


# ---------------------------------------------------------------- the peer connection

PEER = PeerIdentity("node-x", "worker")


def check_proof(data: bytes, _nonce: bytes) -> PeerIdentity:
    if not data.startswith(b"ok"):
        raise ValueError("bad signature")
    return PEER


class HostilePeer(RuleBasedStateMachine):
    """An acceptor fed by a peer that may authenticate, then sends anything. It never
    raises, every event is one of its kinds, a failed connection says nothing more, and
    every byte it answers with decodes as valid frames at the peer."""

    def __init__(self) -> None:
        super().__init__()
        self.conn = PeerConnection(
            Side.ACCEPTOR, check_proof=check_proof, new_nonce=lambda: b"n" * 16, limits=LIMITS
        )
        self.answers = FrameDecoder(LIMITS)
        self.opened: set[str] = set()
        self.clean = True
        """Only whole valid frames were sent: the next byte starts a frame."""

    def send(self, data: bytes) -> None:
        was_closed = self.conn.closed
        events = self.conn.receive_data(data)
        if was_closed:
            assert events == []
        for i, event in enumerate(events):
            assert isinstance(event, Authenticated | PeerFrame | SessionRejected | ConnectionFailed)
            if isinstance(event, ConnectionFailed):
                assert isinstance(event.code, ErrorCode) and i == len(events) - 1
                assert self.conn.closed
            if isinstance(event, PeerFrame):
                check_decoded(event.frame)
                if isinstance(event.frame, Open):
                    self.opened.add(event.frame.session)
        # What we answer a hostile peer with is valid at its end (a FrameError here if not).
        self.answers.feed(self.conn.data_to_send())

    @rule()
    def authenticate(self) -> None:
        self.send(encode(Hello(), LIMITS) + encode(Proof(b"ok"), LIMITS))

    @rule(batch=st.lists(frames, min_size=1, max_size=4), points=cuts)
    def valid_frames(self, batch: list[Frame], points: list[int]) -> None:
        for piece in pieces(b"".join(encode(f, LIMITS) for f in batch), points):
            self.send(piece)

    @rule(data=garbage)
    def garbage(self, data: bytes) -> None:
        self.clean = False
        self.send(data)

    @rule(frame=frames, changes=edits)
    def mutated_frame(self, frame: Frame, changes: list[tuple[int, int]]) -> None:
        self.clean = False
        self.send(mutated(frame, changes))

    @rule(length=oversized)
    def oversized_prefix(self, length: int) -> None:
        was_closed = self.conn.closed
        self.send(struct.pack(">I", length))
        if self.clean or was_closed:
            assert self.conn.closed
            assert self.conn.receive_data(b"more") == []

    @invariant()
    def owns_only_what_it_opened(self) -> None:
        assert self.conn.owned_sessions <= self.opened


TestHostilePeer = HostilePeer.TestCase
TestHostilePeer.settings = STATEFUL
