"""Free local ports, for processes that must know their address before they listen."""

from __future__ import annotations

import socket


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port free on `host` now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


LOOPBACK = "127.0.0.1"
_ANY_PUBLIC = "192.0.2.1"  # TEST-NET-1: a route lookup toward it finds the default route


def outward_host(toward: str = _ANY_PUBLIC) -> str:
    """This machine's IPv4 address on its route to `toward` (an address or host name; no
    packet is sent): where a node listens so that the coordinator and its peers can reach
    it. Loopback for a coordinator on loopback, and where no route is found."""
    try:
        infos = socket.getaddrinfo(toward, 9, socket.AF_INET, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return LOOPBACK
    for *_, sockaddr in infos[:4]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(sockaddr)
            except OSError:
                continue
            return str(sock.getsockname()[0])
    return LOOPBACK
