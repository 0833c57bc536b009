"""Talking to a coordinator over HTTPS: joining with an invite, heartbeats, assignments,
routes and manifests. Used by the CLI, the worker and (later) the tray app; no Qt.

The first contact is pinned: the CA certificate is fetched without verification and
accepted only if its sha256 equals the fingerprint inside the invite code. Every later
request verifies the coordinator's certificate against that CA.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import urllib3
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator import contract as c
from coordinator.client.unreachable import unreachable
from coordinator.contract import (
    Assignment,
    CaAnswer,
    Health,
    Heartbeat,
    HeartbeatAnswer,
    JoinAnswer,
    JoinRequest,
    ModelsAnswer,
    PieceSources,
    RenewRequest,
    RouteAnswer,
    Signal,
    SignalPost,
    SourceIncident,
    TurnAnswer,
)
from coordinator.errors import CoordinatorError, MalformedAnswer
from coordinator.invites import InviteCode, invite_refusal
from coordinator.releases import RELEASE_HEADER
from coordinator.spot_checks import CheckRecord
from core.manifest import Manifest
from net import auth
from net.wire.versions import this_release

log = logging.getLogger(__name__)

TIMEOUT = 15.0
MAX_ANSWER_BYTES = 16 << 20
"""The largest answer read from a coordinator (a manifest of a huge model is well under
1 MiB); pieces are downloaded elsewhere, streamed to disk."""


class CoordinatorRefused(CoordinatorError):
    """The coordinator answered with an error; the message is its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PinMismatch(CoordinatorError):
    pass


def fetch_pinned_ca(base_url: str, fingerprint: str) -> bytes:
    """The swarm CA certificate, checked against the fingerprint from the invite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        # Unverified on purpose: we cannot trust the TLS chain before we have the CA,
        # and the pin check below is what makes this first answer trustworthy.
        doc = _call(requests.Session(), "GET", f"{base_url}{c.CA}", verify=False)
    pem = CaAnswer.from_json(doc).certificate_pem.encode()
    cert = auth.load_certificate(pem)
    if auth.fingerprint(cert) != fingerprint.lower():
        raise PinMismatch(
            "the coordinator's CA does not match the invite's fingerprint: "
            "the invite is forged, or someone is in between"
        )
    return pem


def _csr_pem(private_key: Ed25519PrivateKey, wish: str) -> str:
    return auth.make_csr(private_key, wish).public_bytes(serialization.Encoding.PEM).decode()


def join(invite: InviteCode, private_key: Ed25519PrivateKey) -> JoinAnswer:
    """Join the swarm `invite` names. The answer's CA is the one pinned by the invite's
    fingerprint, not the copy the join answer carries: the pin is what is trusted."""
    ca_pem = fetch_pinned_ca(invite.coordinator, invite.ca_fingerprint)
    csr = _csr_pem(private_key, "pending-node")
    with _ca_file(ca_pem) as ca_path:
        try:
            doc = _call(
                requests.Session(),
                "POST",
                f"{invite.coordinator}{c.JOIN}",
                verify=ca_path,
                json=JoinRequest(invite.secret, csr).to_json(),
            )
        except CoordinatorRefused as exc:
            if exc.status != 403:
                raise
            # The invite's own refusal (used up, expired, revoked): typed, so a caller can
            # say what to do about it.
            raise invite_refusal(str(exc)) from exc
    return replace(JoinAnswer.from_json(doc), ca_certificate_pem=ca_pem.decode())


def check_invite(invite: InviteCode) -> c.InviteCheck:
    """Ask the coordinator `invite` names whether it would accept the invite now, without
    using it (POST INVITE_CHECK). Raises CoordinatorError when it cannot be asked."""
    ca_pem = fetch_pinned_ca(invite.coordinator, invite.ca_fingerprint)
    with _ca_file(ca_pem) as ca_path:
        doc = _call(
            requests.Session(),
            "POST",
            f"{invite.coordinator}{c.INVITE_CHECK}",
            verify=ca_path,
            json=c.InviteCheckRequest(invite.secret).to_json(),
        )
    return c.InviteCheck.from_json(doc)


class _ca_file:
    """A temporary CA bundle file for requests' `verify=` (it wants a path)."""

    def __init__(self, pem: bytes) -> None:
        self._tmp = tempfile.NamedTemporaryFile(suffix=".pem", delete=False)  # noqa: SIM115
        self._tmp.write(pem)
        self._tmp.close()

    def __enter__(self) -> str:
        return self._tmp.name

    def __exit__(self, *exc: object) -> None:
        Path(self._tmp.name).unlink(missing_ok=True)


def _call(web: requests.Session, method: str, url: str, **kw: Any) -> Any:
    # Pass verify explicitly: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override
    # web.verify, which would silently swap our pinned swarm CA for system roots.
    kw.setdefault("verify", web.verify)
    kw.setdefault("timeout", TIMEOUT)
    # Every call says which release asks: the coordinator refuses releases too old to
    # share a chain with the others (coordinator.releases), in words the tray shows.
    kw["headers"] = {RELEASE_HEADER: this_release(), **kw.get("headers", {})}
    try:
        with web.request(method, url, stream=True, **kw) as r:
            body = _bounded_body(r, url)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        # In words, not the libraries' "HTTPSConnectionPool(...): Max retries exceeded".
        raise unreachable(exc, url) from exc
    ctype = r.headers.get("content-type", "")
    if r.status_code >= 400:
        doc = _json(body) if ctype.startswith("application/json") else _NOT_JSON
        detail = doc.get("detail") if isinstance(doc, dict) else None
        message = detail if isinstance(detail, str) else body[:300].decode(errors="replace")
        raise CoordinatorRefused(r.status_code, message[:1000])
    if not ctype.startswith("application/json"):
        return body
    doc = _json(body)
    if doc is _NOT_JSON:
        raise MalformedAnswer(f"the coordinator's answer to {url} is not JSON")
    return doc


def _bounded_body(r: requests.Response, url: str) -> bytes:
    """The answer's bytes, refused past MAX_ANSWER_BYTES before they are all in memory."""
    chunks: list[bytes] = []
    size = 0
    for chunk in r.iter_content(64 * 1024):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise MalformedAnswer(
                f"the coordinator's answer to {url} exceeds {MAX_ANSWER_BYTES} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


_NOT_JSON = object()


def _json(body: bytes) -> Any:
    """The JSON in `body`, or _NOT_JSON where it is none. Deeply nested JSON makes
    Python's parser raise RecursionError: that is a malformed answer too, not a crash."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_JSON


class CoordinatorClient:
    """A joined node's authenticated session with its coordinator."""

    def __init__(
        self, base_url: str, node_id: str, token: str, ca_pem: bytes, ca_path: Path
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.node_id = node_id
        self.session = requests.Session()
        self.session.verify = str(ca_path)
        self.session.headers["X-Sangama-Node"] = node_id
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.ca_pem = ca_pem
        self.ca_fingerprint = auth.fingerprint(auth.load_certificate(ca_pem))

    def url(self, path: str) -> str:
        """A path of the contract's URL layout, on this coordinator."""
        return f"{self.base_url}{path}"

    def heartbeat(self, beat: Heartbeat) -> HeartbeatAnswer:
        path = c.HEARTBEAT.format(node_id=self.node_id)
        return HeartbeatAnswer.from_json(
            _call(self.session, "POST", self.url(path), json=beat.to_json())
        )

    def health(self) -> Health:
        """Whether the coordinator is up, and which releases its swarm admits and announces."""
        return Health.from_json(_call(self.session, "GET", self.url(c.HEALTH)))

    def assignment(self) -> Assignment | None:
        doc = _call(self.session, "GET", self.url(c.ASSIGNMENT.format(node_id=self.node_id)))
        return Assignment.from_json(doc) if isinstance(doc, dict) else None

    def route(self, model: str = "default", avoid: tuple[str, ...] = ()) -> RouteAnswer:
        """The current route; with `avoid`, only one that none of those nodes is in."""
        params: dict[str, str | list[str]] = {"model": model}
        if avoid:
            params["avoid"] = list(avoid)
        doc = _call(self.session, "GET", self.url(c.ROUTE), params=params)
        return RouteAnswer.from_json(doc)

    def models(self) -> ModelsAnswer:
        """Every model the swarm serves, the default first."""
        return ModelsAnswer.from_json(_call(self.session, "GET", self.url(c.MODELS)))

    def manifest(self, manifest_url: str) -> Manifest:
        raw = _call(self.session, "GET", self.url(manifest_url))
        text = json.dumps(raw) if isinstance(raw, dict) else bytes(raw).decode()
        return Manifest.from_json(text)

    def report_incident(self, incident: SourceIncident) -> None:
        """Tell the operator's timeline of a source of pieces this node gave up on."""
        path = c.INCIDENTS.format(node_id=self.node_id)
        _call(self.session, "POST", self.url(path), json=incident.to_json())

    def check_inputs(self, check_id: str) -> CheckRecord:
        """A spot check's record, for this node to recompute."""
        path = c.CHECK.format(node_id=self.node_id, check_id=quote(check_id, safe=""))
        return CheckRecord.from_json(_call(self.session, "GET", self.url(path)))

    def answer_check(self, check_id: str, answer: dict[str, Any]) -> None:
        """This node's answer to a spot check's ask: {"record": ...}, or digests."""
        path = c.CHECK.format(node_id=self.node_id, check_id=quote(check_id, safe=""))
        _call(self.session, "POST", self.url(path), json=answer)

    def piece_sources(self, model: str, file: str) -> PieceSources:
        """Where to get one piece, best first (peers holding it, the mirror, the
        coordinator); a coordinator without the endpoint answers 404 (CoordinatorError)."""
        path = c.PIECE_SOURCES.format(name=quote(model, safe=""), file=quote(file, safe=""))
        return PieceSources.from_json(_call(self.session, "GET", self.url(path)))

    def revoked(self) -> list[str]:
        """The swarm's revoked certificate serials."""
        doc = _call(self.session, "GET", self.url(c.REVOKED))
        if not isinstance(doc, list) or len(doc) > c.MAX_SERIALS:
            raise MalformedAnswer("the coordinator's revocation list is not a list of serials")
        return [str(s)[:128] for s in doc if isinstance(s, str | int)]

    def renew(self, private_key: Ed25519PrivateKey) -> bytes:
        doc = _call(
            self.session,
            "POST",
            self.url(c.RENEW.format(node_id=self.node_id)),
            json=RenewRequest(_csr_pem(private_key, self.node_id)).to_json(),
        )
        return JoinAnswer.from_json(doc).certificate_pem.encode()

    def post_signal(self, peer: str, kind: str, link: str, payload: dict[str, Any]) -> None:
        """Send an ICE offer or answer to `peer` through the coordinator."""
        _call(
            self.session,
            "POST",
            self.url(c.SIGNAL_TO.format(peer_id=peer)),
            json=SignalPost(kind, link, payload).to_json(),
        )

    def signals(self, wait: float) -> list[Signal]:
        """Messages for this node; the coordinator holds the request up to `wait` s.
        A malformed message is dropped with a warning, the others still delivered."""
        result = _call(
            self.session,
            "GET",
            self.url(c.SIGNALS),
            params={"wait": wait},
            timeout=wait + TIMEOUT,
        )
        signals = []
        for doc in result if isinstance(result, list) else []:
            try:
                signals.append(Signal.from_json(doc))
            except MalformedAnswer as exc:
                log.warning("ignoring a signal: %s", exc)
        return signals

    def turn(self) -> TurnAnswer | None:
        """TURN credentials for this node, or None where the swarm has no relay."""
        try:
            result = _call(self.session, "GET", self.url(c.TURN))
        except CoordinatorRefused as exc:
            if exc.status == 404:
                return None
            raise
        return TurnAnswer.from_json(result) if isinstance(result, dict) else None

    def pieces_url(self, assignment: Assignment) -> str:
        return self.url(assignment.pieces_url)
