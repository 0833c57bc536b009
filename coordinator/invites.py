"""Invite codes: one pasteable string carrying the coordinator address, the swarm CA's
fingerprint (so the first contact is pinned) and a one-time secret.

Pure functions: encoding, decoding with a checksum (a mistyped code says so, rather
than "unknown invite"), secret hashing, and the rule deciding whether a stored invite
may still be used.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from coordinator.errors import CoordinatorError

PREFIX = "sangama1-"
SECRET_BYTES = 24
ROLES = ("worker", "client")


class InviteError(CoordinatorError):
    """An invite code cannot be used; the message is what the person should read."""


class InviteMalformed(InviteError):
    pass


class InviteInsecure(InviteError):
    """The invite names a plain-http coordinator away from this machine: joining would
    send its secret, and later the node token, across the network in clear."""


class InviteUnknown(InviteError):
    pass


class InviteExpired(InviteError):
    pass


class InviteUsedUp(InviteError):
    pass


class InviteRevoked(InviteError):
    pass


USED_UP = "this invite has already been used as many times as allowed"


def invite_refusal(message: str) -> InviteError:
    """The coordinator's refusal of an invite (its message, as check_usable words it) as
    the typed error: a joining node can tell "used up" (perhaps by itself, earlier) from
    the rest."""
    if message.startswith(USED_UP):
        return InviteUsedUp(message)
    return InviteError(message)


@dataclass(frozen=True)
class InviteCode:
    coordinator: str
    """Base URL, e.g. https://203.0.113.5:8443"""
    ca_fingerprint: str
    """sha256 of the swarm CA certificate (hex)"""
    secret: str

    def encode(self) -> str:
        body = json.dumps(
            {"c": self.coordinator, "f": self.ca_fingerprint, "s": self.secret},
            separators=(",", ":"),
        ).encode()
        check = hashlib.sha256(body).digest()[:4]
        return PREFIX + base64.urlsafe_b64encode(body + check).decode().rstrip("=")

    @staticmethod
    def decode(code: str) -> InviteCode:
        code = "".join(code.split())  # pasted codes pick up spaces and line breaks
        if not code.startswith(PREFIX):
            raise InviteMalformed(
                "this is not a Sangama invite code (it should start with 'sangama1-')"
            )
        raw = code[len(PREFIX) :]
        try:
            data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except (binascii.Error, ValueError):
            raise InviteMalformed("the invite code is damaged; copy it again") from None
        body, check = data[:-4], data[-4:]
        if len(data) < 5 or not hmac.compare_digest(hashlib.sha256(body).digest()[:4], check):
            raise InviteMalformed("the invite code is damaged or incomplete; copy it again")
        try:
            doc = json.loads(body)
            invite = InviteCode(str(doc["c"]), str(doc["f"]), str(doc["s"]))
        except (ValueError, KeyError, TypeError):
            raise InviteMalformed("the invite code is damaged; copy it again") from None
        if (
            not invite.coordinator.startswith(("https://", "http://"))
            or len(invite.ca_fingerprint) != 64
        ):
            raise InviteMalformed("the invite code does not name a coordinator and its CA")
        if invite.coordinator.startswith("http://") and not _is_loopback(invite.coordinator):
            raise InviteInsecure(
                f"the invite names {invite.coordinator}, a coordinator without HTTPS on "
                "another machine: joining would send the invite's secret in clear. Ask the "
                "operator for an https:// invite"
            )
        return invite


def _is_loopback(url: str) -> bool:
    """Whether `url`'s host is this machine: localhost, 127.0.0.0/8 or ::1."""
    try:
        host = urlsplit(url).hostname
    except ValueError:  # e.g. an unbalanced "[" in the host
        return False
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a DNS name other than localhost
        return False


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    """What the coordinator stores: a leaked database must not yield usable codes."""
    return hashlib.sha256(b"sangama-invite/1\0" + secret.encode()).hexdigest()


@dataclass(frozen=True)
class InviteState:
    """A stored invite, as the usability rule sees it."""

    role: str
    uses_left: int
    expires_at: dt.datetime
    revoked: bool


def check_usable(state: InviteState | None, now: dt.datetime) -> None:
    """Raise the InviteError a person should see, or return if the invite may be used."""
    if state is None:
        raise InviteUnknown(
            "this invite code is not known to the coordinator (forged or from another swarm)"
        )
    if state.revoked:
        raise InviteRevoked("this invite was revoked by the swarm operator")
    if now >= state.expires_at:
        when = state.expires_at.strftime("%Y-%m-%d %H:%M UTC")
        raise InviteExpired(f"this invite expired on {when}; ask the operator for a new one")
    if state.uses_left <= 0:
        raise InviteUsedUp(USED_UP)


def parse_duration(text: str) -> dt.timedelta:
    """'7d', '12h', '30m', '90s' -> timedelta (the CLI's --expires)."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"duration must look like 7d, 12h, 30m or 90s, not {text!r}")
    return dt.timedelta(seconds=int(text[:-1]) * units[text[-1]])
