"""When a serving worker heartbeats (app.serving.rules.beats): the usual period, and sooner
while sessions wait for a next stage that may have been replaced, never more often than
the policy's waiting period."""

from __future__ import annotations

import pytest

from app.serving.rules.beats import BeatPolicy, beat_delay

pytestmark = pytest.mark.unit

POLICY = BeatPolicy(every_s=2.0, waiting_s=0.25)


@pytest.mark.parametrize(
    ("since", "waiting", "delay"),
    [
        (0.0, False, 2.0),
        (1.5, False, 0.5),
        (2.5, False, 0.0),
        (0.0, True, 0.25),  # rate-limited even while waiting
        (0.1, True, 0.15),
        (1.5, True, 0.0),  # the link broke long after the last beat: beat now
    ],
)
def test_the_next_beat(since: float, waiting: bool, delay: float) -> None:
    assert beat_delay(POLICY, since, waiting) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("lost_for", "delay"),
    [(None, 1.5), (0.0, 0.0), (9.9, 0.0), (10.0, 1.5), (30.0, 1.5)],
)
def test_a_lost_next_stage_is_asked_about_for_a_while(lost_for: float | None, delay: float) -> None:
    """No session waits (the client gave the answer up to replay it), but the link died
    lately: the worker keeps asking often for `lost_window_s`, then as usual."""
    policy = BeatPolicy(every_s=2.0, waiting_s=0.25, lost_window_s=10.0)
    assert beat_delay(policy, 0.5, False, lost_for) == pytest.approx(delay)
