"""Talking to a coordinator over HTTPS: joining with an invite, heartbeats, assignments,
routes and manifests. Used by the CLI, the worker and (later) the tray app; no Qt.

The first contact is pinned: the CA certificate is fetched without verification and
accepted only if its sha256 equals the fingerprint inside the invite code. Every later
request verifies the coordinator's certificate against that CA.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.errors import CoordinatorError
from coordinator.invites import InviteCode
from core.manifest import Manifest
from net import auth

TIMEOUT = 15.0


class CoordinatorUnreachable(CoordinatorError):
    pass


class CoordinatorRefused(CoordinatorError):
    """The coordinator answered with an error; the message is its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PinMismatch(CoordinatorError):
    pass


@dataclass(frozen=True)
class Joined:
    node_id: str
    role: str
    certificate_pem: bytes
    ca_certificate_pem: bytes
    token: str
    coordinator: str


def fetch_pinned_ca(base_url: str, fingerprint: str) -> bytes:
    """The swarm CA certificate, checked against the fingerprint from the invite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        # Unverified on purpose: we cannot trust the TLS chain before we have the CA,
        # and the pin check below is what makes this first answer trustworthy.
        doc = _call(requests.Session(), "GET", f"{base_url}/api/v1/ca", verify=False)
    pem = str(doc["certificate_pem"]).encode()
    cert = auth.load_certificate(pem)
    if auth.fingerprint(cert) != fingerprint.lower():
        raise PinMismatch(
            "the coordinator's CA does not match the invite's fingerprint: "
            "the invite is forged, or someone is in between"
        )
    return pem


def _csr_pem(private_key: Ed25519PrivateKey, wish: str) -> str:
    return auth.make_csr(private_key, wish).public_bytes(serialization.Encoding.PEM).decode()


def join(code: str, private_key: Ed25519PrivateKey) -> Joined:
    invite = InviteCode.decode(code)
    ca_pem = fetch_pinned_ca(invite.coordinator, invite.ca_fingerprint)
    csr = _csr_pem(private_key, "pending-node")
    with _ca_file(ca_pem) as ca_path:
        doc = _call(
            requests.Session(),
            "POST",
            f"{invite.coordinator}/api/v1/join",
            verify=ca_path,
            json={"secret": invite.secret, "csr_pem": csr},
        )
    cert_pem = str(doc["certificate_pem"]).encode()
    return Joined(
        str(doc["node_id"]),
        str(doc["role"]),
        cert_pem,
        ca_pem,
        str(doc["token"]),
        invite.coordinator,
    )


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


def _call(session: requests.Session, method: str, url: str, **kw: Any) -> Any:
    # Pass verify explicitly: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override
    # session.verify, which would silently swap our pinned swarm CA for system roots.
    kw.setdefault("verify", session.verify)
    kw.setdefault("timeout", TIMEOUT)
    try:
        r = session.request(method, url, **kw)
    except requests.exceptions.SSLError as exc:
        raise CoordinatorUnreachable(f"TLS with {url} failed: {exc}") from exc
    except requests.RequestException as exc:
        raise CoordinatorUnreachable(f"cannot reach the coordinator at {url}: {exc}") from exc
    if r.status_code >= 400:
        try:
            message = str(r.json().get("detail", r.text))
        except ValueError:
            message = r.text[:300]
        raise CoordinatorRefused(r.status_code, message)
    ctype = r.headers.get("content-type", "")
    return r.json() if ctype.startswith("application/json") else r.content


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

    def heartbeat(self, **report: Any) -> dict[str, Any]:
        result: dict[str, Any] = _call(
            self.session,
            "POST",
            f"{self.base_url}/api/v1/nodes/{self.node_id}/heartbeat",
            json=report,
        )
        return result

    def assignment(self) -> dict[str, Any] | None:
        doc = _call(self.session, "GET", f"{self.base_url}/api/v1/nodes/{self.node_id}/assignment")
        return doc if isinstance(doc, dict) else None

    def route(self, model: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = _call(
            self.session, "GET", f"{self.base_url}/api/v1/route", params={"model": model}
        )
        return result

    def manifest(self, manifest_url: str) -> Manifest:
        raw = _call(self.session, "GET", f"{self.base_url}{manifest_url}")
        text = json.dumps(raw) if isinstance(raw, dict) else bytes(raw).decode()
        return Manifest.from_json(text)

    def renew(self, private_key: Ed25519PrivateKey) -> bytes:
        doc = _call(
            self.session,
            "POST",
            f"{self.base_url}/api/v1/nodes/{self.node_id}/renew",
            json={"csr_pem": _csr_pem(private_key, self.node_id)},
        )
        return str(doc["certificate_pem"]).encode()

    def post_signal(self, peer: str, kind: str, link: str, payload: dict[str, Any]) -> None:
        """Send an ICE offer or answer to `peer` through the coordinator."""
        _call(
            self.session,
            "POST",
            f"{self.base_url}/api/v1/signal/{peer}",
            json={"kind": kind, "link": link, "payload": payload},
        )

    def signals(self, wait: float) -> list[dict[str, Any]]:
        """Messages for this node; the coordinator holds the request up to `wait` s."""
        result = _call(
            self.session,
            "GET",
            f"{self.base_url}/api/v1/signal",
            params={"wait": wait},
            timeout=wait + TIMEOUT,
        )
        return list(result) if isinstance(result, list) else []

    def turn(self) -> dict[str, Any] | None:
        """TURN credentials for this node, or None where the swarm has no relay."""
        try:
            result = _call(self.session, "GET", f"{self.base_url}/api/v1/turn")
        except CoordinatorRefused as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result) if isinstance(result, dict) else None

    def pieces_url(self, assignment: dict[str, Any]) -> str:
        return f"{self.base_url}{assignment['pieces_url']}"
