"""Where a node listens when nobody says: its address on the route to the coordinator."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from app.ports import LOOPBACK, outward_host
from app.serving.assigned_stage import CoordinatedOptions, listen_address

pytestmark = pytest.mark.unit


def test_a_coordinator_on_loopback_is_reached_from_loopback() -> None:
    assert outward_host("127.0.0.1") == LOOPBACK
    assert outward_host("localhost") == LOOPBACK


def test_a_name_that_does_not_resolve_falls_back_to_loopback() -> None:
    assert outward_host("no-such-host.invalid") == LOOPBACK


def test_a_public_coordinator_is_reached_from_an_address_of_this_machine() -> None:
    found = ipaddress.ip_address(outward_host("192.0.2.1"))
    # the default route's source address, or loopback on a machine without a route
    assert found.version == 4 and not found.is_unspecified


def test_the_listen_address_is_fixed_once_from_the_coordinator_or_the_options(
    tmp_path: Path,
) -> None:
    auto = CoordinatedOptions(identity_dir=tmp_path)
    host, port = asyncio.run(listen_address(auto, "https://127.0.0.1:8443"))
    assert host == LOOPBACK and 0 < port < 65536
    given = CoordinatedOptions(identity_dir=tmp_path, listen=("127.0.0.1", 7001))
    assert asyncio.run(listen_address(given, "https://203.0.113.9:8443")) == ("127.0.0.1", 7001)
