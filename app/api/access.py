"""Who may use the OpenAI-compatible API: a caller with the API key, through a Host header
that names this machine.

The API answers with the volunteer's swarm identity, so an open port on localhost is not
enough: any web page the volunteer visits can send requests to 127.0.0.1, and with DNS
rebinding (a name of the attacker's that first resolves to their server, then to
127.0.0.1) it can read the answers too. Two checks stop that, both before a request
reaches the app:

- the Host header must name the bound address or loopback (`localhost`, `127.0.0.1`,
  `[::1]`), with the bound port if it has one: a rebound page sends its own name;
- `Authorization: Bearer <key>` must carry the API key, a random secret kept in a 0600
  file (`load_or_create_key`) and shown to the user where the API is started. A page
  cannot read that file, and OpenAI tools send their `api_key` exactly this way.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ConfigError

API_KEY_FILE = "api-key"
"""Beside the identity it serves (or in the user config dir for a static route)."""

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class HostRule:
    """Which Host headers the API accepts: `bound` is the address it listens on."""

    bound: str
    port: int

    def allows(self, header: str) -> bool:
        """True when `header` (the Host header as sent) names this machine's API."""
        name, port = _split_host(header)
        if name is None or (port is not None and port != self.port):
            return False
        if name in _LOOPBACK_NAMES or name == self.bound.lower():
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False  # a DNS name other than localhost: a rebinding page's name
        if ip.is_loopback:
            return True
        # Bound to every address: an IP literal is how another machine reaches it; no DNS
        # name (which a rebinding attacker controls) is.
        return self.bound in ("0.0.0.0", "::")


def _split_host(header: str) -> tuple[str | None, int | None]:
    """(host name lowercased, port or None) of a Host header; (None, None) if malformed."""
    text = header.strip().lower()
    if not text or any(c.isspace() or c in "/@\\" for c in text):
        return None, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None, None
        name, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            return None, None
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        name, port_text = text.split(":")
    elif ":" in text:
        return None, None  # an IPv6 literal must be bracketed in a Host header
    else:
        name, port_text = text, None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None, None
    return name, int(port_text)


def key_matches(authorization: str | None, key: str) -> bool:
    """Whether an Authorization header carries `key` as its bearer token."""
    if not key or not authorization or not authorization.startswith("Bearer "):
        return False
    return hmac.compare_digest(authorization[7:].strip().encode(), key.encode())


class ApiAccess:
    """ASGI middleware: the Host rule and the API key, checked on every HTTP request;
    refusals are OpenAI-shaped errors (403 for the Host, 401 for the key)."""

    def __init__(self, app: ASGIApp, key: str, hosts: HostRule) -> None:
        if not key:
            raise ConfigError("the API needs a non-empty API key")
        self.app = app
        self.key = key
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope["headers"])
        if not self.hosts.allows(headers.get("host", "")):
            await _refuse(
                send, 403, "this API answers only requests to its own address", "bad_host"
            )
            return
        if not key_matches(headers.get("authorization"), self.key):
            await _refuse(
                send,
                401,
                "missing or wrong API key: send the key `sangama api` printed, as the api_key",
                "invalid_api_key",
            )
            return
        await self.app(scope, receive, send)


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key in ("host", "authorization"):
            if key in out:  # two Host or Authorization headers: trust neither
                out[key] = ""
            else:
                out[key] = value.decode("latin-1")
    return out


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def load_or_create_key(path: Path) -> str:
    """The API key kept at `path`: made once (random, 0600 file in a 0700 folder when
    the folder is new), then read. ConfigError when the file cannot be used."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise ConfigError(f"cannot read the API key in {path}: {exc}") from exc
    if text:
        return text
    key = "sk-sangama-" + secrets.token_urlsafe(24)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write the API key to {path}: {exc}") from exc
    return key


def default_key_path(identity_dir: Path | None) -> Path:
    """Beside the identity the API serves; for a static route, in the user config dir."""
    if identity_dir is not None:
        return identity_dir / API_KEY_FILE
    import platformdirs

    return Path(platformdirs.user_config_dir("sangama")) / API_KEY_FILE
