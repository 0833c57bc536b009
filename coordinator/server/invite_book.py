"""The invites the coordinator has handed out: create, list, check and revoke them in
its database, and redeem one to join. The one place these rules live: the HTTP API
(through `Coordinator`) and the operator's `sangama invite` command both come here. A
join takes its invite's use in the same transaction that adds the new node.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from coordinator import invites as inv
from coordinator.contract import InviteCheck
from coordinator.errors import NotFound
from coordinator.server.events import clean_name, name_from_note
from coordinator.server.secret_hashes import hash_token
from coordinator.server.store import Certificate, Invite, Node, Store, as_utc, utcnow

if TYPE_CHECKING:
    from cryptography import x509

MAX_USES = 10_000
MAX_LIFETIME = dt.timedelta(days=366)


@dataclass(frozen=True)
class InviteRecord:
    """A stored invite as the operator sees it (never its secret: only a hash is kept)."""

    id: int
    role: str
    uses_left: int
    max_uses: int
    expires_at: dt.datetime
    """UTC."""
    revoked: bool
    note: str


def create_invite(
    store: Store,
    public_url: str,
    ca_fingerprint: str,
    role: str,
    uses: int,
    expires: dt.timedelta,
    note: str = "",
) -> tuple[int, str]:
    """Store a new invite; return its id and the code to hand out (shown only once)."""
    if role not in inv.ROLES:
        raise ValueError(f"role must be one of {inv.ROLES}")
    if not (1 <= uses <= MAX_USES):
        raise ValueError("uses must be between 1 and 10000")
    if expires <= dt.timedelta(0) or expires > MAX_LIFETIME:
        raise ValueError("an invite expires after a positive time of at most a year")
    secret = inv.new_secret()
    with store.session() as s:
        row = Invite(
            secret_hash=inv.hash_secret(secret),
            role=role,
            max_uses=uses,
            uses_left=uses,
            expires_at=utcnow() + expires,
            revoked=False,
            note=note[:200],
        )
        s.add(row)
        s.flush()
        invite_id = row.id
    return invite_id, inv.InviteCode(public_url.rstrip("/"), ca_fingerprint, secret).encode()


def list_invites(store: Store) -> list[InviteRecord]:
    """Every invite, newest first."""
    with store.session() as s:
        return [
            InviteRecord(
                row.id,
                row.role,
                row.uses_left,
                row.max_uses,
                as_utc(row.expires_at),
                row.revoked,
                row.note,
            )
            for row in s.scalars(select(Invite).order_by(Invite.id.desc()))
        ]


def revoke_invite(store: Store, invite_id: int) -> None:
    """Mark the invite unusable (joins already made with it stay); NotFound if unknown."""
    with store.session() as s:
        row = s.get(Invite, invite_id)
        if row is None:
            raise NotFound(f"no invite {invite_id}")
        row.revoked = True


def check_invite(store: Store, secret: str, now: dt.datetime) -> InviteCheck:
    """Would joining with `secret` be accepted now? Read-only: no use is taken, so a
    volunteer can check a new code before leaving the swarm they serve."""
    with store.session() as s:
        row = s.scalars(select(Invite).where(Invite.secret_hash == inv.hash_secret(secret))).first()
        state = (
            None
            if row is None
            else inv.InviteState(row.role, row.uses_left, as_utc(row.expires_at), row.revoked)
        )
    try:
        inv.check_usable(state, now)
    except inv.InviteError as exc:
        return InviteCheck(False, "", str(exc))
    assert state is not None
    return InviteCheck(True, state.role, "")


@dataclass(frozen=True)
class Redeemed:
    """A node that joined with an invite: its new id, node token and certificate."""

    node_id: str
    role: str
    invite_id: int
    name: str
    """Its name from the invite's note ("" for none)."""
    certificate: x509.Certificate
    token: str
    """The node token, shown to the node only now (only its hash is kept)."""


def redeem_invite(
    store: Store,
    secret: str,
    now: dt.datetime,
    issue: Callable[[str, str], x509.Certificate],
) -> Redeemed:
    """Take one use of the invite with `secret` and add the node it admits, with the
    certificate `issue(node_id, role)` makes; the InviteError a person should read when
    the invite cannot be used."""
    secret_hash = inv.hash_secret(secret)
    with store.session() as s:
        # One conditional UPDATE takes the use, first: the database serialises
        # concurrent joins with one code, and only one that found a use left gets
        # it. Every later refusal raises inside this transaction, which undoes it.
        taken = s.execute(
            update(Invite)
            .where(
                Invite.secret_hash == secret_hash,
                Invite.uses_left > 0,
                Invite.revoked.is_(False),
            )
            .values(uses_left=Invite.uses_left - 1)
            .execution_options(synchronize_session=False)
        )
        row = s.scalars(select(Invite).where(Invite.secret_hash == secret_hash)).first()
        state = (
            None
            if row is None
            else inv.InviteState(
                row.role,
                row.uses_left + (1 if _rowcount(taken) == 1 else 0),
                as_utc(row.expires_at),
                row.revoked,
            )
        )
        inv.check_usable(state, now)  # raises the InviteError a person should read
        if row is None or _rowcount(taken) != 1:  # checked usable, yet another took it
            raise inv.InviteUsedUp("this invite has already been used as many times as allowed")
        node_id = f"{row.role}-{secrets.token_hex(3)}"
        base = clean_name(row.note)
        similar = select(Node.name).where(Node.name.startswith(base, autoescape=True))
        name = name_from_note(row.note, set(s.scalars(similar)) if base else set())
        cert = issue(node_id, row.role)
        token = secrets.token_urlsafe(24)
        s.add(
            Node(
                node_id=node_id,
                role=row.role,
                token_hash=hash_token(token),
                invite_id=row.id,
                name=name,
                hardware={},
                stats={},
            )
        )
        s.flush()  # the certificate row refers to the node row
        s.add(
            Certificate(
                serial=str(cert.serial_number),
                node_id=node_id,
                not_after=cert.not_valid_after_utc,
                revoked=False,
            )
        )
    return Redeemed(node_id, row.role, row.id, name, cert, token)


def _rowcount(result: Any) -> int:
    """Rows an UPDATE changed (a CursorResult's rowcount; typed loosely by SQLAlchemy)."""
    return int(getattr(result, "rowcount", 0))
