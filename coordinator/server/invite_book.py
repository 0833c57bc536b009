"""The invites the coordinator has handed out: create, list and revoke them in its
database. The one place these rules live: the HTTP API (through `Coordinator`) and the
operator's `sangama invite` command both come here. Using an invite to join is part of
the join itself (service.Coordinator.join), in the same transaction as the new node.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select

from coordinator import invites as inv
from coordinator.contract import InviteCheck
from coordinator.errors import NotFound
from coordinator.server.store import Invite, Store, as_utc, utcnow

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
