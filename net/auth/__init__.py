"""Swarm CA, node certificates and the application-layer client proof
(docs/architecture.md, "Trust").

TLS authenticates the server: its certificate chains to the swarm CA and names the
expected node id. Stock aioquic servers neither request nor verify client
certificates, so the client proves itself in its first stream instead: it sends its
certificate and an Ed25519 signature over a fresh server nonce and the hash of the
server's certificate (`make_client_proof` / `verify_client_proof`).

Certificate layout (what `verify_node_certificate` relies on):

- every key is Ed25519 (the CA's and the nodes'), so proofs need no algorithm choice;
- subject CN = node id, and the SAN carries DNSName(node id) (aioquic matches the
  client's `server_name` against the SAN) plus any IP addresses given;
- the role ("worker", "client" or "coordinator") is the subject's single
  organizationalUnitName (OU) attribute;
- BasicConstraints ca=False, EKU serverAuth + clientAuth (every node may do both).

Revocation lists hold serial numbers (int) and/or fingerprints (lowercase sha256 hex
of the DER, `fingerprint`). Every deliberate refusal is an `AuthError` subclass.

Callers import from here; each job has its own module: net.auth.errors (the refusals),
net.auth.certs (roles, key material, PEM/DER), net.auth.issuing (the CA's side),
net.auth.verifying (checking a certificate) and net.auth.proof (the client proof).
"""

from __future__ import annotations

from net.auth.certs import (
    CertifiedKey,
    NodeIdentity,
    Revoked,
    Role,
    certificate_chain_pem,
    certificate_digest,
    certificate_pem,
    fingerprint,
    load_certificate,
    load_private_key,
    new_private_key,
    private_key_pem,
    require_fingerprint,
)
from net.auth.errors import (
    AuthError,
    BadProof,
    BadSigningRequest,
    ExpiredCertificate,
    InvalidArgument,
    KeyMismatch,
    MalformedCertificate,
    RevokedCertificate,
    UntrustedCertificate,
    WrongNodeId,
)
from net.auth.issuing import (
    CLOCK_SKEW,
    create_ca,
    issue_from_csr,
    issue_node_certificate,
    load_csr,
    make_csr,
)
from net.auth.proof import (
    DIGEST_SIZE,
    NONCE_SIZE,
    PROOF_LABEL,
    PROOF_MAX_BYTES,
    SIGNATURE_SIZE,
    ClientProof,
    make_client_proof,
    new_nonce,
    verify_client_proof,
)
from net.auth.verifying import (
    node_id_of,
    verify_node_certificate,
)

__all__ = [
    "CLOCK_SKEW",
    "DIGEST_SIZE",
    "NONCE_SIZE",
    "PROOF_LABEL",
    "PROOF_MAX_BYTES",
    "SIGNATURE_SIZE",
    "AuthError",
    "BadProof",
    "BadSigningRequest",
    "CertifiedKey",
    "ClientProof",
    "ExpiredCertificate",
    "InvalidArgument",
    "KeyMismatch",
    "MalformedCertificate",
    "NodeIdentity",
    "Revoked",
    "RevokedCertificate",
    "Role",
    "UntrustedCertificate",
    "WrongNodeId",
    "certificate_chain_pem",
    "certificate_digest",
    "certificate_pem",
    "create_ca",
    "fingerprint",
    "issue_from_csr",
    "issue_node_certificate",
    "load_certificate",
    "load_csr",
    "load_private_key",
    "make_client_proof",
    "make_csr",
    "new_nonce",
    "new_private_key",
    "node_id_of",
    "private_key_pem",
    "require_fingerprint",
    "verify_client_proof",
    "verify_node_certificate",
]
