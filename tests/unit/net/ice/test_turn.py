"""net.ice.turn: coturn REST credentials (format, expiry, a known answer), the rendered config."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from net.ice.turn import (
    LOOPBACK_PEER_RANGES,
    MAX_TTL_S,
    PRIVATE_PEER_RANGES,
    RelayConfig,
    TurnCredentials,
    TurnError,
    TurnIssuer,
    credentials_valid,
    make_credentials,
    render_turnserver_conf,
    stun_uri,
    turn_uri,
)

pytestmark = pytest.mark.unit

SECRET = "correct horse battery staple"
NOW = 1_699_996_400.75
URIS = ("turn:203.0.113.7:3478?transport=udp", "stun:203.0.113.7:3478")


# ---------------------------------------------------------------- credentials


def test_username_is_expiry_colon_node_id() -> None:
    c = make_credentials(SECRET, "node-a", 3600, NOW, URIS, realm="swarm")
    assert c.username == "1700000000:node-a"  # int(NOW) + ttl: fractions are dropped
    assert c.expires_at == 1_700_000_000
    assert (c.ttl_s, c.uris, c.realm) == (3600, URIS, "swarm")


def test_password_known_answer() -> None:
    c = make_credentials(SECRET, "node-a", 3600, NOW, URIS)
    # Computed outside Python:
    #   printf '%s' '1700000000:node-a' | openssl dgst -sha1 -hmac "$SECRET" -binary | base64
    assert c.password == "E/m04ADctB59ZIi+u3/kDAKle/Q="
    # ...and from the definition, with the standard library alone.
    mac = hmac.new(SECRET.encode(), b"1700000000:node-a", hashlib.sha1).digest()
    assert base64.b64decode(c.password) == mac


def test_credentials_valid_until_expiry() -> None:
    c = make_credentials(SECRET, "node-a", 60, NOW, URIS)
    assert credentials_valid(SECRET, c.username, c.password, NOW)
    assert credentials_valid(SECRET, c.username, c.password, c.expires_at - 0.5)
    assert not credentials_valid(SECRET, c.username, c.password, c.expires_at)
    assert not credentials_valid(SECRET, c.username, c.password, c.expires_at + 3600)


def test_expired_credentials_are_refused_even_with_a_true_hmac() -> None:
    c = make_credentials(SECRET, "node-a", 1, NOW - 3600, URIS)
    assert c.expires_at < NOW
    assert not credentials_valid(SECRET, c.username, c.password, NOW)


def test_wrong_password_secret_or_tampered_username_is_refused() -> None:
    c = make_credentials(SECRET, "node-a", 3600, NOW, URIS)
    assert not credentials_valid(SECRET, c.username, "AAAA" + c.password[4:], NOW)
    assert not credentials_valid("another secret", c.username, c.password, NOW)
    later = f"{c.expires_at + 86400}:node-a"  # stretching the expiry breaks the HMAC
    assert not credentials_valid(SECRET, later, c.password, NOW)
    assert not credentials_valid(SECRET, c.username.replace("node-a", "node-b"), c.password, NOW)


@pytest.mark.parametrize(
    "username", ["", "node-a", ":node-a", "1700000000:", "17e8:node-a", "-1:node-a", "١٢:x"]
)
def test_malformed_usernames_are_refused(username: str) -> None:
    password = base64.b64encode(
        hmac.new(SECRET.encode(), username.encode(), hashlib.sha1).digest()
    ).decode()
    assert not credentials_valid(SECRET, username, password, 0.0)


@pytest.mark.parametrize(
    ("secret", "node_id", "ttl_s", "uris"),
    [
        ("", "node-a", 60, URIS),
        (SECRET, "", 60, URIS),
        (SECRET, "node:a", 60, URIS),  # the separator would make the username ambiguous
        (SECRET, "node a", 60, URIS),
        (SECRET, "node\na", 60, URIS),
        (SECRET, "x" * 600, 60, URIS),
        (SECRET, "node-a", 0, URIS),
        (SECRET, "node-a", MAX_TTL_S + 1, URIS),
        (SECRET, "node-a", 60, ("http://relay",)),
    ],
)
def test_make_credentials_refuses_bad_input(
    secret: str, node_id: str, ttl_s: int, uris: tuple[str, ...]
) -> None:
    with pytest.raises(TurnError):
        make_credentials(secret, node_id, ttl_s, NOW, uris)


@given(
    node_id=st.from_regex(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?", fullmatch=True),
    ttl_s=st.integers(1, MAX_TTL_S),
    now=st.floats(0, 4e9),
)
def test_fresh_credentials_always_check_out(node_id: str, ttl_s: int, now: float) -> None:
    c = make_credentials(SECRET, node_id, ttl_s, now, URIS)
    assert c.username.split(":", 1) == [str(int(now) + ttl_s), node_id]
    assert credentials_valid(SECRET, c.username, c.password, now)
    assert not credentials_valid(SECRET, c.username, c.password, int(now) + ttl_s)


def test_credentials_round_trip_through_json_shape() -> None:
    c = make_credentials(SECRET, "node-a", 3600, NOW, URIS, realm="swarm")
    doc = c.to_dict()
    assert doc["expires_at"] == c.expires_at and doc["uris"] == list(URIS)
    assert TurnCredentials.from_dict(doc) == c


@pytest.mark.parametrize(
    "change",
    [{"username": "nonsense"}, {"uris": ["ftp://x"]}, {"ttl_s": "soon"}, {"password": None}],
)
def test_malformed_credentials_documents_are_refused(change: dict[str, Any]) -> None:
    doc = make_credentials(SECRET, "node-a", 3600, NOW, URIS).to_dict()
    doc.update(change)
    doc = {k: v for k, v in doc.items() if v is not None}  # None stands for "missing"
    with pytest.raises(TurnError):
        TurnCredentials.from_dict(doc)


def test_issuer_derives_credentials_the_relay_accepts() -> None:
    issuer = TurnIssuer(SECRET, URIS, ttl_s=600, realm="swarm")
    c = issuer.issue("node-b", NOW)
    assert c.username == f"{int(NOW) + 600}:node-b" and c.realm == "swarm"
    assert credentials_valid(SECRET, c.username, c.password, NOW)
    with pytest.raises(TurnError):
        TurnIssuer(SECRET, ())
    with pytest.raises(TurnError):
        TurnIssuer("", URIS)


def test_uris() -> None:
    assert turn_uri("203.0.113.7", 3478) == "turn:203.0.113.7:3478?transport=udp"
    assert turn_uri("2001:db8::1", 3478, "tcp") == "turn:[2001:db8::1]:3478?transport=tcp"
    assert stun_uri("relay.example.org", 3478) == "stun:relay.example.org:3478"
    with pytest.raises(TurnError):
        turn_uri("203.0.113.7", 3478, "tls")
    with pytest.raises(TurnError):
        stun_uri("203.0.113.7", 0)


# ---------------------------------------------------------------- configuration


def _config(**changes: Any) -> RelayConfig:
    base = RelayConfig(
        listening_ip="0.0.0.0",
        relay_ip="198.51.100.4",
        port=3478,
        min_port=49152,
        max_port=65535,
        realm="swarm.example",
        shared_secret="s3cret-value",
        user_quota=7,
        total_quota=123,
        max_bps=4_000_000,
        bps_capacity=492_000_000,  # 123 reservations of max_bps: coturn admits them all
        allow_loopback_peers=False,
        deny_private_peers=True,
        log_file="/var/lib/sangama/relay/turn.log",
        pid_file="/var/lib/sangama/relay/turnserver.pid",
    )
    return replace(base, **changes)


def _options(text: str) -> list[tuple[str, str | None]]:
    """(name, value) per option line, in order; checks every line is well formed."""
    found: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        assert not any(c.isspace() for c in line), f"whitespace in option line {line!r}"
        name, sep, value = line.partition("=")
        found.append((name, value if sep else None))
    return found


def test_config_states_every_limit_and_the_auth_scheme() -> None:
    options = _options(render_turnserver_conf(_config()))
    for expected in [
        ("listening-ip", "0.0.0.0"),
        ("listening-port", "3478"),
        ("relay-ip", "198.51.100.4"),
        ("min-port", "49152"),
        ("max-port", "65535"),
        ("use-auth-secret", None),
        ("static-auth-secret", "s3cret-value"),
        ("realm", "swarm.example"),
        ("fingerprint", None),
        ("user-quota", "7"),
        ("total-quota", "123"),
        ("max-bps", "4000000"),
        ("bps-capacity", "492000000"),
        ("no-tls", None),
        ("no-dtls", None),
        ("no-tcp-relay", None),
        ("no-cli", None),
        ("no-multicast-peers", None),
        ("log-file", "/var/lib/sangama/relay/turn.log"),
        ("pidfile", "/var/lib/sangama/relay/turnserver.pid"),
    ]:
        assert expected in options, expected
    names = [n for n, _ in options]
    repeated = {n for n, k in Counter(names).items() if k > 1}
    assert repeated <= {"denied-peer-ip"}, repeated
    for absent in ("allow-loopback-peers", "stale-nonce", "external-ip", "no-tcp", "lt-cred-mech"):
        assert absent not in names


def test_zero_limits_are_still_written() -> None:
    cfg = _config(max_bps=0, bps_capacity=0, user_quota=0, total_quota=0)
    options = _options(render_turnserver_conf(cfg))
    assert {("max-bps", "0"), ("bps-capacity", "0"), ("user-quota", "0")} <= set(options)


def test_private_ranges_are_denied_and_loopback_too_unless_testing() -> None:
    denied = [v for n, v in _options(render_turnserver_conf(_config())) if n == "denied-peer-ip"]
    for rng in (
        "10.0.0.0-10.255.255.255",
        "172.16.0.0-172.31.255.255",
        "192.168.0.0-192.168.255.255",
        "169.254.0.0-169.254.255.255",
        "100.64.0.0-100.127.255.255",
        "fc00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "fe80::-febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "127.0.0.0-127.255.255.255",
        "::1",
    ):
        assert rng in denied, rng
    assert len(denied) == len(PRIVATE_PEER_RANGES) + len(LOOPBACK_PEER_RANGES)


def test_loopback_testing_allows_loopback_and_keeps_private_ranges_denied() -> None:
    options = _options(render_turnserver_conf(_config(allow_loopback_peers=True)))
    denied = [v for n, v in options if n == "denied-peer-ip"]
    assert ("allow-loopback-peers", None) in options
    assert "127.0.0.0-127.255.255.255" not in denied
    assert "10.0.0.0-10.255.255.255" in denied


def test_private_peers_can_be_allowed_for_a_lab_with_exceptions() -> None:
    options = _options(render_turnserver_conf(_config(deny_private_peers=False)))
    denied = [v for n, v in options if n == "denied-peer-ip"]
    assert denied == [rng for rng, _ in LOOPBACK_PEER_RANGES]
    options = _options(render_turnserver_conf(_config(allowed_peer_ips=("10.9.0.2-10.9.0.9",))))
    assert ("allowed-peer-ip", "10.9.0.2-10.9.0.9") in options


def test_stale_nonce_is_coturns_default_unless_set() -> None:
    text = render_turnserver_conf(_config())
    assert not any(n == "stale-nonce" for n, _ in _options(text))
    assert "stale" in text.lower()  # the knob is explained even when left at the default
    assert ("stale-nonce", "0") in _options(render_turnserver_conf(_config(stale_nonce_s=0)))
    assert ("stale-nonce", "30") in _options(render_turnserver_conf(_config(stale_nonce_s=30)))


def test_optional_lines() -> None:
    options = _options(
        render_turnserver_conf(
            _config(external_ip="203.0.113.7", tcp_clients=False, db_file="/tmp/r/turndb")
        )
    )
    assert ("external-ip", "203.0.113.7/198.51.100.4") in options
    assert ("no-tcp", None) in options
    assert ("userdb", "/tmp/r/turndb") in options


@pytest.mark.parametrize(
    "change",
    [
        {"realm": "swarm\nallow-loopback-peers"},  # a newline would inject an option
        {"realm": ""},
        {"shared_secret": "two words"},
        {"shared_secret": ""},
        {"log_file": "/tmp/a b.log"},  # coturn splits option lines at spaces too
        {"pid_file": "/tmp/x\r"},
        {"listening_ip": "relay.example.org"},
        {"relay_ip": "300.1.2.3"},
        {"external_ip": "nowhere"},
        {"port": 0},
        {"port": 70000},
        {"min_port": 60000, "max_port": 50000},
        {"port": 50000, "min_port": 49152, "max_port": 65535},
        {"user_quota": -1},
        {"total_quota": -1},
        {"max_bps": -1},
        {"bps_capacity": -5},
        {"stale_nonce_s": -1},
        {"allowed_peer_ips": ("10.0.0.1-10.0.0.2-10.0.0.3",)},
        {"allowed_peer_ips": ("not-an-ip",)},
    ],
)
def test_config_refuses_unusable_values(change: dict[str, Any]) -> None:
    with pytest.raises(TurnError):
        _config(**change)
