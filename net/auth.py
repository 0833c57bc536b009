"""Swarm CA, node certificates and the application-layer client proof (DESIGN §5, §6).

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
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import re
import secrets
import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from net.errors import NetError

# ---------------------------------------------------------------- errors


class AuthError(NetError):
    """Base of every refusal raised on purpose by this module."""


class InvalidArgument(AuthError, ValueError):
    """A local caller passed something unusable (bad node id, role, nonce size, naive time)."""


class MalformedCertificate(AuthError):
    """Bytes that should hold a certificate or private key do not parse."""


class KeyMismatch(MalformedCertificate):
    """A private key was paired with a certificate for another key."""


class BadSigningRequest(AuthError):
    """A certificate signing request does not parse, or its signature does not verify."""


class UntrustedCertificate(AuthError):
    """Not issued by the swarm CA (wrong issuer or bad signature), or not a node certificate."""


class ExpiredCertificate(AuthError):
    """Outside its validity window: expired, or not yet valid."""


class WrongNodeId(AuthError):
    """A valid certificate, but for another node than the one expected."""


class RevokedCertificate(AuthError):
    """A valid certificate whose serial or fingerprint is on the revocation list."""


class BadProof(AuthError):
    """A client proof does not frame correctly or its signature does not verify."""


# ---------------------------------------------------------------- constants and small types


class Role(StrEnum):
    WORKER = "worker"
    CLIENT = "client"
    COORDINATOR = "coordinator"


NONCE_SIZE: Final = 32
DIGEST_SIZE: Final = 32  # sha256 of the server certificate's DER
SIGNATURE_SIZE: Final = 64  # Ed25519
PROOF_MAX_BYTES: Final = 16 * 1024
PROOF_LABEL: Final = b"sangama-client-proof/1\x00"
"""Domain separation: a proof signature can never be mistaken for any other signature."""

# Backdating absorbs small clock differences between the coordinator and the nodes.
CLOCK_SKEW: Final = dt.timedelta(minutes=5)

# DNS-label shaped, lowercase: the id goes into a SAN DNSName that TLS compares
# case-insensitively, so two ids differing only in case must not both exist.
_NODE_ID_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?")

_PROOF_HEADER: Final = struct.Struct("!BHH")  # version, certificate length, signature length
_PROOF_VERSION: Final = 1

Revoked = Collection[int | str]
"""Serial numbers (int) and/or lowercase sha256-hex fingerprints (str)."""

_T = TypeVar("_T")


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


def _ed25519_public_key(cert: x509.Certificate) -> ed25519.Ed25519PublicKey | None:
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
        public = _ed25519_public_key(self.certificate)
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


# ---------------------------------------------------------------- issuing


def _utc_now(now: dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(dt.UTC)
    if now.tzinfo is None:
        raise InvalidArgument("times must be timezone-aware (UTC)")
    return now


def _check_node_id(node_id: str) -> str:
    if not _NODE_ID_RE.fullmatch(node_id):
        raise InvalidArgument(
            f"node id {node_id!r} must be 1-63 lowercase letters, digits, '-' or '.', "
            "starting and ending with a letter or digit"
        )
    return node_id


def _check_role(role: str) -> Role:
    try:
        return Role(role)
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise InvalidArgument(f"role {role!r} is not one of {known}") from None


def _ip_addresses(addresses: tuple[str, ...]) -> list[x509.GeneralName]:
    try:
        return [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    except ValueError as exc:
        raise InvalidArgument(f"bad IP address in {addresses!r}: {exc}") from exc


def create_ca(name: str, days: int = 3650, *, now: dt.datetime | None = None) -> CertifiedKey:
    """A new self-signed swarm CA that may sign node certificates only (path length 0)."""
    if days <= 0:
        raise InvalidArgument(f"CA lifetime must be positive, got {days} days")
    start = _utc_now(now) - CLOCK_SKEW
    key = new_private_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return CertifiedKey(certificate=builder.sign(key, None), private_key=key)


def issue_node_certificate(
    ca: CertifiedKey,
    node_id: str,
    public_key: ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey,
    role: str,
    hours: int = 24 * 7,
    addresses: tuple[str, ...] = (),
    *,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """Sign a short-lived node certificate (layout in the module docstring).

    Nodes use Ed25519; only the coordinator's HTTPS certificate takes an ECDSA P-256 key,
    because browsers refuse Ed25519 server keys (verify_node_certificate still requires
    Ed25519 for nodes)."""
    node_id, parsed_role = _check_node_id(node_id), _check_role(role)
    if hours <= 0:
        raise InvalidArgument(f"certificate lifetime must be positive, got {hours} hours")
    start = _utc_now(now) - CLOCK_SKEW
    # Never outlive the CA: peers would refuse the CA first anyway.
    end = min(start + CLOCK_SKEW + dt.timedelta(hours=hours), ca.certificate.not_valid_after_utc)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, node_id),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, parsed_role.value),
        ]
    )
    san = x509.SubjectAlternativeName([x509.DNSName(node_id), *_ip_addresses(addresses)])
    eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(san, critical=False)
        .add_extension(eku, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.private_key.public_key()),
            critical=False,
        )
    )
    return builder.sign(ca.private_key, None)


def make_csr(
    private_key: ed25519.Ed25519PrivateKey, node_id: str
) -> x509.CertificateSigningRequest:
    """A signing request proving possession of `private_key`; the id is only a wish."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(private_key, None)


def load_csr(pem_or_der: bytes) -> x509.CertificateSigningRequest:
    data = bytes(pem_or_der)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_csr(data)
        return x509.load_der_x509_csr(data)
    except ValueError as exc:
        raise BadSigningRequest(f"not a signing request in PEM or DER: {exc}") from exc


def issue_from_csr(
    ca: CertifiedKey,
    csr: x509.CertificateSigningRequest,
    node_id: str,
    role: str,
    hours: int = 24 * 7,
    addresses: tuple[str, ...] = (),
    *,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """Certify the CSR's key under the coordinator-chosen `node_id`; the CSR subject is ignored."""
    try:
        valid = csr.is_signature_valid
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise BadSigningRequest(f"signing request cannot be checked: {exc}") from exc
    if not valid:
        raise BadSigningRequest("signing request signature does not verify")
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise BadSigningRequest(f"signing request key is {type(key).__name__}, not Ed25519")
    return issue_node_certificate(ca, node_id, key, role, hours, addresses, now=now)


# ---------------------------------------------------------------- verifying


def verify_node_certificate(
    cert: x509.Certificate,
    ca_cert: x509.Certificate,
    *,
    expected_node_id: str | None = None,
    revoked: Revoked = (),
    now: dt.datetime | None = None,
) -> NodeIdentity:
    """Check a node certificate against the swarm CA and say whom it names.

    Order matters: trust (issuer and signature) first, so nothing an attacker wrote is
    interpreted before we know the CA signed it.
    """
    at = _utc_now(now)
    return _parsing(lambda: _verify(cert, ca_cert, expected_node_id, revoked, at))


def _parsing(fn: Callable[[], _T]) -> _T:
    # cryptography parses names and extensions lazily: a damaged field surfaces as
    # ValueError on first access, which is a malformed certificate, not a crash.
    try:
        return fn()
    except AuthError:
        raise
    except (ValueError, UnsupportedAlgorithm, x509.InvalidVersion) as exc:
        raise MalformedCertificate(f"certificate has a field that does not parse: {exc}") from exc


def _verify(
    cert: x509.Certificate,
    ca_cert: x509.Certificate,
    expected_node_id: str | None,
    revoked: Revoked,
    at: dt.datetime,
) -> NodeIdentity:
    _check_trust_anchor(ca_cert, at)
    _check_signed_by(cert, ca_cert)
    _check_node_usage(cert)
    _check_window(cert, at, "certificate")
    node_id, role = _node_id(cert), _role(cert)
    if expected_node_id is not None and node_id != expected_node_id:
        raise WrongNodeId(f"certificate names node {node_id!r}, expected {expected_node_id!r}")
    identity = NodeIdentity(
        node_id=node_id,
        role=role,
        serial=cert.serial_number,
        not_after=cert.not_valid_after_utc,
        fingerprint=fingerprint(cert),
    )
    if identity.serial in revoked or identity.fingerprint in revoked:
        raise RevokedCertificate(
            f"certificate of node {node_id!r} (serial {identity.serial:x}) is revoked"
        )
    return identity


def _check_trust_anchor(ca_cert: x509.Certificate, at: dt.datetime) -> None:
    if not _basic_constraints(ca_cert).ca:
        raise UntrustedCertificate("the trust anchor given is not a CA certificate")
    _check_window(ca_cert, at, "swarm CA certificate")


def _check_signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> None:
    if cert.issuer != ca_cert.subject:
        raise UntrustedCertificate(
            f"issued by {cert.issuer.rfc4514_string()!r}, "
            f"not by the swarm CA {ca_cert.subject.rfc4514_string()!r}"
        )
    # Same issuer name proves nothing (anyone can make a CA with that name): the
    # signature under the CA's public key is what counts.
    try:
        cert.verify_directly_issued_by(ca_cert)
    except InvalidSignature:
        raise UntrustedCertificate(
            "signature does not verify with the swarm CA key (a different CA of the same name?)"
        ) from None
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UntrustedCertificate(f"signature cannot be checked: {exc}") from exc


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise UntrustedCertificate("certificate has no basic constraints") from None


def _check_node_usage(cert: x509.Certificate) -> None:
    if _basic_constraints(cert).ca:
        raise UntrustedCertificate("a CA certificate cannot act as a node certificate")
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise UntrustedCertificate("certificate has no extended key usage") from None
    needed = {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    if not needed <= set(eku):
        raise UntrustedCertificate("certificate is not for TLS server and client use")
    if _ed25519_public_key(cert) is None:
        raise UntrustedCertificate("node certificate key is not Ed25519")


def _check_window(cert: x509.Certificate, at: dt.datetime, what: str) -> None:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if at < start:
        raise ExpiredCertificate(f"{what} is not valid before {start.isoformat()} (now {at})")
    if at > end:
        raise ExpiredCertificate(f"{what} expired at {end.isoformat()} (now {at})")


def _single_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise UntrustedCertificate(f"certificate subject must hold exactly one {what}")
    return values[0].value


def _node_id(cert: x509.Certificate) -> str:
    node_id = _single_attribute(cert, NameOID.COMMON_NAME, "common name (node id)")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise UntrustedCertificate("certificate has no subject alternative name") from None
    # TLS checks the SAN, we check the CN: they must agree or the two layers disagree on who.
    if node_id not in san.get_values_for_type(x509.DNSName):
        raise UntrustedCertificate(f"node id {node_id!r} is not among the certificate's DNS names")
    return node_id


def node_id_of(cert: x509.Certificate) -> str:
    """The node id a certificate names (its CN, which must agree with its SAN)."""
    return _node_id(cert)


def _role(cert: x509.Certificate) -> Role:
    value = _single_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "role (OU)")
    try:
        return Role(value)
    except ValueError:
        raise UntrustedCertificate(f"certificate carries unknown role {value!r}") from None


# ---------------------------------------------------------------- client proof


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
    key = _ed25519_public_key(cert)
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
