"""The coordinator's own check of a client's "this stage is dead" (coordinator/server/
liveness.py), against real loopback sockets: only a refusal counts as proof."""

from __future__ import annotations

import socket

import pytest

from coordinator.server.liveness import confirmed_gone, nothing_listens, split_address


def _bound() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def test_a_closed_port_refuses_and_a_bound_one_does_not() -> None:
    live = _bound()
    dead = _bound()
    dead_port = dead.getsockname()[1]
    dead.close()  # the process that held it was killed: the port is closed
    try:
        assert not nothing_listens(f"127.0.0.1:{live.getsockname()[1]}")
        assert nothing_listens(f"127.0.0.1:{dead_port}")
    finally:
        live.close()


@pytest.mark.parametrize("bad", ["", "nohost", "127.0.0.1:", "127.0.0.1:0", "h:99999", ":5"])
def test_an_address_that_cannot_be_dialled_proves_nothing(bad: str) -> None:
    assert not nothing_listens(bad)


def test_split_address_takes_v4_names_and_bracketed_v6() -> None:
    assert split_address("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert split_address("[::1]:443") == ("::1", 443)
    with pytest.raises(ValueError):
        split_address("127.0.0.1")


def test_only_reported_nodes_whose_address_refuses_are_confirmed() -> None:
    addresses = {"a": "h:1", "b": "h:2", "c": ""}
    refusing = {"h:2"}
    gone = confirmed_gone(["a", "b", "c", "unknown"], addresses.get, refusing.__contains__)
    assert gone == {"b"}
