"""net.quic.path_mtu: where a link may probe its path MTU, and Don't Fragment on a real socket."""

from __future__ import annotations

import socket
import sys

import pytest

from net.quic.path_mtu import BASE_DATAGRAM_SIZE, may_probe, probe_ceiling, set_dont_fragment


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "::1", "10.1.2.3", "192.168.0.7", "172.16.4.4", "fe80::1%eth0"]
)
def test_loopback_and_lan_peers_may_probe(host: str) -> None:
    assert may_probe(host)


@pytest.mark.parametrize("host", ["8.8.8.8", "2001:4860:4860::8888", "localhost", "", "x"])
def test_public_peers_and_names_do_not(host: str) -> None:
    assert not may_probe(host)


def test_probe_ceiling_is_off_at_the_base_size_and_capped_by_udp() -> None:
    assert probe_ceiling(0) == 0
    assert probe_ceiling(BASE_DATAGRAM_SIZE) == 0
    assert probe_ceiling(1452) == 1452
    assert probe_ceiling(1 << 20) == 65527


@pytest.mark.skipif(sys.platform != "linux", reason="IP_PMTUDISC_PROBE is Linux's")
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_dont_fragment_is_set_on_a_linux_socket(family: socket.AddressFamily) -> None:
    level = socket.IPPROTO_IP if family == socket.AF_INET else socket.IPPROTO_IPV6
    option = 10 if family == socket.AF_INET else 23  # IP_MTU_DISCOVER, IPV6_MTU_DISCOVER
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        assert sock.getsockopt(level, option) != 3
        assert set_dont_fragment(sock)
        assert sock.getsockopt(level, option) == 3  # IP_PMTUDISC_PROBE


def test_other_sockets_are_left_alone() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        assert not set_dont_fragment(sock)
