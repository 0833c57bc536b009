"""Which releases a swarm admits and whether a newer one exists: pure, shared by the
coordinator (it refuses) and the volunteers' app (it says so); no IO.

A node states its release in the `Sangama-Release` header of every call (a header, not a
body field: coordinators before it ignore headers, and their bodies stay valid). A node
that states none is a release from before the version exchange (net.wire.versions), which
cannot share a chain with this one, so it is refused like any release older than the
swarm's `min_release`.
"""

from __future__ import annotations

from net.wire.versions import MIN_COMPATIBLE_RELEASE, BadRelease, release_key, this_release

RELEASE_HEADER = "Sangama-Release"
DEFAULT_MIN_RELEASE = MIN_COMPATIBLE_RELEASE


class ReleaseRefused(ValueError):
    """A node's release is older than the swarm admits (or unreadable)."""


def check_release(stated: str | None, min_release: str) -> None:
    """Raise ReleaseRefused, with the line the tray and CLI show, unless `stated` is at
    least `min_release` ("" admits every release)."""
    if not min_release:
        return
    if not stated:
        raise ReleaseRefused(
            "a Sangama release from before 0.1.0 is too old for this swarm: "
            f"update to {min_release} or later"
        )
    try:
        old = release_key(stated) < release_key(min_release)
    except BadRelease:
        raise ReleaseRefused(
            f"{stated[:40]!r} is not a Sangama release: update to {min_release} or later"
        ) from None
    if old:
        raise ReleaseRefused(
            f"Sangama {stated} is too old for this swarm: update to {min_release} or later"
        )


NODE_HEADERS = {RELEASE_HEADER: this_release()}
"""The headers a node of this release sends with every call (tests' HTTP clients too)."""
