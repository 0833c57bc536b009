"""Who is asking the coordinator's API: the caller's address (behind a trusted proxy
only), whether it asks from this machine, the operator (a logged-in browser or the admin
token), a joined node (its id and node token), whether its release is admitted, and how
many failed attempts it has left. The FastAPI dependencies that require each are here.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import threading
import time
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi import Path as PathParam

from coordinator.releases import ReleaseRefused, check_release
from coordinator.server.limits import AttemptLimiter
from coordinator.server.secret_hashes import hash_token

SESSION_COOKIE = "sangama_session"
ADMIN_TOKEN = "admin_token_hash"

_FORWARDING_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")


def _in(host: str, networks: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n, strict=False) for n in networks)


def caller_address(request: Request, trusted_proxies: tuple[str, ...]) -> str:
    """Who is asking: the connection's peer, or, where that peer is a configured
    trusted proxy (`--trusted-proxy`), the nearest address in its X-Forwarded-For that
    is not itself a trusted proxy. No header is believed from anyone else: a caller
    would name itself anew on every try and escape every limit."""
    peer = request.client.host if request.client is not None else "unknown"
    if not trusted_proxies or not _in(peer, trusted_proxies):
        return peer
    hops = [h.strip() for h in request.headers.get("x-forwarded-for", "").split(",")]
    for hop in reversed(hops):
        if not hop or _in(hop, trusted_proxies):
            continue
        try:
            return str(ipaddress.ip_address(hop))
        except ValueError:
            return peer  # a hop we cannot read: the proxy itself answers for it
    return peer


def from_loopback(request: Request) -> bool:
    """Asked from this machine, and not passed on by a proxy on this machine (which
    would make every caller on the internet look local)."""
    trusted: tuple[str, ...] = request.app.state.coord.settings.trusted_proxies
    host = caller_address(request, trusted)
    peer = request.client.host if request.client is not None else ""
    if not _in(peer, trusted) and any(h in request.headers for h in _FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """An operator: a logged-in browser session or the admin bearer token."""
    if request.cookies.get(SESSION_COOKIE) in request.app.state.sessions:
        return
    stored = request.app.state.coord.store.get_setting(ADMIN_TOKEN)
    bearer = authorization[7:] if authorization and authorization.startswith("Bearer ") else None
    if bearer and stored is not None and hmac.compare_digest(hash_token(bearer), stored):
        return
    raise HTTPException(401, "operator login or admin token required")


def require_node(
    request: Request,
    x_sangama_node: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """A joined node (worker or client): its id and node token."""
    if not x_sangama_node or not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "node id and node token required")
    request.app.state.coord.authenticate_node(x_sangama_node, authorization[7:])
    return x_sangama_node


Admin = Annotated[None, Depends(require_admin)]
NodeId = Annotated[str, Depends(require_node)]
InviteId = Annotated[int, PathParam(ge=1, le=2**31 - 1)]  # an INTEGER key fits 32 bits (PostgreSQL)
NodePath = Annotated[str, PathParam(pattern=r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$")]
"""A node id as net.auth issues them (and so, no NUL for PostgreSQL to choke on)."""


def admit_release(stated: str | None, min_release: str) -> None:
    """426 Upgrade Required where the caller's release is older than this swarm admits."""
    try:
        check_release(stated, min_release)
    except ReleaseRefused as exc:
        raise HTTPException(426, str(exc)) from None


class Attempts:
    """One kind of attempt (logins, joins, invite checks) per caller address: each is
    counted as failed when admitted, until it succeeds (limits.py); a 429 past the
    limit. Sync routes run on a thread pool, hence the lock."""

    def __init__(self, limiter: AttemptLimiter) -> None:
        self._limiter = limiter
        self._lock = threading.Lock()

    def admit(self, request: Request) -> str:
        """The caller, its attempt counted as failed until it succeeds; else a 429."""
        caller = caller_address(request, request.app.state.coord.settings.trusted_proxies)
        with self._lock:
            wait = self._limiter.admit(caller, time.monotonic())
        if wait > 0:
            seconds = str(math.ceil(wait))
            raise HTTPException(
                429,
                f"too many failed attempts; try again in {seconds} s",
                headers={"Retry-After": seconds},
            )
        return caller

    def done(self, caller: str, ok: bool) -> None:
        if ok:  # a failure was counted when the attempt was admitted
            with self._lock:
                self._limiter.succeeded(caller)
