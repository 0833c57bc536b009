"""Whether a node's advertised address answers the coordinator's probe: placement takes
a node whose public address answered (or one behind a home router, which ICE reaches).
Each address is probed once while it answers, and again after PROBE_RETRY_S while it
does not; the answers are kept per node, in memory.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from coordinator.server.node_claims import is_lan_address, split_address
from net import reach_probe

log = logging.getLogger(__name__)

PROBE_RETRY_S = 5.0
"""An address that did not answer the reachability probe is probed again after this."""


def probe_address(address: str, timeout_s: float) -> bool:
    """Whether something answers net/reach_probe.py's probe at `address` in time."""
    host, port = split_address(address)
    return reach_probe.probe(host, port, timeout_s)


def is_loopback_url(url: str) -> bool:
    """Whether `url` names this machine (nodes may then advertise loopback addresses)."""
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Reachability:
    """Node id -> the address that answered its probe, and the probes that failed."""

    def __init__(self, probe: Callable[[str], bool]) -> None:
        self._probe = probe
        self._lock = threading.Lock()
        self._verified: dict[str, str] = {}
        """Node id -> the address that answered our probe (placement needs one)."""
        self._failed: dict[str, tuple[str, float]] = {}
        """Node id -> (address, when) of its last unanswered probe."""

    def check(self, node_id: str, address: str) -> None:
        """Probe a node's address unless it answered before, or failed just now."""
        with self._lock:
            if self._verified.get(node_id) == address:
                return
            failed = self._failed.get(node_id)
            recent = failed is not None and time.monotonic() - failed[1] < PROBE_RETRY_S
            if recent and failed is not None and failed[0] == address:
                return
        ok = self._probe(address)  # outside the lock: it waits for an answer
        with self._lock:
            if ok:
                self._verified[node_id] = address
                self._failed.pop(node_id, None)
            else:
                self._verified.pop(node_id, None)
                self._failed[node_id] = (address, time.monotonic())
                # Expected of a node behind a home router (ICE reaches it); a public
                # address that does not answer keeps its node out of placement.
                level = logging.INFO if is_lan_address(address) else logging.WARNING
                log.log(level, "%s: %s did not answer the reachability probe", node_id, address)

    def verified(self) -> dict[str, str]:
        """Node id -> the address that answered, now."""
        with self._lock:
            return dict(self._verified)

    def trust(self, addresses: Mapping[str, str]) -> None:
        """Count these addresses as answered: a restarted coordinator's kept plan was
        probed by the run that placed it."""
        with self._lock:
            self._verified.update(addresses)

    def forget(self, node_id: str) -> None:
        with self._lock:
            self._verified.pop(node_id, None)

    def prune(self, now: float) -> None:
        """Drop failed probes old enough to be tried again anyway."""
        with self._lock:
            for key, (_a, at) in list(self._failed.items()):
                if now - at > PROBE_RETRY_S:
                    del self._failed[key]
