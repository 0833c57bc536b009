"""The refusals of net.auth: every deliberate one is an `AuthError` subclass."""

from __future__ import annotations

from net.errors import NetError


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
