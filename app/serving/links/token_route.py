"""Which of a node's links carries its TOKENS back, at the last stage.

One node id can hold two links to the last stage: a desktop app chats as the identity
its own worker serves with, so when that worker is an earlier stage of the route, the
app's chat client and its worker both link to the last stage under the same id. The
worker's link is the one the session's OPEN and STEPs come over; the answer must go to
the other one, the chat client's, or it is lost and the chat waits out its first-token
timeout (the installed app's first chat, installers/README.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

L = TypeVar("L")


def reply_link(links: Sequence[L], upstream: L | None, upstream_is_stage: bool) -> L | None:
    """The link for a session's TOKENS among its client's `links` (oldest first).

    The newest one, except that where the session comes from an upstream stage (this
    stage is not the first) the upstream's own link never is the client's: a node
    chatting through its own stage is answered on its other link. With no other link
    the upstream's is the one there is (a node that both sends and reads over one link);
    a client link ready later takes over (SessionRules' LinkReady)."""
    for link in reversed(links):
        if not upstream_is_stage or link != upstream:
            return link
    return upstream if upstream in links else None
