"""The relay's limits as coturn applies them, and credentials bound to a node."""

from __future__ import annotations

from typing import Any

import pytest

from net.ice.turn import (
    DEFAULT_BPS_CAPACITY,
    DEFAULT_MAX_BPS,
    DEFAULT_NODE_TTL_S,
    DEFAULT_TOTAL_QUOTA,
    DEFAULT_USER_QUOTA,
    MIN_MEMBERS_SHARING,
    RelayConfig,
    TurnError,
    credentials_valid,
    node_credentials,
    quota_problem,
)

pytestmark = pytest.mark.unit

SECRET = "s3cret"
NOW = 1_700_000_123.5


def _config(**limits: Any) -> RelayConfig:
    return RelayConfig(
        listening_ip="127.0.0.1",
        relay_ip="127.0.0.1",
        shared_secret=SECRET,
        log_file="/tmp/turn.log",
        pid_file="/tmp/turn.pid",
        **limits,
    )


def test_the_defaults_admit_every_allocation_they_promise_and_share_them() -> None:
    assert (
        quota_problem(
            DEFAULT_USER_QUOTA, DEFAULT_TOTAL_QUOTA, DEFAULT_MAX_BPS, DEFAULT_BPS_CAPACITY
        )
        is None
    )
    assert DEFAULT_BPS_CAPACITY // DEFAULT_MAX_BPS >= DEFAULT_TOTAL_QUOTA
    assert DEFAULT_USER_QUOTA * MIN_MEMBERS_SHARING <= DEFAULT_TOTAL_QUOTA
    _config()  # accepted


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        # The old defaults: 1 Gbit/s holds ten reservations of 100 Mbit/s, not 512.
        (
            {
                "user_quota": 16,
                "total_quota": 512,
                "max_bps": 12_500_000,
                "bps_capacity": 125_000_000,
            },
            "holds only 10",
        ),
        (
            {"user_quota": 2, "total_quota": 0, "max_bps": 1_000, "bps_capacity": 100_000},
            "unlimited",
        ),
        ({"user_quota": 0, "total_quota": 40, "max_bps": 0, "bps_capacity": 0}, "one member"),
        (
            {"user_quota": 20, "total_quota": 40, "max_bps": 0, "bps_capacity": 0},
            "members take all",
        ),
    ],
)
def test_limits_coturn_would_not_apply_as_written_are_refused(
    limits: dict[str, int], says: str
) -> None:
    problem = quota_problem(**limits)
    assert problem is not None and says in problem
    with pytest.raises(TurnError, match=says):
        _config(**limits)


def test_no_limits_at_all_stay_possible_for_a_lab() -> None:
    assert quota_problem(0, 0, 0, 0) is None


def test_a_node_gets_one_username_per_window() -> None:
    ttl = DEFAULT_NODE_TTL_S
    first = node_credentials(SECRET, "node-a", ttl, NOW, ())
    start = (int(NOW) // ttl) * ttl
    for later in (NOW + 1, start + ttl - 1):
        again = node_credentials(SECRET, "node-a", ttl, later, ())
        assert (again.username, again.password) == (first.username, first.password)
    assert node_credentials(SECRET, "node-b", ttl, NOW, ()).username != first.username
    nxt = node_credentials(SECRET, "node-a", ttl, start + ttl, ())
    assert nxt.username != first.username  # the next window: a new username


def test_node_credentials_live_between_one_and_two_windows() -> None:
    ttl = 600
    for now in (NOW, NOW + 37, NOW + 599.9, 1_700_000_400.0):
        c = node_credentials(SECRET, "node-a", ttl, now, ())
        assert ttl < c.ttl_s + 1 and c.ttl_s <= 2 * ttl
        assert credentials_valid(SECRET, c.username, c.password, now + ttl - 1)
        assert not credentials_valid(SECRET, c.username, c.password, now + 2 * ttl + 1)
    with pytest.raises(TurnError):
        node_credentials(SECRET, "node-a", 0, NOW, ())
    with pytest.raises(TurnError):
        node_credentials(SECRET, "node:a", ttl, NOW, ())
