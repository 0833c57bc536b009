"""net.auth: swarm CA, node certificates, and the client proof; one refusal test per rule."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import stat
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings
from hypothesis import strategies as st

from net.auth import (
    PROOF_MAX_BYTES,
    AuthError,
    BadProof,
    BadSigningRequest,
    CertifiedKey,
    ClientProof,
    ExpiredCertificate,
    InvalidArgument,
    KeyMismatch,
    MalformedCertificate,
    NodeIdentity,
    RevokedCertificate,
    Role,
    UntrustedCertificate,
    WrongNodeId,
    certificate_chain_pem,
    certificate_digest,
    create_ca,
    fingerprint,
    issue_from_csr,
    issue_node_certificate,
    load_certificate,
    load_csr,
    load_private_key,
    make_client_proof,
    make_csr,
    new_nonce,
    new_private_key,
    private_key_pem,
    require_fingerprint,
    verify_client_proof,
    verify_node_certificate,
)

pytestmark = pytest.mark.unit

HOUR = dt.timedelta(hours=1)


def node(ca: CertifiedKey, node_id: str, role: str = "worker", hours: int = 24) -> CertifiedKey:
    key = new_private_key()
    cert = issue_node_certificate(ca, node_id, key.public_key(), role, hours)
    return CertifiedKey(certificate=cert, private_key=key)


@pytest.fixture(scope="module")
def ca() -> CertifiedKey:
    return create_ca("swarm-ca")


@pytest.fixture(scope="module")
def rogue_ca() -> CertifiedKey:
    # Same subject name as the real CA: only the signature check can tell them apart.
    return create_ca("swarm-ca")


@pytest.fixture(scope="module")
def worker(ca: CertifiedKey) -> CertifiedKey:
    return node(ca, "w1")


@pytest.fixture(scope="module")
def client(ca: CertifiedKey) -> CertifiedKey:
    return node(ca, "c1", role="client")


@pytest.fixture(scope="module")
def server_hash(worker: CertifiedKey) -> bytes:
    return certificate_digest(worker.certificate)


# ---------------------------------------------------------------- CA and node certificates


def test_ca_is_a_self_signed_ca_for_nodes_only(ca: CertifiedKey) -> None:
    cert = ca.certificate
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)
    assert isinstance(ca.private_key, ed25519.Ed25519PrivateKey)


def test_valid_node_verifies_and_yields_id_and_role(ca: CertifiedKey, worker: CertifiedKey) -> None:
    identity = verify_node_certificate(worker.certificate, ca.certificate, expected_node_id="w1")
    assert identity == NodeIdentity(
        node_id="w1",
        role=Role.WORKER,
        serial=worker.certificate.serial_number,
        not_after=worker.certificate.not_valid_after_utc,
        fingerprint=fingerprint(worker.certificate),
    )


def test_node_certificate_layout(ca: CertifiedKey) -> None:
    key = new_private_key()
    cert = issue_node_certificate(
        ca, "n7", key.public_key(), "coordinator", addresses=("10.0.0.7", "::1")
    )
    ou = cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [a.value for a in ou] == ["coordinator"]
    assert san.get_values_for_type(x509.DNSName) == ["n7"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7", "::1"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    identity = verify_node_certificate(cert, ca.certificate)
    assert identity.role is Role.COORDINATOR


def test_node_certificate_never_outlives_the_ca() -> None:
    short_ca = create_ca("short", days=1)
    cert = node(short_ca, "n1", hours=24 * 30).certificate
    assert cert.not_valid_after_utc <= short_ca.certificate.not_valid_after_utc


@pytest.mark.parametrize(
    ("node_id", "role", "hours", "addresses"),
    [
        ("", "worker", 1, ()),
        ("Upper", "worker", 1, ()),
        ("a b", "worker", 1, ()),
        ("-lead", "worker", 1, ()),
        ("x" * 64, "worker", 1, ()),
        ("n1", "admin", 1, ()),
        ("n1", "worker", 0, ()),
        ("n1", "worker", 1, ("not-an-ip",)),
    ],
)
def test_bad_issuing_arguments_are_refused(
    ca: CertifiedKey, node_id: str, role: str, hours: int, addresses: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidArgument):
        issue_node_certificate(ca, node_id, new_private_key().public_key(), role, hours, addresses)


def test_naive_now_is_refused(ca: CertifiedKey, worker: CertifiedKey) -> None:
    with pytest.raises(InvalidArgument, match="timezone"):
        verify_node_certificate(worker.certificate, ca.certificate, now=dt.datetime(2030, 1, 1))


# ---------------------------------------------------------------- refusals


def test_rogue_ca_with_the_same_subject_name_is_refused(
    ca: CertifiedKey, rogue_ca: CertifiedKey
) -> None:
    impostor = node(rogue_ca, "w1")
    assert impostor.certificate.issuer == ca.certificate.subject
    with pytest.raises(UntrustedCertificate, match="signature"):
        verify_node_certificate(impostor.certificate, ca.certificate, expected_node_id="w1")


def test_other_issuer_name_is_refused(ca: CertifiedKey) -> None:
    stranger = node(create_ca("elsewhere"), "w1")
    with pytest.raises(UntrustedCertificate, match="issued by"):
        verify_node_certificate(stranger.certificate, ca.certificate)


def test_expired_and_not_yet_valid_are_refused(ca: CertifiedKey) -> None:
    cert = node(ca, "w2", hours=1).certificate
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    verify_node_certificate(cert, ca.certificate, now=end - dt.timedelta(seconds=1))
    with pytest.raises(ExpiredCertificate, match="expired"):
        verify_node_certificate(cert, ca.certificate, now=end + HOUR)
    with pytest.raises(ExpiredCertificate, match="not valid before"):
        verify_node_certificate(cert, ca.certificate, now=start - HOUR)


def test_expired_ca_is_refused(ca: CertifiedKey, worker: CertifiedKey) -> None:
    later = ca.certificate.not_valid_after_utc + HOUR
    with pytest.raises(ExpiredCertificate, match="swarm CA"):
        verify_node_certificate(worker.certificate, ca.certificate, now=later)


def test_wrong_expected_id_is_refused(ca: CertifiedKey, worker: CertifiedKey) -> None:
    with pytest.raises(WrongNodeId, match="'w1', expected 'w9'"):
        verify_node_certificate(worker.certificate, ca.certificate, expected_node_id="w9")


def test_revoked_serial_and_fingerprint_are_refused(ca: CertifiedKey, worker: CertifiedKey) -> None:
    cert = worker.certificate
    for revoked in ({cert.serial_number}, frozenset({fingerprint(cert)})):
        with pytest.raises(RevokedCertificate):
            verify_node_certificate(cert, ca.certificate, revoked=revoked)
    verify_node_certificate(cert, ca.certificate, revoked={cert.serial_number + 1})


def test_ca_certificate_presented_as_a_node_is_refused(ca: CertifiedKey) -> None:
    # Self-issued and self-signed: it passes the trust checks, so the CA flag must stop it.
    with pytest.raises(UntrustedCertificate, match="CA certificate"):
        verify_node_certificate(ca.certificate, ca.certificate)


def test_node_certificate_as_trust_anchor_is_refused(worker: CertifiedKey) -> None:
    with pytest.raises(UntrustedCertificate, match="not a CA"):
        verify_node_certificate(worker.certificate, worker.certificate)


def test_certificate_without_eku_is_refused(ca: CertifiedKey) -> None:
    key = new_private_key()
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "n1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - HOUR)
        .not_valid_after(now + HOUR)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.private_key, None)
    )
    with pytest.raises(UntrustedCertificate, match="extended key usage"):
        verify_node_certificate(cert, ca.certificate)


def test_unparseable_certificates_are_malformed() -> None:
    for data in (b"", b"junk", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"):
        with pytest.raises(MalformedCertificate):
            load_certificate(data)


def test_pinned_fingerprint(ca: CertifiedKey, rogue_ca: CertifiedKey) -> None:
    pin = fingerprint(ca.certificate)
    assert (
        pin == hashlib.sha256(ca.certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
    )
    require_fingerprint(ca.certificate, pin.upper())
    with pytest.raises(UntrustedCertificate, match="pinned"):
        require_fingerprint(rogue_ca.certificate, pin)


# ---------------------------------------------------------------- CSR flow


def test_csr_flow_issues_the_coordinator_chosen_id(ca: CertifiedKey) -> None:
    key = new_private_key()
    csr = load_csr(
        make_csr(key, "i-want-to-be-the-coordinator").public_bytes(serialization.Encoding.PEM)
    )
    cert = issue_from_csr(ca, csr, "w42", "worker", hours=2)
    identity = verify_node_certificate(cert, ca.certificate, expected_node_id="w42")
    assert identity.role is Role.WORKER
    assert CertifiedKey(certificate=cert, private_key=key).certificate is cert


def test_csr_with_bad_signature_is_refused(ca: CertifiedKey) -> None:
    der = bytearray(make_csr(new_private_key(), "n1").public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01  # last byte of the signature
    with pytest.raises(BadSigningRequest):
        issue_from_csr(ca, load_csr(bytes(der)), "n1", "worker")


def test_unparseable_csr_is_refused() -> None:
    with pytest.raises(BadSigningRequest):
        load_csr(b"not a csr")


# ---------------------------------------------------------------- client proof


def test_proof_round_trip(ca: CertifiedKey, client: CertifiedKey, server_hash: bytes) -> None:
    nonce = new_nonce()
    assert len(nonce) == 32 and nonce != new_nonce()
    proof = ClientProof.decode(make_client_proof(client, nonce, server_hash).encode())
    identity = verify_client_proof(proof, ca.certificate, nonce, server_hash)
    assert (identity.node_id, identity.role) == ("c1", Role.CLIENT)


def test_proof_with_wrong_nonce_is_refused(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    proof = make_client_proof(client, new_nonce(), server_hash)
    with pytest.raises(BadProof, match="does not verify"):
        verify_client_proof(proof, ca.certificate, new_nonce(), server_hash)


def test_proof_replayed_to_another_server_is_refused(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    nonce = new_nonce()
    other_server = certificate_digest(node(ca, "w2").certificate)
    proof = make_client_proof(client, nonce, server_hash)
    with pytest.raises(BadProof):
        verify_client_proof(proof, ca.certificate, nonce, other_server)


def test_proof_signed_by_another_key_is_refused(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    nonce = new_nonce()
    thief = node(ca, "c2")  # a real member signing with its own key under c1's certificate
    signed = make_client_proof(thief, nonce, server_hash)
    forged = ClientProof(
        certificate_pem=make_client_proof(client, nonce, server_hash).certificate_pem,
        signature=signed.signature,
    )
    with pytest.raises(BadProof):
        verify_client_proof(forged, ca.certificate, nonce, server_hash)


def test_proof_with_certificate_from_another_ca_is_refused(
    ca: CertifiedKey, rogue_ca: CertifiedKey, server_hash: bytes
) -> None:
    nonce = new_nonce()
    proof = make_client_proof(node(rogue_ca, "c1", role="client"), nonce, server_hash)
    with pytest.raises(UntrustedCertificate):
        verify_client_proof(proof, ca.certificate, nonce, server_hash)


def test_proof_from_revoked_or_wrong_node_is_refused(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    nonce = new_nonce()
    proof = make_client_proof(client, nonce, server_hash)
    with pytest.raises(RevokedCertificate):
        verify_client_proof(
            proof,
            ca.certificate,
            nonce,
            server_hash,
            revoked={client.certificate.serial_number},
        )
    with pytest.raises(WrongNodeId):
        verify_client_proof(proof, ca.certificate, nonce, server_hash, expected_node_id="c9")


def test_tampered_proof_bytes_are_refused(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    nonce = new_nonce()
    wire = bytearray(make_client_proof(client, nonce, server_hash).encode())
    flipped_sig = bytearray(wire)
    flipped_sig[-1] ^= 0x80
    with pytest.raises(BadProof):
        verify_client_proof(
            ClientProof.decode(bytes(flipped_sig)), ca.certificate, nonce, server_hash
        )
    for broken in (bytes(wire[:-1]), bytes(wire) + b"\x00", b"\x02" + bytes(wire[1:]), b"\x01"):
        with pytest.raises(BadProof):
            ClientProof.decode(broken)
    garbled = ClientProof(certificate_pem=b"not a certificate", signature=bytes(64))
    with pytest.raises(MalformedCertificate):
        verify_client_proof(garbled, ca.certificate, nonce, server_hash)


def test_proof_shape_is_checked() -> None:
    with pytest.raises(BadProof, match="no certificate"):
        ClientProof(certificate_pem=b"", signature=bytes(64))
    with pytest.raises(BadProof, match="Ed25519"):
        ClientProof(certificate_pem=b"x", signature=bytes(63))
    with pytest.raises(BadProof, match="cap"):
        ClientProof(certificate_pem=bytes(PROOF_MAX_BYTES), signature=bytes(64))
    with pytest.raises(BadProof, match="cap"):
        ClientProof.decode(bytes(PROOF_MAX_BYTES + 1))


def test_challenge_sizes_are_checked(client: CertifiedKey, server_hash: bytes) -> None:
    with pytest.raises(InvalidArgument, match="nonce"):
        make_client_proof(client, b"short", server_hash)
    with pytest.raises(InvalidArgument, match="hash"):
        make_client_proof(client, new_nonce(), server_hash[:16])


@given(st.binary(max_size=PROOF_MAX_BYTES + 64))
@settings(max_examples=200, deadline=None)
def test_decode_of_arbitrary_bytes_raises_only_auth_errors(data: bytes) -> None:
    with contextlib.suppress(AuthError):
        ClientProof.decode(data)


@given(cert=st.binary(min_size=1, max_size=4096), signature=st.binary(min_size=64, max_size=64))
@settings(max_examples=100, deadline=None)
def test_proof_encoding_round_trips(cert: bytes, signature: bytes) -> None:
    proof = ClientProof(certificate_pem=cert, signature=signature)
    assert ClientProof.decode(proof.encode()) == proof


@pytest.mark.filterwarnings("ignore::cryptography.utils.CryptographyDeprecationWarning")
@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_damaged_certificates_raise_only_auth_errors(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes, data: st.DataObject
) -> None:
    # Near-valid DER reaches the lazily parsed fields that random bytes never do.
    der = bytearray(client.certificate.public_bytes(serialization.Encoding.DER))
    index = data.draw(st.integers(0, len(der) - 1))
    der[index] ^= data.draw(st.integers(1, 255))
    proof = ClientProof(certificate_pem=bytes(der), signature=bytes(64))
    with pytest.raises(AuthError):
        verify_client_proof(proof, ca.certificate, new_nonce(), server_hash)


@pytest.mark.filterwarnings("ignore::cryptography.utils.CryptographyDeprecationWarning")
def test_every_single_byte_damage_raises_only_auth_errors(
    ca: CertifiedKey, client: CertifiedKey, server_hash: bytes
) -> None:
    # Deterministic sweep (hypothesis once found a flipped version field that escaped).
    der = client.certificate.public_bytes(serialization.Encoding.DER)
    for index in range(len(der)):
        for mask in (0x01, 0x02, 0x80, 0xFF):
            damaged = bytearray(der)
            damaged[index] ^= mask
            proof = ClientProof(certificate_pem=bytes(damaged), signature=bytes(64))
            with pytest.raises(AuthError):
                verify_client_proof(proof, ca.certificate, new_nonce(), server_hash)


# ---------------------------------------------------------------- files and PEM


def test_save_and_load_round_trip(tmp_path: Path, worker: CertifiedKey) -> None:
    cert_path, key_path = worker.save(tmp_path / "keys", "node")
    assert (cert_path.name, key_path.name) == ("node.pem", "node.key")
    loaded = CertifiedKey.load(tmp_path / "keys", "node")
    assert loaded.certificate == worker.certificate
    assert private_key_pem(loaded.private_key) == private_key_pem(worker.private_key)
    worker.save(tmp_path / "keys", "node")  # overwriting (renewal) works
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["node.key", "node.pem"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_key_file_is_private(tmp_path: Path, worker: CertifiedKey) -> None:
    _, key_path = worker.save(tmp_path, "node")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_mismatched_key_is_refused(tmp_path: Path, worker: CertifiedKey) -> None:
    with pytest.raises(KeyMismatch):
        CertifiedKey(certificate=worker.certificate, private_key=new_private_key())
    worker.save(tmp_path, "node")
    (tmp_path / "node.key").write_bytes(private_key_pem(new_private_key()))
    with pytest.raises(KeyMismatch):
        CertifiedKey.load(tmp_path, "node")


def test_bad_key_pem_is_malformed() -> None:
    with pytest.raises(MalformedCertificate):
        load_private_key(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


def test_chain_pem_and_der_loading(ca: CertifiedKey, worker: CertifiedKey) -> None:
    chain = certificate_chain_pem(worker.certificate, ca.certificate)
    assert chain.count(b"BEGIN CERTIFICATE") == 2
    assert load_certificate(chain) == worker.certificate  # the first block is the node's
    der = worker.certificate.public_bytes(serialization.Encoding.DER)
    assert load_certificate(der) == worker.certificate
