"""net.resend_log: what a worker resends after replacing a dead path to its next stage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from net import wire
from net.resend_log import ResendLog
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

PROMPT_LEN = 10


def open_frame(session: str = "s1", prompt_len: int = PROMPT_LEN) -> wire.Open:
    return wire.Open(session, "m", WireDtype.F32, wire.SamplingSpec(), "client", 32, prompt_len)


def step(session: str, step_id: int, start: int, n_rows: int = 1) -> wire.Step:
    hidden = bytes(4 * n_rows * 2)
    return wire.Step(
        session, step_id, start, tuple(range(n_rows)), hidden, n_rows, 2, WireDtype.F32
    )


def test_prompt_chunks_are_kept_until_the_first_decode_step() -> None:
    log = ResendLog()
    log.record(open_frame())
    chunks = [step("s1", 0, 0, 4), step("s1", 1, 4, 4), step("s1", 2, 8, 2)]
    for chunk in chunks:
        log.record(chunk)
    assert log.to_resend() == [open_frame(), *chunks]
    assert log.pending_bytes() == 4 * 2 * (4 + 4 + 2)


def test_a_decode_step_proves_everything_before_it_passed() -> None:
    log = ResendLog()
    log.record(open_frame())
    for i, start in enumerate((0, 4, 8)):
        log.record(step("s1", i, start, 4 if start < 8 else 2))
    decode = step("s1", 3, PROMPT_LEN)
    log.record(decode)
    assert log.to_resend() == [open_frame(), decode]
    nxt = step("s1", 4, PROMPT_LEN + 1)
    log.record(nxt)
    assert log.to_resend() == [open_frame(), nxt]


def test_close_and_forget_drop_the_session() -> None:
    log = ResendLog()
    log.record(open_frame("a"))
    log.record(open_frame("b"))
    log.record(step("a", 0, 0, 3))
    log.record(wire.Close("a", "done"))
    assert "a" not in log and "b" in log
    log.forget("b")
    assert log.to_resend() == [] and len(log) == 0


def test_steps_without_an_open_are_not_resent() -> None:
    log = ResendLog()
    log.record(step("ghost", 0, 0, 2))
    log.record(wire.Ping(7))
    assert log.to_resend() == []


def test_sessions_keep_their_own_order() -> None:
    log = ResendLog()
    log.record(open_frame("a"))
    log.record(open_frame("b"))
    log.record(step("b", 0, 0, 4))
    log.record(step("a", 0, 0, 4))
    log.record(step("b", 1, 4, 4))
    frames = log.to_resend()
    by_session = [(type(f).__name__, f.session) for f in frames if hasattr(f, "session")]
    assert by_session == [("Open", "a"), ("Step", "a"), ("Open", "b"), ("Step", "b"), ("Step", "b")]


@given(st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=12))
def test_the_resend_always_covers_what_is_not_yet_through(chunk_rows: list[int]) -> None:
    """Whatever the chunking, the resend holds every step from the last decode step on,
    in order, and nothing older."""
    prompt_len = sum(chunk_rows)
    log = ResendLog()
    log.record(open_frame(prompt_len=prompt_len))
    sent: list[wire.Step] = []
    start = 0
    for i, rows in enumerate(chunk_rows):
        sent.append(step("s1", i, start, rows))
        start += rows
    for i in range(3):  # then a few decode steps
        sent.append(step("s1", len(chunk_rows) + i, prompt_len + i))
    for n, frame in enumerate(sent):
        log.record(frame)
        decode_idx = [j for j, f in enumerate(sent[: n + 1]) if f.start >= prompt_len]
        first = decode_idx[-1] if decode_idx else 0
        assert log.to_resend() == [open_frame(prompt_len=prompt_len), *sent[first : n + 1]]
