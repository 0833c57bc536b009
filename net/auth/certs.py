"""Node identities and key material: roles, PEM/DER in and out, a certificate with its key.

What net.auth.issuing, net.auth.verifying and net.auth.proof share; nothing here decides
whom to trust.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from net.auth.errors import InvalidArgument, KeyMismatch, MalformedCertificate, UntrustedCertificate


class Role(StrEnum):
    WORKER = "worker"
    CLIENT = "client"
    COORDINATOR = "coordinator"


Revoked = Collection[int | str]
"""Serial numbers (int) and/or lowercase sha256-hex fingerprints (str)."""


@dataclass(frozen=True)
class NodeIdentity:
    """Who a verified certificate names."""

    node_id: str
    role: Role
    serial: int
    not_after: dt.datetime
    fingerprint: str


# ---------------------------------------------------------------- PEM / DER helpers


def certificate_digest(cert: x509.Certificate) -> bytes:
    """sha256 of the DER: the server hash a client proof is bound to."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest()


def fingerprint(cert: x509.Certificate) -> str:
    """Lowercase sha256 hex of the DER; invites pin the CA by this."""
    return certificate_digest(cert).hex()


def require_fingerprint(cert: x509.Certificate, expected: str) -> None:
    """Refuse a CA certificate whose fingerprint is not the pinned one (first contact)."""
    if not secrets.compare_digest(fingerprint(cert), expected.strip().lower()):
        raise UntrustedCertificate(
            f"certificate fingerprint {fingerprint(cert)} is not the pinned {expected}"
        )


def load_certificate(pem_or_der: bytes) -> x509.Certificate:
    """Parse one certificate, PEM (first block) or DER."""
    data = bytes(pem_or_der)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            cert = x509.load_pem_x509_certificate(data)
        else:
            cert = x509.load_der_x509_certificate(data)
    except (ValueError, x509.InvalidVersion) as exc:
        raise MalformedCertificate(f"not a certificate in PEM or DER: {exc}") from exc
    if cert.serial_number <= 0:
        # RFC 5280 forbids it and newer cryptography releases refuse to load it.
        raise MalformedCertificate("certificate serial number is not positive")
    return cert


def certificate_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def certificate_chain_pem(cert: x509.Certificate, ca_cert: x509.Certificate) -> bytes:
    """Node certificate then CA certificate, the order TLS chain files expect."""
    return certificate_pem(cert) + certificate_pem(ca_cert)


def private_key_pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    """Unencrypted PKCS#8: at rest it lives in a 0600 file or the OS keyring."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> ed25519.Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(bytes(pem), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        # TypeError: the key is password-protected; we never write such keys.
        raise MalformedCertificate(f"not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise MalformedCertificate(f"private key is {type(key).__name__}, not Ed25519")
    return key


def new_private_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def _raw(key: ed25519.Ed25519PublicKey) -> bytes:
    return key.public_bytes_raw()


def ed25519_public_key(cert: x509.Certificate) -> ed25519.Ed25519PublicKey | None:
    """The certificate's key if it is Ed25519 (the only kind nodes use), else None."""
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return None
    return key if isinstance(key, ed25519.Ed25519PublicKey) else None


# ---------------------------------------------------------------- certified keys


@dataclass(frozen=True)
class CertifiedKey:
    """A certificate and the private key it certifies (checked to belong together)."""

    certificate: x509.Certificate
    private_key: ed25519.Ed25519PrivateKey

    def __post_init__(self) -> None:
        public = ed25519_public_key(self.certificate)
        if public is None or _raw(public) != _raw(self.private_key.public_key()):
            raise KeyMismatch("the private key does not belong to the certificate")

    def save(self, directory: Path | str, stem: str) -> tuple[Path, Path]:
        """Write `stem.pem` (certificate) and `stem.key` (mode 0600); return both paths."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
        _write_atomic(key_path, private_key_pem(self.private_key), mode=0o600)
        _write_atomic(cert_path, certificate_pem(self.certificate), mode=0o644)
        return cert_path, key_path

    @classmethod
    def load(cls, directory: Path | str, stem: str) -> CertifiedKey:
        """Read what `save` wrote; OSError if a file is missing, MalformedCertificate if bad."""
        folder = Path(directory)
        cert = load_certificate((folder / f"{stem}.pem").read_bytes())
        key = load_private_key((folder / f"{stem}.key").read_bytes())
        return cls(certificate=cert, private_key=key)


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    # A temp file created with the final mode, then renamed: the key is never readable
    # by others, not even briefly, and a crash never leaves half a key behind.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)  # the umask may have narrowed or (on odd systems) ignored it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def utc_now(now: dt.datetime | None) -> dt.datetime:
    """`now`, or the current time when None; a naive time is refused (never guess a zone)."""
    if now is None:
        return dt.datetime.now(dt.UTC)
    if now.tzinfo is None:
        raise InvalidArgument("times must be timezone-aware (UTC)")
    return now
