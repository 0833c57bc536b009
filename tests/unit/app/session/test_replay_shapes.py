"""Which shape each replayed row gets (app.session.replay_shapes): the prompt in the first run's
chunks, each generated token's row one at a time, every position covered once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.session.replay_shapes import Segment, plain_segments, replay_segments

pytestmark = pytest.mark.unit


def test_the_prompt_keeps_its_chunks_and_the_generated_rows_go_one_by_one() -> None:
    assert replay_segments(150, 64, 5) == (
        Segment(0, 64, False),
        Segment(64, 64, False),
        Segment(128, 22, False),  # the last prompt chunk ends at the prompt's end
        Segment(150, 5, True),
    )


def test_generated_rows_are_cut_like_chunks_into_steps() -> None:
    assert replay_segments(8, 4, 9) == (
        Segment(0, 4, False),
        Segment(4, 4, False),
        Segment(8, 4, True),
        Segment(12, 4, True),
        Segment(16, 1, True),
    )


def test_no_generated_tokens_is_a_plain_prompt() -> None:
    assert replay_segments(12, 64, 0) == plain_segments(12, 64) == (Segment(0, 12, False),)


@pytest.mark.parametrize(("prompt_len", "chunk", "generated"), [(0, 4, 1), (3, 0, 1), (3, 4, -1)])
def test_bad_arguments_are_refused(prompt_len: int, chunk: int, generated: int) -> None:
    with pytest.raises(ValueError):
        replay_segments(prompt_len, chunk, generated)


@given(st.integers(1, 600), st.integers(1, 100), st.integers(0, 300))
def test_every_position_once_in_order_prompt_rows_never_one_by_one(
    prompt_len: int, chunk: int, generated: int
) -> None:
    segments = replay_segments(prompt_len, chunk, generated)
    covered = [p for s in segments for p in range(s.start, s.start + s.rows)]
    assert covered == list(range(prompt_len + generated))
    assert all(0 < s.rows <= chunk for s in segments)
    for s in segments:
        # A segment never straddles the prompt's end; the first run's chunk boundaries.
        assert s.one_by_one == (s.start >= prompt_len)
        if not s.one_by_one:
            assert s.start % chunk == 0
            assert s.start + s.rows == min(s.start + chunk, prompt_len)
