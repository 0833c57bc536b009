"""The resume fields of a replay's OPEN, shared by the client (which sends them) and the
last stage (which checks them, app.serving.rules.resume): pure functions, no IO.

A replay after a reroute is a new session whose OPEN names the session it continues,
how many positions a stage that survived should hold of it, and a digest of those
positions' token ids. The digest binds the old session's id: only a party that knows
both the id and the exact history can name a session to take over.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DIGEST_DOMAIN = b"sangama-resume-v1\0"


def history_digest(session: str, tokens: Sequence[int]) -> bytes:
    """SHA-256 of a session's token ids at positions [0, len(tokens)), bound to its id."""
    h = hashlib.sha256(DIGEST_DOMAIN)
    h.update(session.encode("utf-8") + b"\0")
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return h.digest()


@dataclass(frozen=True)
class ResumeRef:
    """The session a replay continues and what a stage that survived holds of it."""

    session: str
    held: int
    digest: bytes
    from_layer: int | None = None
    """The first layer whose stage may take the session over (None: the last stage)."""


def resume_ref(
    old_session: str, history: Sequence[int], from_layer: int | None = None
) -> ResumeRef | None:
    """The resume fields of a replay of `history` that continues `old_session`: the
    stages that kept it (from `from_layer` on) are expected to hold every position but
    the final one (the last answered the previous token and none has seen the newest).
    None when there is nothing to keep."""
    held = len(history) - 1
    if held < 1:
        return None
    digest = history_digest(old_session, history[:held])
    return ResumeRef(old_session, held, digest, from_layer)
