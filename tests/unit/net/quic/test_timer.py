"""net.quic.timer: an armed loop timer stays unless it would fire for nothing, soon."""

from __future__ import annotations

import pytest

from net.quic.timer import EARLY_SLACK, FAR, keep_armed

pytestmark = pytest.mark.unit


def test_no_deadline_or_an_earlier_one_rearms() -> None:
    assert not keep_armed(0.0, 0.020, None, False)
    assert not keep_armed(0.0, 0.020, 0.010, False)  # it would fire 10 ms late


def test_a_timer_early_by_little_stays() -> None:
    assert keep_armed(0.0, 0.020, 0.020, False)
    assert keep_armed(0.0, 0.020, 0.020 + EARLY_SLACK * 0.9, False)  # the idle deadline crept


def test_a_loss_timer_left_behind_by_an_ack_is_rearmed() -> None:
    # Armed at the frame's send for its loss timer (26 ms); the ACK moved the deadline to
    # the idle timeout a minute away: keeping it would wake the link for nothing.
    assert not keep_armed(0.001, 0.026, 60.0, False)


def test_a_far_timer_stays_even_if_early() -> None:
    assert keep_armed(0.0, FAR, FAR + 30.0, False)
    assert not keep_armed(0.0, FAR - 0.1, FAR + 30.0, False)


def test_a_held_acks_timer_that_fires_early_is_rearmed() -> None:
    assert keep_armed(0.0, 0.010, 0.0105, True)  # within a millisecond: it may stay
    assert not keep_armed(0.0, 0.010, 0.013, True)
