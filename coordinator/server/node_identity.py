"""Who a node is: the swarm CA issues its certificate when it joins with an invite and
again when it renews; its node token authenticates every later call; the operator's
revocation ends both; the relay's credentials are made out in its name. The invite's
use and the new node's rows are invite_book.py's.
"""

from __future__ import annotations

import hmac
import logging

from cryptography import x509

from coordinator.contract import JoinAnswer, TurnAnswer
from coordinator.errors import AccessDenied, JoinRefused, NotFound
from coordinator.server.invite_book import redeem_invite
from coordinator.server.secret_hashes import hash_token
from coordinator.server.store import Node, Store, utcnow
from coordinator.server.timeline import Timeline
from net import auth
from net.ice.turn import node_credentials, stun_uri, turn_uri

log = logging.getLogger(__name__)

NODE_CERT_HOURS = 24


class Identities:
    """The CA's side of joining, authenticating, renewing and revoking nodes."""

    def __init__(self, store: Store, ca: auth.CertifiedKey, timeline: Timeline) -> None:
        self._store = store
        self._ca = ca
        self._timeline = timeline
        self.ca_pem = auth.certificate_pem(ca.certificate).decode()
        self.ca_fingerprint = auth.fingerprint(ca.certificate)

    def join(self, secret: str, csr_pem: str) -> JoinAnswer:
        """A new node: one use of the invite with `secret` taken, a certificate for the
        key in `csr_pem`, a node token; JoinRefused or an InviteError otherwise."""
        now = utcnow()
        csr = _signing_request(csr_pem)

        def issue(node_id: str, role: str) -> x509.Certificate:
            return auth.issue_from_csr(self._ca, csr, node_id, role, hours=NODE_CERT_HOURS)

        joined = redeem_invite(self._store, secret, now, issue)
        log.info("node %s joined as %s", joined.node_id, joined.role)
        named = f" ({joined.name})" if joined.name else ""
        detail = f"as {joined.role} with invite #{joined.invite_id}{named}"
        self._timeline.record("joined", joined.node_id, detail)
        return self._answer(joined.node_id, joined.role, joined.certificate, joined.token)

    def authenticate(self, node_id: str, token: str) -> Node:
        """The node whose id and token these are; AccessDenied for a wrong pair, a
        forgotten node or a revoked one."""
        node = self._store.node(node_id)
        if node is None or not hmac.compare_digest(node.token_hash, hash_token(token)):
            raise AccessDenied("unknown node or wrong node token")
        if node.forgotten_at is not None:
            raise AccessDenied(
                f"node {node_id} was forgotten by the operator: join again with a new invite"
            )
        if node.revoked:
            raise AccessDenied(f"node {node_id} was revoked by the operator")
        return node

    def renew(self, node: Node, token: str, csr_pem: str) -> JoinAnswer:
        """A fresh certificate for an authenticated node (its token unchanged)."""
        csr = _signing_request(csr_pem)
        cert = auth.issue_from_csr(self._ca, csr, node.node_id, node.role, hours=NODE_CERT_HOURS)
        self._store.add_certificate(node.node_id, cert.serial_number, cert.not_valid_after_utc)
        return self._answer(node.node_id, node.role, cert, token)

    def revoke(self, node_id: str) -> None:
        """The node and its certificates revoked; NotFound for an unknown node."""
        if not self._store.revoke_node(node_id):
            raise NotFound(f"no node {node_id}")

    def _answer(self, node_id: str, role: str, cert: x509.Certificate, token: str) -> JoinAnswer:
        return JoinAnswer(
            node_id,
            role,
            auth.certificate_pem(cert).decode(),
            self.ca_pem,
            token,
            cert.not_valid_after_utc,
        )


def relay_credentials(
    server: tuple[str, int] | None, secret: str, ttl_s: int, node_id: str, now: float
) -> TurnAnswer | None:
    """coturn REST credentials for a joined node on the swarm's relay `server`, or None
    where there is no relay."""
    if server is None or not secret:
        return None
    host, port = server
    # One username per node and window: coturn's per-user quota holds per node.
    uris = (turn_uri(host, port), stun_uri(host, port))
    creds = node_credentials(secret, node_id, ttl_s, now, uris)
    return TurnAnswer(host, port, creds.username, creds.password, creds.ttl_s, tuple(creds.uris))


def _signing_request(csr_pem: str) -> x509.CertificateSigningRequest:
    try:
        return auth.load_csr(csr_pem.encode())
    except auth.AuthError as exc:
        raise JoinRefused(f"bad signing request: {exc}") from exc
