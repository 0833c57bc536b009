"""The client proof: a client's certificate and its signature over a fresh server nonce
and the hash of the server's certificate, sent in its first stream (stock aioquic servers
neither request nor verify client certificates)."""

from __future__ import annotations

import datetime as dt
import secrets
import struct
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from net.auth.certs import (
    CertifiedKey,
    NodeIdentity,
    Revoked,
    certificate_pem,
    ed25519_public_key,
    load_certificate,
)
from net.auth.errors import BadProof, InvalidArgument, UntrustedCertificate
from net.auth.verifying import verify_node_certificate

NONCE_SIZE: Final = 32
DIGEST_SIZE: Final = 32  # sha256 of the server certificate's DER
SIGNATURE_SIZE: Final = 64  # Ed25519
PROOF_MAX_BYTES: Final = 16 * 1024
PROOF_LABEL: Final = b"sangama-client-proof/1\x00"
"""Domain separation: a proof signature can never be mistaken for any other signature."""

_PROOF_HEADER: Final = struct.Struct("!BHH")  # version, certificate length, signature length
_PROOF_VERSION: Final = 1


def new_nonce() -> bytes:
    """A fresh server challenge; one per connection, never reused."""
    return secrets.token_bytes(NONCE_SIZE)


@dataclass(frozen=True)
class ClientProof:
    """What a client sends in its first stream: its certificate and a signature."""

    certificate_pem: bytes
    signature: bytes

    def __post_init__(self) -> None:
        if not self.certificate_pem:
            raise BadProof("proof carries no certificate")
        if len(self.signature) != SIGNATURE_SIZE:
            raise BadProof(
                f"proof signature is {len(self.signature)} bytes, Ed25519 needs {SIGNATURE_SIZE}"
            )
        size = _PROOF_HEADER.size + len(self.certificate_pem) + len(self.signature)
        if size > PROOF_MAX_BYTES:
            raise BadProof(f"proof is {size} bytes, over the {PROOF_MAX_BYTES}-byte cap")

    def encode(self) -> bytes:
        """version u8, certificate length u16, signature length u16, certificate, signature."""
        header = _PROOF_HEADER.pack(_PROOF_VERSION, len(self.certificate_pem), len(self.signature))
        return header + self.certificate_pem + self.signature

    @classmethod
    def decode(cls, data: bytes) -> ClientProof:
        """Inverse of `encode`; refuses oversize, truncated or trailing bytes with BadProof."""
        data = bytes(data)
        if len(data) > PROOF_MAX_BYTES:
            raise BadProof(f"proof is {len(data)} bytes, over the {PROOF_MAX_BYTES}-byte cap")
        if len(data) < _PROOF_HEADER.size:
            raise BadProof(f"proof is truncated: {len(data)} bytes, no complete header")
        version, cert_len, sig_len = _PROOF_HEADER.unpack_from(data)
        if version != _PROOF_VERSION:
            raise BadProof(f"proof version {version} is not supported (expected {_PROOF_VERSION})")
        expected = _PROOF_HEADER.size + cert_len + sig_len
        if len(data) != expected:
            raise BadProof(f"proof length {len(data)} does not match its header ({expected})")
        cert_end = _PROOF_HEADER.size + cert_len
        return cls(certificate_pem=data[_PROOF_HEADER.size : cert_end], signature=data[cert_end:])


def _proof_message(server_nonce: bytes, server_cert_der_sha256: bytes) -> bytes:
    # Fixed sizes make the concatenation unambiguous; the server hash stops a proof
    # made for one server being replayed to another, the nonce stops replay in time.
    if len(server_nonce) != NONCE_SIZE:
        raise InvalidArgument(f"server nonce must be {NONCE_SIZE} bytes, got {len(server_nonce)}")
    if len(server_cert_der_sha256) != DIGEST_SIZE:
        size = len(server_cert_der_sha256)
        raise InvalidArgument(f"server certificate hash must be {DIGEST_SIZE} bytes, got {size}")
    return PROOF_LABEL + server_nonce + server_cert_der_sha256


def make_client_proof(
    client: CertifiedKey, server_nonce: bytes, server_cert_der_sha256: bytes
) -> ClientProof:
    """Sign the server's nonce and certificate hash with the client's node key."""
    message = _proof_message(server_nonce, server_cert_der_sha256)
    return ClientProof(
        certificate_pem=certificate_pem(client.certificate),
        signature=client.private_key.sign(message),
    )


def verify_client_proof(
    proof: ClientProof,
    ca_cert: x509.Certificate,
    server_nonce: bytes,
    server_cert_der_sha256: bytes,
    *,
    expected_node_id: str | None = None,
    revoked: Revoked = (),
    now: dt.datetime | None = None,
) -> NodeIdentity:
    """Check the client's certificate like any node's, then its signature over our challenge."""
    message = _proof_message(server_nonce, server_cert_der_sha256)
    cert = load_certificate(proof.certificate_pem)
    identity = verify_node_certificate(
        cert, ca_cert, expected_node_id=expected_node_id, revoked=revoked, now=now
    )
    key = ed25519_public_key(cert)
    if key is None:  # already refused by the usage check; kept for the type checker
        raise UntrustedCertificate("node certificate key is not Ed25519")
    try:
        key.verify(proof.signature, message)
    except InvalidSignature:
        raise BadProof(
            f"proof signature of node {identity.node_id!r} does not verify: wrong nonce, "
            "made for another server, or signed by another key"
        ) from None
    return identity
