"""What ICE is configured with and what peers exchange: config, offers, the selected pair.

Plain values, checked on construction (an `IceConfigError` otherwise), so a bad offer
from the signalling channel is refused before aioice sees it. net.ice.paths runs the agent.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aioice

from net.errors import NetError

Addr = tuple[str, int]
"""The shape of net.quic.links's; not imported, so that ICE does not load the QUIC library."""

POLICY_ALL = "all"
POLICY_RELAY = "relay"
MAX_CANDIDATES = 64
MAX_CANDIDATE_CHARS = 512
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
PATH_TYPES = ("host", "prflx", "srflx", "relay")
"""From most to least direct: a pair is as indirect as its less direct end."""


class IceError(NetError):
    """ICE could not be used: bad configuration or offer, or no path was found."""


class IceConfigError(IceError, ValueError):
    """An `IceConfig` or `IceOffer` value is unusable."""


class IceFailed(IceError):
    """The connectivity checks found no working pair (all failed, or none in time)."""


class IceTimeout(IceFailed):
    """Gathering or the connectivity checks did not finish within their bound."""


# ---------------------------------------------------------------- values


def _check_server(name: str, addr: Addr | None) -> None:
    if addr is None:
        return
    if (
        not isinstance(addr, tuple)
        or len(addr) != 2
        or not isinstance(addr[0], str)
        or not addr[0]
        or isinstance(addr[1], bool)
        or not isinstance(addr[1], int)
        or not 1 <= addr[1] <= 65535
    ):
        raise IceConfigError(f"{name} must be (host, port 1..65535), not {addr!r}")


def _ip(text: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise IceConfigError(f"{what} must be an IP address, not {text!r}") from None


@dataclass(frozen=True)
class IceConfig:
    """How one node looks for paths; the coordinator hands out the STUN/TURN part."""

    stun_server: Addr | None = None
    turn_server: Addr | None = None
    turn_username: str | None = None
    turn_password: str | None = field(default=None, repr=False)
    relay_only: bool = False
    """Gather only relayed candidates (aioice `TransportPolicy.RELAY`)."""
    timeout_s: float = 8.0
    """Bound on the connectivity checks of one attempt (aioice alone would take 64 s)."""
    extra_host_candidates: tuple[Addr, ...] = ()
    """(public IP, port) this node is known to be reachable at: a forwarded port, or a
    datacenter 1:1 NAT. Each gets a socket bound on that port (0: any port, advertised with
    the port bound, for 1:1 NAT) and is advertised as a host candidate of component 1."""
    components: int = 1
    use_ipv6: bool = True
    exchange_timeout_s: float = 20.0
    """Bound on one offer/answer exchange through the signalling channel."""

    def __post_init__(self) -> None:
        _check_server("stun_server", self.stun_server)
        _check_server("turn_server", self.turn_server)
        for name in ("timeout_s", "exchange_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise IceConfigError(f"{name} must be a number, not {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise IceConfigError(f"{name} must be positive and finite, not {value!r}")
        if (self.turn_username is None) != (self.turn_password is None):
            raise IceConfigError("turn_username and turn_password go together")
        if self.turn_username is not None and self.turn_server is None:
            raise IceConfigError("TURN credentials without a turn_server")
        if self.relay_only and self.turn_server is None:
            raise IceConfigError("relay_only needs a turn_server")
        if isinstance(self.components, bool) or not isinstance(self.components, int):
            raise IceConfigError(f"components must be an int, not {self.components!r}")
        if not 1 <= self.components <= 256:
            raise IceConfigError(f"components must be within 1..256, not {self.components}")
        if not isinstance(self.extra_host_candidates, tuple):
            raise IceConfigError("extra_host_candidates must be a tuple of (ip, port)")
        for entry in self.extra_host_candidates:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
                raise IceConfigError(f"extra host candidate must be (ip, port), not {entry!r}")
            ip = _ip(entry[0], "extra host candidate")
            if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
                raise IceConfigError(f"extra host candidate {entry[0]} is not reachable")
            port = entry[1]
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise IceConfigError(f"extra host candidate port must be 0..65535: {entry!r}")

    @property
    def policy(self) -> str:
        return POLICY_RELAY if self.relay_only else POLICY_ALL

    def with_relay_only(self) -> IceConfig:
        return dataclasses.replace(self, relay_only=True)


def parse_candidate(sdp: str) -> aioice.Candidate:
    """A remote candidate we are willing to check; IceConfigError otherwise."""
    if not isinstance(sdp, str) or not 0 < len(sdp) <= MAX_CANDIDATE_CHARS:
        raise IceConfigError(f"candidate must be a string of 1..{MAX_CANDIDATE_CHARS} chars")
    try:
        candidate = aioice.Candidate.from_sdp(sdp)
    except (ValueError, IndexError) as exc:
        raise IceConfigError(f"unparsable candidate {sdp!r}: {exc}") from None
    if candidate.transport.lower() != "udp":
        raise IceConfigError(f"only UDP candidates are used, not {sdp!r}")
    if candidate.type not in ("host", "srflx", "relay"):
        raise IceConfigError(f"candidate type {candidate.type!r} is never signalled")
    if candidate.component < 1 or not 0 < candidate.port <= 65535:
        raise IceConfigError(f"bad component or port in {sdp!r}")
    # An IP literal only: an mDNS name would make aioice resolve it, outside our bounds.
    _ip(candidate.host, "candidate address")
    return candidate


@dataclass(frozen=True)
class IceOffer:
    """One side's ICE parameters, as carried by the signalling channel (the coordinator)."""

    ufrag: str
    pwd: str
    candidates: tuple[str, ...]
    """Candidates as SDP attribute values (aioice `Candidate.to_sdp`)."""
    ice_lite: bool = False

    def __post_init__(self) -> None:
        # RFC 8839 §5.4: ice-ufrag is 4..256 ice-chars, ice-pwd 22..256.
        for name, value, low in (("ufrag", self.ufrag, 4), ("pwd", self.pwd, 22)):
            if not (isinstance(value, str) and low <= len(value) <= 256):
                raise IceConfigError(f"{name} must be {low}..256 ICE characters")
            if not _ICE_CHARS.fullmatch(value):
                raise IceConfigError(f"{name} has characters outside [A-Za-z0-9+/]")
        if not isinstance(self.candidates, tuple):
            raise IceConfigError("candidates must be a tuple of strings")
        if len(self.candidates) > MAX_CANDIDATES:
            raise IceConfigError(f"more than {MAX_CANDIDATES} candidates")
        for sdp in self.candidates:
            parse_candidate(sdp)
        if not isinstance(self.ice_lite, bool):
            raise IceConfigError("ice_lite must be a boolean")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ufrag": self.ufrag,
            "pwd": self.pwd,
            "candidates": list(self.candidates),
            "ice_lite": self.ice_lite,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> IceOffer:
        """Parse what `to_dict` wrote (after JSON); IceConfigError on anything else."""
        if not isinstance(doc, Mapping):
            raise IceConfigError(f"an offer is a mapping, not {type(doc).__name__}")
        unknown = set(doc) - {"ufrag", "pwd", "candidates", "ice_lite"}
        if unknown:
            raise IceConfigError(f"unknown offer fields {sorted(map(str, unknown))}")
        try:
            ufrag, pwd, candidates = doc["ufrag"], doc["pwd"], doc["candidates"]
        except KeyError as exc:
            raise IceConfigError(f"offer misses {exc.args[0]!r}") from None
        if not isinstance(candidates, list | tuple):
            raise IceConfigError("candidates must be a list of strings")
        return cls(ufrag, pwd, tuple(candidates), doc.get("ice_lite", False))


@dataclass(frozen=True)
class SelectedPair:
    """The candidate pair ICE selected, as this side sees it."""

    local_type: str
    local_address: Addr
    remote_type: str
    remote_address: Addr

    @property
    def path_type(self) -> str:
        """One of "host", "prflx", "srflx", "relay": the less direct of the two ends."""
        rank = {t: i for i, t in enumerate(PATH_TYPES)}
        return max(self.local_type, self.remote_type, key=lambda t: rank.get(t, len(rank)))
