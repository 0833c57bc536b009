"""This node's identity after joining a swarm: certificate, CA, coordinator, secrets.

Public parts live in a directory (default: the user config dir); the private key and
the node token go to the OS keyring through `keyring`. Where no keyring backend exists
(headless servers, CI), they go to 0600 files beside the certificate, and the log says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.errors import ConfigError, IdentityTaken, NotJoined
from app.private_files import private_dir
from coordinator.client.session import CoordinatorClient, join
from coordinator.contract import JoinAnswer
from coordinator.invites import InviteCode, InviteUsedUp
from net import auth
from net.channel import NodeCredentials

log = logging.getLogger(__name__)

KEYRING_SERVICE = "sangama"
IDENTITY_FILE = "identity.json"
INVITE_KEY = "invite_sha256"
"""identity.json's record of the invite that made the identity: a hash, never the code
(the code is a secret; a copy on disk could be used again while uses remain)."""


def default_identity_dir() -> Path:
    return Path(platformdirs.user_config_dir("sangama")) / "identity"


def _keyring_usable() -> bool:
    try:
        import keyring
        from keyring.backends import fail

        return not isinstance(keyring.get_keyring(), fail.Keyring)
    except Exception:  # a broken keyring installation is the same as none
        return False


def secrets_place(directory: Path) -> str:
    """Where this identity's key and token are kept: "files" (0600 files in the identity
    folder, where no keyring was usable when it joined), "keyring", or "" before joining."""
    if (directory / "node-key.secret").exists() or (directory / "node-token.secret").exists():
        return "files"
    if (directory / IDENTITY_FILE).exists():
        return "keyring"
    return ""


def _store_secret(directory: Path, name: str, value: str) -> str:
    """Keep a secret; return where ("keyring" or a file path) for the log."""
    if _keyring_usable():
        import keyring

        try:
            keyring.set_password(KEYRING_SERVICE, f"{directory.resolve()}:{name}", value)
            return "keyring"
        except Exception as exc:  # locked or refusing backends: fall back, loudly
            log.warning("keyring refused to store %s (%s); using a 0600 file", name, exc)
    path = directory / f"{name}.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    log.info("no OS keyring available: %s kept in %s (mode 0600)", name, path)
    return str(path)


def _load_secret(directory: Path, name: str) -> str:
    path = directory / f"{name}.secret"
    if path.exists():
        return path.read_text().strip()
    if _keyring_usable():
        import keyring

        value = keyring.get_password(KEYRING_SERVICE, f"{directory.resolve()}:{name}")
        if value is not None:
            return value
    raise ConfigError(f"secret {name!r} of the identity in {directory} is missing")


@dataclass(frozen=True)
class Identity:
    directory: Path
    node_id: str
    role: str
    coordinator: str
    token: str
    certified: auth.CertifiedKey
    ca_pem: bytes

    @property
    def ca_path(self) -> Path:
        return self.directory / "ca.pem"

    def credentials(self, revoked: frozenset[int] = frozenset()) -> NodeCredentials:
        return NodeCredentials(self.certified, self.ca_pem, revoked)

    def client(self) -> CoordinatorClient:
        return CoordinatorClient(
            self.coordinator, self.node_id, self.token, self.ca_pem, self.ca_path
        )

    @staticmethod
    def load(directory: Path) -> Identity:
        if directory.is_dir():
            private_dir(directory)  # narrows a folder made world-listable by older versions
        if not (directory / IDENTITY_FILE).exists():
            raise NotJoined(
                f"not joined yet (no identity in {directory}): run sangama worker --join CODE "
                "with the code from your invite (a client invite: sangama chat --join CODE "
                '--prompt "...")'
            )
        try:
            doc = json.loads((directory / IDENTITY_FILE).read_text())
            cert = auth.load_certificate((directory / "node.pem").read_bytes())
            ca_pem = (directory / "ca.pem").read_bytes()
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"no joined identity in {directory}: {exc}") from exc
        key = auth.load_private_key(_load_secret(directory, "node-key").encode())
        return Identity(
            directory,
            doc["node_id"],
            doc["role"],
            doc["coordinator"],
            _load_secret(directory, "node-token"),
            auth.CertifiedKey(cert, key),
            ca_pem,
        )

    def with_coordinator(self, url: str | None) -> Identity:
        """This identity talking to `url` instead of the coordinator it joined (the
        coordinator moved; the CA, certificate and token stay valid). None or '': as joined."""
        if not url or not url.strip():
            return self
        return replace(self, coordinator=coordinator_url(url))

    def save_certificate(self, cert_pem: bytes) -> Identity:
        """After renewal: same key, new certificate."""
        (self.directory / "node.pem").write_bytes(cert_pem)
        cert = auth.load_certificate(cert_pem)
        return Identity(
            self.directory,
            self.node_id,
            self.role,
            self.coordinator,
            self.token,
            auth.CertifiedKey(cert, self.certified.private_key),
            self.ca_pem,
        )


def coordinator_url(text: str) -> str:
    """`text` as a coordinator base URL (`https://host:port`), or a ConfigError that says
    what is wrong with it in words."""
    problem = coordinator_problem(text)
    if problem is not None:
        raise ConfigError(f"The coordinator address {text.strip()!r} {problem}")
    return text.strip().rstrip("/")


def coordinator_problem(text: str) -> str | None:
    """What is wrong with `text` as a coordinator address (e.g. "must start with
    https://, like ..."), or None when it is usable."""
    url = text.strip().rstrip("/")
    like = "like https://swarm.example.org:8443"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number 0-65535
    except ValueError as exc:
        return f"is not valid ({exc}), {like}"
    # Always HTTPS: the node's token goes with every request, and the swarm CA is what the
    # client checks the coordinator against.
    if parts.scheme != "https":
        return f"must start with https://, {like}"
    if not parts.hostname or "@" in parts.netloc or any(c.isspace() for c in parts.netloc):
        return f"names no valid host, {like}"
    if port == 0:
        return f"has port 0, {like}"
    if parts.path or parts.query or parts.fragment:
        return f"has a path; only https://host:port, {like}"
    return None


def invite_digest(code: str) -> str:
    """Which invite made an identity, as identity.json keeps it: a hash of the code as it
    decodes (pasted spaces and line breaks do not count)."""
    return hashlib.sha256(
        b"sangama-identity-invite/1\0" + "".join(code.split()).encode()
    ).hexdigest()


def joined_with(directory: Path) -> tuple[str, str, str] | None:
    """(node id, role, invite digest) of the identity in `directory` ("" for the digest
    of one joined before identities kept it); None where nothing has joined there."""
    try:
        doc = json.loads((directory / IDENTITY_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the identity in {directory} is unreadable: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"the identity in {directory} is unreadable: not a JSON object")
    return str(doc.get("node_id", "")), str(doc.get("role", "")), str(doc.get(INVITE_KEY, ""))


def restart_command(role: str, directory: Path) -> str:
    """The command that runs the node of `role` whose identity is in `directory` again."""
    if role == "client":
        return f'sangama chat --identity {directory} --prompt "..."'
    return f"sangama worker --identity {directory}"


def join_or_resume(
    code: str, directory: Path, folder_flag: str = "--identity-dir"
) -> tuple[Identity, bool]:
    """The identity `code` made in `directory`, or a new one joined with it; and whether
    it was already there (a restart: the invite is not used again, so the command a
    volunteer first ran also restarts the node after Ctrl+C or a reboot).

    A folder holding another invite's node is refused (IdentityTaken) rather than
    overwritten, and an invite refused as used up says how a node that joined with it
    restarts; `folder_flag` is the command's option naming the folder."""
    held = joined_with(directory)
    if held is not None:
        node_id, role, digest = held
        if digest == invite_digest(code):
            return Identity.load(directory), True
        raise IdentityTaken(
            f"{directory} already holds node {node_id}, not joined with this invite: run "
            f"{restart_command(role, directory)} to use it, or add {folder_flag} NEW_FOLDER "
            "to join as a new node"
        )
    try:
        return join_swarm(code, directory), False
    except InviteUsedUp as exc:
        raise InviteUsedUp(
            f"{exc}: a PC that joined with it restarts with sangama worker --identity "
            "FOLDER (the folder it joined into); for a new node ask the operator for a new "
            "invite"
        ) from exc


def join_swarm(code: str, directory: Path | None = None) -> Identity:
    """Make a key pair, join with the invite code, keep everything; return the identity."""
    directory = directory or default_identity_dir()
    # 0700: the folder holds the node's key and token where no keyring exists, and who
    # the node is; no other account on the PC needs to list it.
    private_dir(directory)
    key: Ed25519PrivateKey = auth.new_private_key()
    invite = InviteCode.decode(code)
    joined: JoinAnswer = join(invite, key)
    (directory / "ca.pem").write_bytes(joined.ca_certificate_pem.encode())
    (directory / "node.pem").write_bytes(joined.certificate_pem.encode())
    _store_secret(directory, "node-key", auth.private_key_pem(key).decode())
    _store_secret(directory, "node-token", joined.token)
    (directory / IDENTITY_FILE).write_text(
        json.dumps(
            {
                "node_id": joined.node_id,
                "role": joined.role,
                "coordinator": invite.coordinator,
                INVITE_KEY: invite_digest(code),
            },
            indent=1,
        )
    )
    return Identity.load(directory)
