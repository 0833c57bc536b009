"""net.ice.paths without sockets: offers round-trip through JSON, configurations and offers are
validated, the selected path type is the less direct end, and a relayed candidate is never
paired with a private host candidate (the cause of coturn's 438/400, see net/ice/paths.py)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aioice
import aioice.ice
import pytest

from net.errors import NetError
from net.ice.paths import (
    POLICY_ALL,
    POLICY_RELAY,
    IceConfig,
    IceConfigError,
    IceError,
    IceOffer,
    SelectedPair,
    _Connection,
    relay_cannot_reach,
)

pytestmark = pytest.mark.unit

UFRAG = "aB3+"
PWD = "abcdefghijklmnopqrstuv"  # 22 characters, the minimum
HOST = "candidate:1 1 udp 2130706431 10.203.0.1 40001 typ host"
SRFLX = "candidate:2 1 udp 1694498815 198.51.100.11 3127 typ srflx raddr 10.203.0.1 rport 40001"
RELAY = "candidate:3 1 udp 16777215 198.51.100.1 40584 typ relay raddr 0.0.0.0 rport 9"
V6 = "candidate:4 1 udp 2130706431 2001:db8::7 40002 typ host"
TURN = ("198.51.100.1", 3478)


def offer_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ufrag": UFRAG,
        "pwd": PWD,
        "candidates": [HOST, SRFLX, RELAY, V6],
        "ice_lite": False,
    }
    doc.update(changes)
    return doc


def candidate(sdp: str) -> aioice.Candidate:
    return aioice.Candidate.from_sdp(sdp)


# ---------------------------------------------------------------- offers


def test_offer_round_trips_through_json() -> None:
    offer = IceOffer(UFRAG, PWD, (HOST, SRFLX, RELAY, V6), ice_lite=True)
    wire = json.dumps(offer.to_dict())
    assert IceOffer.from_dict(json.loads(wire)) == offer
    assert json.loads(wire) == {
        "ufrag": UFRAG,
        "pwd": PWD,
        "candidates": [HOST, SRFLX, RELAY, V6],
        "ice_lite": True,
    }


def test_offer_from_real_aioice_candidates_round_trips() -> None:
    async def gather() -> IceOffer:
        conn = aioice.Connection(ice_controlling=True)
        # The candidates aioice would offer, without binding sockets.
        sdps = tuple(c.to_sdp() for c in (candidate(HOST), candidate(RELAY)))
        return IceOffer(conn.local_username, conn.local_password, sdps)

    offer = asyncio.run(gather())
    assert IceOffer.from_dict(json.loads(json.dumps(offer.to_dict()))) == offer


def test_ice_lite_defaults_to_false() -> None:
    doc = offer_doc()
    del doc["ice_lite"]
    assert IceOffer.from_dict(doc).ice_lite is False


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ufrag": "abc"}, "ufrag"),
        ({"ufrag": "abc-"}, "ufrag"),
        ({"ufrag": 1234}, "ufrag"),
        ({"pwd": "short"}, "pwd"),
        ({"pwd": "x" * 257}, "pwd"),
        ({"pwd": "a b" * 8}, "pwd"),
        ({"candidates": HOST}, "list"),
        ({"candidates": [HOST] * 65}, "more than"),
        ({"candidates": [7]}, "string"),
        ({"candidates": [""]}, "string"),
        ({"candidates": ["not a candidate"]}, "unparsable"),
        ({"candidates": [HOST.replace("udp", "tcp")]}, "UDP"),
        ({"candidates": [HOST.replace("typ host", "typ prflx")]}, "never signalled"),
        ({"candidates": [HOST.replace("10.203.0.1", "abcd.local")]}, "IP address"),
        ({"candidates": [HOST.replace("40001", "0")]}, "port"),
        ({"ice_lite": 1}, "boolean"),
        ({"extra": 1}, "unknown"),
    ],
)
def test_malformed_offers_are_refused(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(IceConfigError, match=why):
        IceOffer.from_dict(offer_doc(**changes))


@pytest.mark.parametrize("missing", ["ufrag", "pwd", "candidates"])
def test_offers_missing_a_field_are_refused(missing: str) -> None:
    doc = offer_doc()
    del doc[missing]
    with pytest.raises(IceConfigError, match=missing):
        IceOffer.from_dict(doc)


def test_an_offer_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(IceConfigError, match="mapping"):
        IceOffer.from_dict([UFRAG, PWD])  # type: ignore[arg-type]


def test_offer_errors_are_net_errors_and_value_errors() -> None:
    with pytest.raises(NetError):
        IceOffer.from_dict(offer_doc(pwd="short"))
    with pytest.raises(ValueError):
        IceOffer.from_dict(offer_doc(pwd="short"))


# ---------------------------------------------------------------- configuration


def test_default_config_is_the_bounded_default_policy() -> None:
    cfg = IceConfig()
    assert cfg.policy == POLICY_ALL
    assert cfg.timeout_s == 8.0
    assert cfg.components == 1


def test_with_relay_only_keeps_everything_else() -> None:
    cfg = IceConfig(
        stun_server=TURN,
        turn_server=TURN,
        turn_username="1:n",
        turn_password="pw",
        timeout_s=3.0,
        extra_host_candidates=(("203.0.113.9", 4433),),
    )
    relay = cfg.with_relay_only()
    assert relay.policy == POLICY_RELAY
    assert relay.relay_only and not cfg.relay_only
    assert (relay.turn_server, relay.timeout_s, relay.extra_host_candidates) == (
        cfg.turn_server,
        cfg.timeout_s,
        cfg.extra_host_candidates,
    )


def test_the_turn_password_stays_out_of_repr() -> None:
    cfg = IceConfig(turn_server=TURN, turn_username="1:n", turn_password="s3cret")
    assert "s3cret" not in repr(cfg)


def test_a_1to1_nat_candidate_may_leave_the_port_open() -> None:
    assert IceConfig(extra_host_candidates=(("203.0.113.9", 0),)).extra_host_candidates


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"timeout_s": 0}, "positive"),
        ({"timeout_s": -1.0}, "positive"),
        ({"timeout_s": math.nan}, "finite"),
        ({"timeout_s": math.inf}, "finite"),
        ({"timeout_s": "8"}, "number"),
        ({"timeout_s": True}, "number"),
        ({"exchange_timeout_s": 0.0}, "positive"),
        ({"relay_only": True}, "turn_server"),
        ({"turn_server": TURN, "turn_username": "1:n"}, "go together"),
        ({"turn_server": TURN, "turn_password": "pw"}, "go together"),
        ({"turn_username": "1:n", "turn_password": "pw"}, "without a turn_server"),
        ({"turn_server": ("relay", 0)}, "turn_server"),
        ({"turn_server": ("", 3478)}, "turn_server"),
        ({"turn_server": ("relay", 70000)}, "turn_server"),
        ({"stun_server": ("stun", "3478")}, "stun_server"),
        ({"stun_server": "stun:3478"}, "stun_server"),
        ({"components": 0}, "components"),
        ({"components": 1.0}, "components"),
        ({"extra_host_candidates": [("203.0.113.9", 1)]}, "tuple"),
        ({"extra_host_candidates": (("example.org", 1),)}, "IP address"),
        ({"extra_host_candidates": (("127.0.0.1", 1),)}, "not reachable"),
        ({"extra_host_candidates": (("0.0.0.0", 1),)}, "not reachable"),
        ({"extra_host_candidates": (("203.0.113.9", 65536),)}, "port"),
        ({"extra_host_candidates": (("203.0.113.9", -1),)}, "port"),
        ({"extra_host_candidates": (("203.0.113.9",),)}, "ip, port"),
    ],
)
def test_unusable_configs_are_refused(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(IceConfigError, match=why):
        IceConfig(**kwargs)


def test_config_errors_are_ice_errors() -> None:
    with pytest.raises(IceError):
        IceConfig(relay_only=True)


# ---------------------------------------------------------------- selected path type


@pytest.mark.parametrize(
    ("local", "remote", "expected"),
    [
        ("host", "host", "host"),
        ("host", "prflx", "prflx"),
        ("srflx", "prflx", "srflx"),
        ("srflx", "srflx", "srflx"),
        ("relay", "prflx", "relay"),
        ("host", "relay", "relay"),
        ("relay", "relay", "relay"),
    ],
)
def test_path_type_is_the_less_direct_end(local: str, remote: str, expected: str) -> None:
    pair = SelectedPair(local, ("10.0.0.1", 1), remote, ("10.0.0.2", 2))
    assert pair.path_type == expected


# ---------------------------------------------------------------- the pairing fix


@pytest.mark.parametrize(
    ("sdp", "unreachable"),
    [
        (HOST, True),  # 10/8
        (HOST.replace("10.203.0.1", "192.168.2.2"), True),
        (HOST.replace("10.203.0.1", "172.20.0.5"), True),
        (HOST.replace("10.203.0.1", "100.64.1.1"), True),  # carrier-grade NAT
        (HOST.replace("10.203.0.1", "169.254.3.3"), True),
        (V6.replace("2001:db8::7", "fd00::1"), True),
        (V6.replace("2001:db8::7", "::ffff:192.168.1.9"), True),
        (HOST.replace("10.203.0.1", "198.51.100.7"), False),  # the system tests' "internet"
        (HOST.replace("10.203.0.1", "8.8.8.8"), False),
        (V6, False),
        (SRFLX.replace("198.51.100.11", "10.1.1.1"), False),  # seen by a server: keep
        (RELAY.replace("198.51.100.1", "10.203.0.1"), False),  # lives on the relay: keep
    ],
)
def test_which_remote_candidates_a_relay_cannot_reach(sdp: str, unreachable: bool) -> None:
    assert relay_cannot_reach(candidate(sdp)) is unreachable


def _pairs_formed(remote_sdps: list[str]) -> set[tuple[str, str]]:
    """(local type, remote address) of the check list `_Connection` forms."""

    async def form() -> set[tuple[str, str]]:
        conn = _Connection(ice_controlling=True)
        for local_type, sdp in (("host", HOST), ("relay", RELAY)):
            protocol = aioice.ice.StunProtocol(conn)
            protocol.local_candidate = candidate(sdp)
            assert protocol.local_candidate.type == local_type
            conn._protocols.append(protocol)
        for sdp in remote_sdps:
            conn._pair_remote_candidate(candidate(sdp))
        assert len(conn._protocols) == 2  # restored after every pairing
        return {(p.local_candidate.type, p.remote_candidate.host) for p in conn._check_list}

    return asyncio.run(form())


def test_a_relayed_candidate_is_not_paired_with_a_private_host_candidate() -> None:
    private_host = HOST.replace("10.203.0.1", "192.168.2.2")
    assert _pairs_formed([private_host, SRFLX, RELAY]) == {
        ("host", "192.168.2.2"),
        ("host", "198.51.100.11"),
        ("host", "198.51.100.1"),
        ("relay", "198.51.100.11"),
        ("relay", "198.51.100.1"),
    }


def test_a_public_host_candidate_is_still_paired_with_the_relay() -> None:
    public_host = HOST.replace("10.203.0.1", "203.0.113.9")
    assert ("relay", "203.0.113.9") in _pairs_formed([public_host])
