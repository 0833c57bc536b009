"""Home routers in network namespaces: a "public" bridge and N homes behind NAT.

    pub  (bridge 198.51.100.0/24, .1 = coordinator and relay)
     |-- r<i> (home router: WAN 198.51.100.1<i>, LAN 192.168.<i>.1, NAT + stateful firewall)
     |     `-- h<i> (a volunteer's PC, 192.168.<i>.2, default route via its router)

Cone NAT is iptables MASQUERADE (a mapping per inside address:port, so hole punching
works); symmetric NAT adds --random-fully (a new mapping per destination: punching fails
and the relay must carry the link). Needs root, iproute2, iptables and conntrack.
Addresses are documentation ranges, used only inside these namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

PUBLIC_IP = "198.51.100.1"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def missing_requirements() -> str | None:
    """Why the system tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@dataclass(frozen=True)
class Home:
    index: int
    router: str
    host: str
    lan_ip: str
    wan_ip: str
    nat: str


@dataclass(frozen=True)
class Topology:
    public: str
    homes: tuple[Home, ...]

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]


@contextmanager
def home_routers(nats: Sequence[str]) -> Iterator[Topology]:
    """Build a public namespace and one home per entry of `nats` ("cone" or "symmetric")."""
    tag = uuid.uuid4().hex[:4]
    pub = f"sgm{tag}pub"
    created: list[str] = []
    try:
        _run("ip", "netns", "add", pub)
        created.append(pub)
        _run("ip", "-n", pub, "link", "set", "lo", "up")
        _run("ip", "-n", pub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", pub, "addr", "add", f"{PUBLIC_IP}/24", "dev", "br0")
        _run("ip", "-n", pub, "link", "set", "br0", "up")
        homes = []
        for i, nat in enumerate(nats, start=1):
            if nat not in ("cone", "symmetric"):
                raise ValueError(f"NAT kind must be cone or symmetric, not {nat!r}")
            router, host = f"sgm{tag}r{i}", f"sgm{tag}h{i}"
            for ns in (router, host):
                _run("ip", "netns", "add", ns)
                created.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            wan_ip, lan_ip = f"198.51.100.{10 + i}", f"192.168.{i}.2"
            veth = f"sgm{tag}w{i}"
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "wan0", "netns", router)
            _run("ip", "link", "set", veth, "netns", pub)
            _run("ip", "-n", pub, "link", "set", veth, "master", "br0", "up")
            _run("ip", "-n", router, "addr", "add", f"{wan_ip}/24", "dev", "wan0")
            _run("ip", "-n", router, "link", "set", "wan0", "up")
            _run(
                "ip",
                "link",
                "add",
                "lan0",
                "netns",
                router,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host,
            )
            _run("ip", "-n", router, "addr", "add", f"192.168.{i}.1/24", "dev", "lan0")
            _run("ip", "-n", router, "link", "set", "lan0", "up")
            _run("ip", "-n", host, "addr", "add", f"{lan_ip}/24", "dev", "eth0")
            _run("ip", "-n", host, "link", "set", "eth0", "up")
            _run("ip", "-n", host, "route", "add", "default", "via", f"192.168.{i}.1")
            ex = ["ip", "netns", "exec", router]
            _run(*ex, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            masq = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"]
            _run(*ex, *masq, *(["--random-fully"] if nat == "symmetric" else []))
            # A home router's stateful firewall: from the WAN, only replies come in.
            _run(
                *ex,
                "iptables",
                "-A",
                "FORWARD",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
            )
            _run(*ex, "iptables", "-A", "FORWARD", "-i", "wan0", "-j", "DROP")
            # Unsolicited packets to the router itself are dropped (as OpenWrt's WAN zone
            # does); otherwise an early punch leaves a conntrack entry that breaks mapping.
            _run(
                *ex,
                "iptables",
                "-A",
                "INPUT",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "NEW,INVALID",
                "-j",
                "DROP",
            )
            homes.append(Home(i, router, host, lan_ip, wan_ip, nat))
        yield Topology(pub, tuple(homes))
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
