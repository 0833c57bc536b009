"""A loopback HTTPS identity for test servers that stand in for public sites (a model's
mirror): a throwaway CA, and a certificate it issued for 127.0.0.1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from net import auth


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path
    """The CA's certificate: what a client verifies the server with."""

    @property
    def pair(self) -> tuple[Path, Path]:
        return self.cert, self.key


def loopback_tls(folder: Path) -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    ca = auth.create_ca("test-mirror-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = auth.issue_node_certificate(
        ca, "mirror", key.public_key(), "coordinator", hours=2, addresses=("127.0.0.1",)
    )
    paths = TlsFiles(folder / "mirror.pem", folder / "mirror.key", folder / "ca.pem")
    paths.cert.write_bytes(auth.certificate_chain_pem(cert, ca.certificate))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths.ca.write_bytes(ca.certificate.public_bytes(serialization.Encoding.PEM))
    return paths
