"""Node credentials on disk: the swarm CA certificate plus this node's certificate and key.

Layout of a credentials directory: `ca.pem`, `<node_id>.pem`, `<node_id>.key` (0600);
the CA's own key (`ca.key`) lives only where the CA was created.
"""

from __future__ import annotations

from pathlib import Path

from app.errors import ConfigError
from net import auth
from net.channel import NodeCredentials

CA_STEM = "ca"


def init_ca(directory: Path, name: str = "sangama-swarm") -> auth.CertifiedKey:
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / f"{CA_STEM}.key").exists():
        raise ConfigError(f"{directory} already holds a CA; refusing to overwrite it")
    ca = auth.create_ca(name)
    ca.save(directory, CA_STEM)
    return ca


def issue_node(
    ca_dir: Path,
    node_id: str,
    role: str = "worker",
    out_dir: Path | None = None,
    hours: int = 24 * 7,
) -> Path:
    """Issue `node_id` a certificate from the CA in `ca_dir`; write a credentials dir."""
    try:
        ca = auth.CertifiedKey.load(ca_dir, CA_STEM)
    except (OSError, auth.AuthError) as exc:
        raise ConfigError(f"no usable CA in {ca_dir}: {exc}") from exc
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role, hours=hours)
    out = out_dir or ca_dir
    out.mkdir(parents=True, exist_ok=True)
    auth.CertifiedKey(cert, key).save(out, node_id)
    ca_pem = auth.certificate_pem(ca.certificate)
    if not (out / f"{CA_STEM}.pem").exists():
        (out / f"{CA_STEM}.pem").write_bytes(ca_pem)
    return out


def load_credentials(directory: Path, node_id: str) -> NodeCredentials:
    try:
        certified = auth.CertifiedKey.load(directory, node_id)
        ca_pem = (directory / f"{CA_STEM}.pem").read_bytes()
        auth.verify_node_certificate(
            certified.certificate, auth.load_certificate(ca_pem), expected_node_id=node_id
        )
    except OSError as exc:
        raise ConfigError(f"credentials for {node_id} missing in {directory}: {exc}") from exc
    except auth.AuthError as exc:
        raise ConfigError(f"credentials for {node_id} in {directory} are not valid: {exc}") from exc
    return NodeCredentials(certified, ca_pem)
