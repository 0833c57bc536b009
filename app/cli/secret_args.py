"""Secrets for commands without putting them on the command line.

A command line is visible to every account on the machine (`ps`, /proc/PID/cmdline), so
a password given as `--admin-password` or a relay secret given as `--secret` is not
secret. Each such value can come from a file (`--...-file`, read whole, one trailing
newline dropped) or an environment variable (readable only by the same user); the old
flags still work and print a warning saying so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from app.errors import ConfigError

ADMIN_PASSWORD_ENV = "SANGAMA_ADMIN_PASSWORD"
TURN_SECRET_ENV = "SANGAMA_TURN_SECRET"


def read_secret(
    given: str | None,
    file: Path | None,
    env: str,
    flag: str,
    *,
    environ: dict[str, str] | None = None,
    warn: TextIO | None = None,
) -> str | None:
    """The secret from `flag`'s value, `file` or the environment variable `env` (in that
    order), or None where none is given. ConfigError for an unreadable or empty file."""
    if given is not None:
        print(
            f"warning: {flag} puts the secret on the command line, where other users of this "
            f"machine can read it (ps); use {flag}-file FILE or the {env} environment variable",
            file=warn or sys.stderr,
        )
        return given
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {flag}-file {file}: {exc.strerror or exc}") from exc
        value = text[:-1] if text.endswith("\n") else text
        if not value:
            raise ConfigError(f"{flag}-file {file} is empty")
        return value
    from_env = (os.environ if environ is None else environ).get(env)
    return from_env or None
