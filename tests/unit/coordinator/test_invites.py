"""Invite codes: encoding, damage detection, and the usability rule."""

from __future__ import annotations

import contextlib
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator import invites as inv

pytestmark = pytest.mark.unit

FP = "ab" * 32
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def test_round_trip_survives_pasting_with_spaces_and_newlines() -> None:
    code = inv.InviteCode("https://203.0.113.5:8443", FP, inv.new_secret()).encode()
    assert code.startswith(inv.PREFIX)
    pasted = "  " + code[:20] + "\n" + code[20:] + " \n"
    assert inv.InviteCode.decode(pasted) == inv.InviteCode.decode(code)


def test_a_typo_is_reported_as_damage_not_as_an_unknown_invite() -> None:
    code = inv.InviteCode("https://h:1", FP, "s3cret").encode()
    i = len(inv.PREFIX) + 10
    typo = code[:i] + ("A" if code[i] != "A" else "B") + code[i + 1 :]
    with pytest.raises(inv.InviteMalformed, match="damaged"):
        inv.InviteCode.decode(typo)
    with pytest.raises(inv.InviteMalformed, match="not a Sangama invite"):
        inv.InviteCode.decode("hello")


@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes_decoding(text: str) -> None:
    with contextlib.suppress(inv.InviteMalformed):
        inv.InviteCode.decode(text)


def _state(**kw: object) -> inv.InviteState:
    base: dict[str, object] = {
        "role": "worker",
        "uses_left": 1,
        "expires_at": NOW + dt.timedelta(days=1),
        "revoked": False,
    }
    base.update(kw)
    return inv.InviteState(**base)  # type: ignore[arg-type]


def test_each_refusal_has_its_own_error_and_message() -> None:
    inv.check_usable(_state(), NOW)
    with pytest.raises(inv.InviteUnknown, match="not known"):
        inv.check_usable(None, NOW)
    with pytest.raises(inv.InviteRevoked, match="revoked"):
        inv.check_usable(_state(revoked=True), NOW)
    with pytest.raises(inv.InviteExpired, match="expired on 2026-11-28"):
        inv.check_usable(_state(expires_at=NOW - dt.timedelta(days=1)), NOW)
    with pytest.raises(inv.InviteUsedUp, match="already been used"):
        inv.check_usable(_state(uses_left=0), NOW)


def test_secret_hash_is_stable_and_distinct() -> None:
    assert inv.hash_secret("a") == inv.hash_secret("a") != inv.hash_secret("b")


def test_durations() -> None:
    assert inv.parse_duration("7d") == dt.timedelta(days=7)
    assert inv.parse_duration("90s") == dt.timedelta(seconds=90)
    for bad in ("", "7", "d", "-1d", "0h", "7w"):
        with pytest.raises(ValueError):
            inv.parse_duration(bad)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8443",
        "http://127.8.9.10:8443",
        "http://localhost:8443",
        "http://[::1]:8443",
        "https://203.0.113.5:8443",
    ],
)
def test_plain_http_is_accepted_only_on_this_machine(url: str) -> None:
    code = inv.InviteCode(url, FP, "s3cret").encode()
    assert inv.InviteCode.decode(code).coordinator == url


@pytest.mark.parametrize(
    "url",
    [
        "http://203.0.113.5:8443",
        "http://coordinator.example.org:8443",
        "http://localhost.example.org:8443",
        "http://[2001:db8::1]:8443",
        "http://128.0.0.1:8443",
    ],
)
def test_plain_http_to_another_machine_is_refused(url: str) -> None:
    code = inv.InviteCode(url, FP, "s3cret").encode()
    with pytest.raises(inv.InviteInsecure, match="in clear"):
        inv.InviteCode.decode(code)
