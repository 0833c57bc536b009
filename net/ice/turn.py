"""TURN relay helpers, pure: coturn REST credentials and an explicit coturn configuration.

The relay is coturn with `use-auth-secret` (docs/architecture.md, "Links"). The coordinator
and the relay share one secret; the coordinator hands each joined node a short-lived
username/password derived from it (coturn's "TURN REST API" scheme), so only swarm members
can allocate, and a leaked credential dies with its expiry. Every quota and bandwidth limit
is written out explicitly because the seeds were bitten by a relay's silent defaults.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from net.errors import NetError

REST_SEPARATOR = ":"
"""coturn's `rest-api-separator` default: username = "<expiry unix time>:<node id>"."""
MAX_USERNAME_BYTES = 512
"""RFC 8489 §14.3: a STUN USERNAME is under 513 bytes."""
MAX_TTL_S = 7 * 24 * 3600
"""A week: long-lived relay passwords defeat the point of deriving them."""

DEFAULT_TURN_PORT = 3478
DEFAULT_MIN_PORT = 49152
DEFAULT_MAX_PORT = 65535
DEFAULT_REALM = "sangama"
DEFAULT_USER_QUOTA = 8
"""Concurrent allocations per username (one node, see `node_credentials`): aioice
allocates once per ICE link, a node has a link or two and a few redials."""
DEFAULT_MAX_BPS = 2_500_000
"""Per allocation, each direction: 20 Mbit/s, above one hop's hidden-state stream."""
DEFAULT_BPS_CAPACITY = 125_000_000
"""All allocations together, each direction: 1 Gbit/s."""
DEFAULT_TOTAL_QUOTA = DEFAULT_BPS_CAPACITY // DEFAULT_MAX_BPS
"""50: as many allocations as the capacity holds at max-bps each (see RelayConfig)."""
MIN_MEMBERS_SHARING = 4
"""The relay's allocations must serve at least this many members at their user quota, so
that no one member can take them all."""
DEFAULT_NODE_TTL_S = 15 * 60
"""The window of `node_credentials`: a username lives 15 to 30 minutes, so a revoked
node's relay access ends within half an hour."""

PRIVATE_PEER_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0-0.255.255.255", "'this network' (RFC 1122)"),
    ("10.0.0.0-10.255.255.255", "private (RFC 1918)"),
    ("100.64.0.0-100.127.255.255", "carrier-grade NAT shared space (RFC 6598)"),
    ("169.254.0.0-169.254.255.255", "link-local (RFC 3927)"),
    ("172.16.0.0-172.31.255.255", "private (RFC 1918)"),
    ("192.168.0.0-192.168.255.255", "private (RFC 1918)"),
    ("::ffff:0.0.0.0-::ffff:255.255.255.255", "IPv4-mapped IPv6, else a bypass of the above"),
    ("fc00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "unique local IPv6 (RFC 4193)"),
    ("fe80::-febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "link-local IPv6 (RFC 4291)"),
)
"""Peers a relay must not reach when `deny_private_peers`: (coturn range, why). The relay
often sits inside an operator's network; without these, any swarm member could use it to
send packets to machines that are unreachable from the internet."""

LOOPBACK_PEER_RANGES: tuple[tuple[str, str], ...] = (
    ("127.0.0.0-127.255.255.255", "loopback"),
    ("::1", "loopback IPv6"),
)
"""coturn already refuses these without `allow-loopback-peers`; denied again explicitly."""


class TurnError(NetError):
    """A TURN credential or relay configuration value is unusable."""


# ---------------------------------------------------------------- credentials


@dataclass(frozen=True)
class TurnCredentials:
    """What a node needs to allocate on the relay; `uris` as in WebRTC's iceServers."""

    username: str
    password: str
    ttl_s: int
    uris: tuple[str, ...]
    realm: str = ""

    @property
    def expires_at(self) -> int:
        """Unix time after which coturn refuses the username."""
        return int(self.username.split(REST_SEPARATOR, 1)[0])

    def to_dict(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "password": self.password,
            "ttl_s": self.ttl_s,
            "uris": list(self.uris),
            "realm": self.realm,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TurnCredentials:
        """Parse a coordinator answer (see `to_dict`); TurnError when a field is unusable."""
        try:
            username, password = str(doc["username"]), str(doc["password"])
            ttl_s, realm = int(doc["ttl_s"]), str(doc.get("realm", ""))
            uris = tuple(str(u) for u in doc["uris"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TurnError(f"malformed TURN credentials: {exc!r}") from None
        _expiry_of(username)  # raises on a username that is not "<expiry>:<node id>"
        for uri in uris:
            _check_uri(uri)
        return cls(username, password, ttl_s, uris, realm)


def rest_password(secret: str, username: str) -> str:
    """coturn's REST password: base64(HMAC-SHA1(key=secret, msg=username))."""
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def make_credentials(
    secret: str,
    node_id: str,
    ttl_s: int,
    now: float,
    uris: Iterable[str],
    realm: str = "",
) -> TurnCredentials:
    """Credentials for `node_id`, valid for `ttl_s` seconds from `now` (unix time)."""
    if not secret:
        raise TurnError("the TURN shared secret is empty")
    _check_token("node id", node_id)
    if REST_SEPARATOR in node_id:
        # coturn splits the username at the separator: a node id holding one is ambiguous.
        raise TurnError(f"node id {node_id!r} must not contain {REST_SEPARATOR!r}")
    if not 1 <= ttl_s <= MAX_TTL_S:
        raise TurnError(f"ttl_s must be within 1..{MAX_TTL_S}, not {ttl_s}")
    if not math.isfinite(now) or now < 0:
        raise TurnError(f"now must be a unix time, not {now!r}")
    username = f"{int(now) + ttl_s}{REST_SEPARATOR}{node_id}"
    if len(username.encode()) > MAX_USERNAME_BYTES:
        raise TurnError(f"node id too long for a STUN username ({len(node_id)} characters)")
    checked = tuple(uris)
    for uri in checked:
        _check_uri(uri)
    return TurnCredentials(username, rest_password(secret, username), ttl_s, checked, realm)


def node_credentials(
    secret: str,
    node_id: str,
    ttl_s: int,
    now: float,
    uris: Iterable[str],
    realm: str = "",
) -> TurnCredentials:
    """Credentials for `node_id` with one username per `ttl_s` window of time.

    coturn counts `user-quota` per username, and a REST username holds its expiry: with
    `make_credentials`, every request made a new user with a quota of its own. Here the
    expiry is the end of the window after the current one, so every request in a window
    gets the same username (the node's quota holds) and it stays valid at least `ttl_s`
    and less than 2 x `ttl_s`; `ttl_s` in the answer is what is left. A node asks again
    once half of that has passed (app/links/paths.py), and a revoked node, refused by the
    coordinator, loses the relay when its last username expires."""
    if not 1 <= ttl_s <= MAX_TTL_S // 2:
        raise TurnError(f"ttl_s must be within 1..{MAX_TTL_S // 2}, not {ttl_s}")
    if not math.isfinite(now) or now < 0:
        raise TurnError(f"now must be a unix time, not {now!r}")
    expiry = (int(now) // ttl_s + 2) * ttl_s
    return make_credentials(secret, node_id, expiry - int(now), now, uris, realm)


def credentials_valid(secret: str, username: str, password: str, now: float) -> bool:
    """What coturn decides: the username is unexpired and the password its HMAC."""
    try:
        expiry = _expiry_of(username)
    except TurnError:
        return False
    if expiry <= now:
        return False
    return hmac.compare_digest(rest_password(secret, username), password)


@dataclass(frozen=True)
class TurnIssuer:
    """The coordinator's side: turns a node id into fresh credentials for its relay(s)."""

    secret: str
    uris: tuple[str, ...]
    ttl_s: int = 3600
    realm: str = ""

    def __post_init__(self) -> None:
        if not self.secret:
            raise TurnError("the TURN shared secret is empty")
        if not self.uris:
            raise TurnError("a TURN issuer needs at least one relay URI")
        for uri in self.uris:
            _check_uri(uri)
        if not 1 <= self.ttl_s <= MAX_TTL_S:
            raise TurnError(f"ttl_s must be within 1..{MAX_TTL_S}, not {self.ttl_s}")

    def issue(self, node_id: str, now: float) -> TurnCredentials:
        return make_credentials(self.secret, node_id, self.ttl_s, now, self.uris, self.realm)


def turn_uri(host: str, port: int, transport: str = "udp") -> str:
    """'turn:203.0.113.7:3478?transport=udp' (RFC 7065); IPv6 hosts get brackets."""
    if transport not in ("udp", "tcp"):
        raise TurnError(f"TURN transport must be udp or tcp, not {transport!r}")
    return f"turn:{_host_port(host, port)}?transport={transport}"


def stun_uri(host: str, port: int) -> str:
    """'stun:203.0.113.7:3478' (RFC 7064)."""
    return f"stun:{_host_port(host, port)}"


def _host_port(host: str, port: int) -> str:
    _check_token("host", host)
    _check_port("port", port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_uri(uri: str) -> None:
    _check_token("relay URI", uri)
    if not uri.startswith(("turn:", "turns:", "stun:", "stuns:")):
        raise TurnError(f"relay URI must start with turn:, turns:, stun: or stuns:, not {uri!r}")


def _expiry_of(username: str) -> int:
    head, sep, node_id = username.partition(REST_SEPARATOR)
    if not sep or not node_id or not head.isascii() or not head.isdigit():
        raise TurnError(f"TURN username must look like '<expiry>:<node id>', not {username!r}")
    return int(head)


# ---------------------------------------------------------------- coturn configuration


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """Everything `render_turnserver_conf` writes; checked here so coturn never guesses."""

    listening_ip: str
    relay_ip: str
    shared_secret: str
    log_file: str
    pid_file: str
    port: int = DEFAULT_TURN_PORT
    min_port: int = DEFAULT_MIN_PORT
    max_port: int = DEFAULT_MAX_PORT
    realm: str = DEFAULT_REALM
    user_quota: int = DEFAULT_USER_QUOTA
    total_quota: int = DEFAULT_TOTAL_QUOTA
    max_bps: int = DEFAULT_MAX_BPS
    bps_capacity: int = DEFAULT_BPS_CAPACITY
    allow_loopback_peers: bool = False
    """Only for tests and demos on one machine: lets allocations reach 127.0.0.0/8."""
    deny_private_peers: bool = True
    """Refuse peers in PRIVATE_PEER_RANGES (turn off for a LAN-only or namespace lab)."""
    allowed_peer_ips: tuple[str, ...] = ()
    """Exceptions to the denied ranges (an address or 'a-b'); coturn lets these win."""
    external_ip: str | None = None
    """The public address when the relay sits behind a 1:1 NAT; advertised to clients."""
    stale_nonce_s: int | None = None
    """Nonce lifetime. None leaves coturn's own default (600 s in 4.6); 0 = never stale.
    A named knob because coturn was seen refusing ChannelBinds with 438 "Wrong nonce". That
    turned out not to be nonce expiry (net/ice/paths.py): a failed send to a private peer made
    coturn drop the allocation, and the next request met a fresh session. Denying private
    peers (below) prevents it; this knob stays for operators who tune nonce lifetimes."""
    tcp_clients: bool = True
    """Accept TURN over TCP from clients whose networks block UDP (relaying stays UDP)."""
    db_file: str | None = None
    """coturn opens an SQLite user DB even with REST auth; keep it out of /var/lib."""

    def __post_init__(self) -> None:
        _check_ip("listening_ip", self.listening_ip)
        _check_ip("relay_ip", self.relay_ip)
        if self.external_ip is not None:
            _check_ip("external_ip", self.external_ip)
        for name in ("port", "min_port", "max_port"):
            _check_port(name, getattr(self, name))
        if self.min_port > self.max_port:
            raise TurnError(f"min_port {self.min_port} is above max_port {self.max_port}")
        if self.min_port <= self.port <= self.max_port:
            raise TurnError(f"port {self.port} lies inside the relay range")
        for name in ("user_quota", "total_quota", "max_bps", "bps_capacity"):
            if getattr(self, name) < 0:
                raise TurnError(f"{name} must be >= 0 (0 = unlimited)")
        problem = quota_problem(self.user_quota, self.total_quota, self.max_bps, self.bps_capacity)
        if problem is not None:
            raise TurnError(problem)
        if self.stale_nonce_s is not None and self.stale_nonce_s < 0:
            raise TurnError("stale_nonce_s must be >= 0 (0 = nonces never go stale)")
        # Every string lands in a `name=value` line: whitespace or a newline would split it
        # (coturn also splits at a space) and smuggle in options of an attacker's choosing.
        _check_token("realm", self.realm)
        _check_token("shared_secret", self.shared_secret)
        for name in ("log_file", "pid_file", "db_file"):
            value = getattr(self, name)
            if value is not None:
                _check_token(name, value)
        for item in self.allowed_peer_ips:
            _check_ip_range("allowed_peer_ips", item)


def quota_problem(user_quota: int, total_quota: int, max_bps: int, bps_capacity: int) -> str | None:
    """Why these limits would not work as written in coturn, or None when they do.

    coturn reserves `max-bps` out of `bps-capacity` for each allocation and refuses one
    (486) when no full reservation is left, so it admits bps_capacity // max_bps
    allocations whatever `total-quota` says: with 100 Mbit/s per allocation out of
    1 Gbit/s, ten in all, and one member with a quota of sixteen took every one. So the
    capacity must hold `total_quota` reservations, and the allocations the relay admits
    must serve MIN_MEMBERS_SHARING members at their `user_quota` (0 = unlimited: only
    where the relay sets no limit at all)."""
    by_bandwidth = bps_capacity // max_bps if bps_capacity and max_bps else 0
    if by_bandwidth and total_quota == 0:
        return (
            f"total_quota 0 (unlimited) but bps_capacity {bps_capacity} holds only "
            f"{by_bandwidth} allocations of max_bps {max_bps}: set total_quota to at most "
            f"{by_bandwidth}"
        )
    if by_bandwidth and by_bandwidth < total_quota:
        return (
            f"bps_capacity {bps_capacity} holds only {by_bandwidth} allocations of max_bps "
            f"{max_bps}, fewer than total_quota {total_quota} (coturn reserves max_bps for "
            f"each): raise bps_capacity to {total_quota * max_bps} or lower max_bps or "
            "total_quota"
        )
    admitted = total_quota  # 0: unlimited
    if admitted and user_quota == 0:
        return "user_quota 0 (unlimited) would let one member take every allocation"
    if admitted and user_quota * MIN_MEMBERS_SHARING > admitted:
        return (
            f"user_quota {user_quota} lets {admitted // user_quota or 1} members take all "
            f"{admitted} allocations; at most {admitted // MIN_MEMBERS_SHARING} keeps them "
            f"for {MIN_MEMBERS_SHARING} or more"
        )
    return None


def render_turnserver_conf(cfg: RelayConfig) -> str:
    """A complete coturn configuration: every limit explicit, nothing left to defaults."""
    out: list[str] = [
        "# Written by `sangama relay`; edits are overwritten at the next start.",
        "# Listening: STUN + TURN on one UDP port (and TCP unless no-tcp).",
        f"listening-ip={cfg.listening_ip}",
        f"listening-port={cfg.port}",
        f"relay-ip={cfg.relay_ip}",
        f"min-port={cfg.min_port}",
        f"max-port={cfg.max_port}",
    ]
    if cfg.external_ip is not None:
        # Public/private pair: coturn advertises the public address in XOR-RELAYED-ADDRESS.
        out.append(f"external-ip={cfg.external_ip}/{cfg.relay_ip}")
    out += [
        "",
        "# Auth: coturn REST scheme, username '<expiry>:<node id>', password",
        "# base64(HMAC-SHA1(secret, username)); the coordinator derives them.",
        "use-auth-secret",
        f"static-auth-secret={cfg.shared_secret}",
        f"realm={cfg.realm}",
        "fingerprint",
    ]
    if cfg.db_file is not None:
        out.append(f"userdb={cfg.db_file}")
    out += ["", "# Nonce lifetime (seconds); absent = coturn's default, 0 = never stale."]
    if cfg.stale_nonce_s is not None:
        out.append(f"stale-nonce={cfg.stale_nonce_s}")
    out += [
        "",
        "# Limits, explicit (coturn's defaults are unlimited; 0 here also means unlimited).",
        f"user-quota={cfg.user_quota}",
        f"total-quota={cfg.total_quota}",
        "# Bytes per second, each direction: per allocation, then for the whole server.",
        f"max-bps={cfg.max_bps}",
        f"bps-capacity={cfg.bps_capacity}",
        "",
        "# QUIC already encrypts end to end: no TLS/DTLS listeners, no certificates.",
        "no-tls",
        "no-dtls",
        "# Nodes relay UDP only; TCP relays and multicast peers are attack surface.",
        "no-tcp-relay",
        "no-multicast-peers",
        "no-cli",
        "# One listening address cannot do NAT-behaviour discovery; ICE does not need it.",
        "no-rfc5780",
        "no-software-attribute",
    ]
    if not cfg.tcp_clients:
        out.append("no-tcp")
    out += ["", "# Peers the relay may send to."]
    if cfg.allow_loopback_peers:
        out.append("allow-loopback-peers")
    else:
        out += _denied(LOOPBACK_PEER_RANGES)
    if cfg.deny_private_peers:
        out += _denied(PRIVATE_PEER_RANGES)
    out += [f"allowed-peer-ip={item}" for item in cfg.allowed_peer_ips]
    out += [
        "",
        "# Files (simple-log: no rollover, so the log keeps the name given).",
        f"log-file={cfg.log_file}",
        "simple-log",
        "no-stdout-log",
        f"pidfile={cfg.pid_file}",
        "",
    ]
    return "\n".join(out)


def _denied(ranges: tuple[tuple[str, str], ...]) -> list[str]:
    # coturn has no trailing comments: each reason goes on its own line above.
    return [line for rng, why in ranges for line in (f"# {why}", f"denied-peer-ip={rng}")]


# ---------------------------------------------------------------- checks


def _check_token(what: str, value: str) -> None:
    if not value:
        raise TurnError(f"{what} is empty")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise TurnError(f"{what} must not contain whitespace or control characters: {value!r}")


def _check_port(what: str, value: int) -> None:
    if not 1 <= value <= 65535:
        raise TurnError(f"{what} must be within 1..65535, not {value}")


def _check_ip(what: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise TurnError(f"{what} must be an IP address, not {value!r}") from None


def _check_ip_range(what: str, value: str) -> None:
    parts = value.split("-")
    if len(parts) > 2:
        raise TurnError(f"{what}: {value!r} is not an address or 'first-last' range")
    for part in parts:
        _check_ip(what, part)
