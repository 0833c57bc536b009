"""Which release speaks what, and what two peers agree on: pure functions, no IO.

Volunteers run different releases at once. Each frame keeps VERSION 1 in its header
(every release refuses any other), and what a peer understands beyond the base frames is
its PROTOCOL_VERSION, exchanged in HELLO and WELCOME (net.protocol). Both sides then use
the lower of the two (`negotiate`), and `downgrade` leaves out of each frame the optional
tails the other side does not read: `TAILS` says which field arrived with which version.
A release also has a package version ("0.2.0") for people: `release_key` orders them,
and the coordinator admits releases from its `min_release` on.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version

from net.wire.frames import Frame, Hello, Open, Step, Tokens, Welcome
from net.wire.layout import PROTOCOL_VERSION

MIN_COMPATIBLE_RELEASE = "0.1.0"
"""The oldest package version this release works with in one swarm: the first one that
announces its protocol (older ones refuse this release's HELLO). The coordinator's
default `min_release`."""


@dataclass(frozen=True)
class Tail:
    """An optional field at the end of a frame, and the protocol that introduced it."""

    frame: type
    field: str
    since: int


TAILS: tuple[Tail, ...] = (
    Tail(Hello, "protocol", 2),
    Tail(Hello, "release", 2),
    Tail(Welcome, "protocol", 2),
    Tail(Welcome, "release", 2),
    Tail(Open, "resumes", 2),
    Tail(Open, "resume_held", 2),
    Tail(Open, "resume_digest", 2),
    Tail(Open, "resume_from_layer", 2),
    Tail(Open, "loop", 2),
    Tail(Step, "one_by_one", 2),
    Tail(Tokens, "looped", 2),
    Tail(Tokens, "guessed", 2),
)
"""Every optional field of every frame: a frame without them reads as it did at
protocol 1. A field added later gets a row here with the PROTOCOL_VERSION it comes with."""


def _default(cls: type, name: str) -> object:
    for f in fields(cls):
        if f.name == name:
            if f.default is MISSING:
                raise TypeError(f"{cls.__name__}.{name} has no default: it cannot be a tail")
            return f.default
    raise TypeError(f"{cls.__name__} has no field {name}")


_BY_FRAME: dict[type, tuple[tuple[str, int, object], ...]] = {
    cls: tuple((t.field, t.since, _default(cls, t.field)) for t in TAILS if t.frame is cls)
    for cls in {t.frame for t in TAILS}
}
"""Per frame type: (field, since, default), checked against the dataclasses at import."""


class VersionError(ValueError):
    """Base of this module's refusals."""


class PeerTooOld(VersionError):
    """The peer speaks a protocol older than the oldest this side accepts."""

    def __init__(self, theirs: int, oldest: int, release: str = "") -> None:
        who = f"Sangama {release}" if release else "a Sangama release before 0.1.0"
        super().__init__(
            f"{who} speaks protocol {theirs}; this peer needs protocol {oldest} or later: "
            "update Sangama"
        )
        self.theirs = theirs
        self.oldest = oldest
        self.release = release


class BadRelease(VersionError):
    """A package version that is not dotted numbers (e.g. "0.2.0", "1.0.0rc1")."""


def negotiate(ours: int, theirs: int, oldest: int) -> int:
    """The protocol both sides use: the lower one; PeerTooOld below `oldest`."""
    if theirs < oldest:
        raise PeerTooOld(theirs, oldest)
    return min(ours, theirs)


def needed(frame: Frame) -> int:
    """The lowest protocol that can carry `frame` as it is (its set tails' newest)."""
    need = 1
    for name, since, default in _BY_FRAME.get(type(frame), ()):
        if since > need and getattr(frame, name) != default:
            need = since
    return need


def downgrade(frame: Frame, protocol: int) -> Frame:
    """`frame` without the tails `protocol` lacks: what a peer of that protocol reads.

    A dropped tail is a request the old peer could not have honoured anyway (no ring, no
    KV kept over a replay, rows in one batch): the frame keeps its base meaning."""
    drop = {
        name: default
        for name, since, default in _BY_FRAME.get(type(frame), ())
        if since > protocol and getattr(frame, name) != default
    }
    return replace(frame, **drop) if drop else frame  # type: ignore[arg-type]


_RELEASE = re.compile(r"^(\d{1,6})(?:\.(\d{1,6})){0,3}")


def release_key(text: str) -> tuple[int, ...]:
    """ "0.2.0" -> (0, 2, 0), for ordering; a suffix ("rc1", "+local") is ignored, trailing
    zeros too ("0.2" == "0.2.0"). BadRelease for anything else."""
    m = _RELEASE.match(text.strip())
    if m is None or len(text) > 64:
        raise BadRelease(f"{text!r} is not a release like 0.2.0")
    parts = [int(p) for p in m.group(0).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@cache
def this_release() -> str:
    """The installed package's version ("0+unknown" when run from a bare source tree)."""
    try:
        return version("sangama")
    except PackageNotFoundError:
        return "0+unknown"


__all__ = [
    "MIN_COMPATIBLE_RELEASE",
    "PROTOCOL_VERSION",
    "TAILS",
    "BadRelease",
    "PeerTooOld",
    "Tail",
    "VersionError",
    "downgrade",
    "needed",
    "negotiate",
    "release_key",
    "this_release",
]
