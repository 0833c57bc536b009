"""Issuing: the swarm CA, node certificates and signing requests (the coordinator's side).

Certificate layout (what net.auth.verifying relies on):

- every key is Ed25519 (the CA's and the nodes'), so proofs need no algorithm choice;
- subject CN = node id, and the SAN carries DNSName(node id) (aioquic matches the
  client's `server_name` against the SAN) plus any IP addresses given;
- the role ("worker", "client" or "coordinator") is the subject's single
  organizationalUnitName (OU) attribute;
- BasicConstraints ca=False, EKU serverAuth + clientAuth (every node may do both).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from net.auth.certs import CertifiedKey, Role, new_private_key, utc_now
from net.auth.errors import BadSigningRequest, InvalidArgument

# Backdating absorbs small clock differences between the coordinator and the nodes.
CLOCK_SKEW: Final = dt.timedelta(minutes=5)

# DNS-label shaped, lowercase: the id goes into a SAN DNSName that TLS compares
# case-insensitively, so two ids differing only in case must not both exist.
_NODE_ID_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?")


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
    start = utc_now(now) - CLOCK_SKEW
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
    start = utc_now(now) - CLOCK_SKEW
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
