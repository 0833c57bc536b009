"""Verifying a node certificate against the swarm CA, and saying whom it names.

Revocation lists hold serial numbers (int) and/or fingerprints (lowercase sha256 hex
of the DER, `fingerprint`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from net.auth.certs import NodeIdentity, Revoked, Role, ed25519_public_key, fingerprint, utc_now
from net.auth.errors import (
    AuthError,
    ExpiredCertificate,
    MalformedCertificate,
    RevokedCertificate,
    UntrustedCertificate,
    WrongNodeId,
)

_T = TypeVar("_T")


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
    at = utc_now(now)
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
    if ed25519_public_key(cert) is None:
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
