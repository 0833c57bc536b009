"""Names a coordinator sends that end up in the volunteer's file system: checked to be one
safe path component before any folder is made from them.

A model name from an assignment or a route becomes the folder its pieces are kept in
(app/pieces_cache.py). A coordinator is not trusted with the volunteer's files: a name such
as `../../.config/autostart` would make that folder anywhere the user can write. So a name
must be a single component that means the same on Linux, macOS and Windows: ASCII letters,
digits, space and `_.+-`, starting with a letter or digit, not ending in a dot or a space
(Windows drops those), not a Windows device name (CON, NUL, COM1, ...), at most
MAX_NAME_CHARS long. Names people give models (`default`, `gemma-3-270m`, a GGUF's file
stem, `SmolLM2 135M Instruct`) all pass.

Standard library only: the volunteers' client and the coordinator both use it.
"""

from __future__ import annotations

import re

from coordinator.errors import UnsafeName

__all__ = ["MAX_NAME_CHARS", "check_name", "name_problem"]

MAX_NAME_CHARS = 128
"""Far above any real model name; far below any file system's limit for one component."""

_ALLOWED = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.+-]*")
_DEVICES = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
    | {f"{d}{i}" for d in ("COM", "LPT") for i in range(10)}
)


def name_problem(value: object) -> str | None:
    """What makes `value` unusable as a folder name, or None when it is safe."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if not value:
        return "is empty"
    if len(value) > MAX_NAME_CHARS:
        return f"is {len(value)} characters long; at most {MAX_NAME_CHARS}"
    if _ALLOWED.fullmatch(value) is None:
        return (
            "may hold only letters, digits, spaces and _.+- and must start with a letter or digit"
        )
    if value.endswith((".", " ")):
        return "must not end with a dot or a space"
    if value.split(".", 1)[0].rstrip(" ").upper() in _DEVICES:
        return "is a device name on Windows"
    return None


def check_name(value: object, what: str = "name") -> str:
    """`value` itself when it is one safe path component; UnsafeName saying why otherwise."""
    problem = name_problem(value)
    if problem is not None:
        shown = repr(value)[:80] if isinstance(value, str) else type(value).__name__
        raise UnsafeName(f"the {what} {shown} {problem}")
    assert isinstance(value, str)
    return value
