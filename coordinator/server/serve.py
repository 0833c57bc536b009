"""`sangama coordinator`: open the database, the CA and the model, then serve HTTPS."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from coordinator.errors import ModelNotHostable
from coordinator.server.answer_probe import AnswerState, ProbePolicy
from coordinator.server.answer_prober import AnswerProber, probe_credentials
from coordinator.server.models import HostedModel, check_names
from coordinator.server.remote_model import is_url, register
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import ADMIN_PASSWORD, Coordinator, CoordinatorSettings
from coordinator.server.store import Store, migrate
from core.errors import CoreError, SplitShardError
from core.model_inputs import model_file, pieces_manifest
from core.models import BUNDLED_MODELS, DEFAULT_MODEL, sliced_model
from net import auth

log = logging.getLogger(__name__)

ADMIN_TOKEN_FILE = "admin-token"
ADMIN_PASSWORD_FILE = "admin-password"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("sangama")) / "coordinator"


def default_db_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'coordinator.db'}"


@dataclass(frozen=True)
class CoordinatorOptions:
    host: str = "127.0.0.1"
    port: int = 8443
    data_dir: Path = field(default_factory=default_data_dir)
    db_url: str | None = None
    model: str = "default"
    more_models: tuple[str, ...] = ()
    """Models hosted beside `model` (repeated `--model`); `model` is the default one."""
    public_url: str | None = None
    admin_password: str | None = None
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    answer_probe_every_s: float = 45.0
    """How often the planned chain is asked for two tokens (answer_prober.py); 0: never."""
    keep_pieces: bool = False
    """For a model registered by URL: keep a copy of its pieces (the coordinator then
    serves a volunteer whose mirror fails from disk, not through the mirror)."""


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def load_or_create_ca(data_dir: Path) -> auth.CertifiedKey:
    ca_dir = data_dir / "ca"
    if (ca_dir / "ca.key").exists():
        return auth.CertifiedKey.load(ca_dir, "ca")
    ca = auth.create_ca("sangama-swarm")
    ca.save(ca_dir, "ca")
    log.info("created a new swarm CA in %s", ca_dir)
    return ca


def https_identity(ca: auth.CertifiedKey, data_dir: Path, host: str) -> tuple[Path, Path]:
    """A certificate from the swarm CA for the coordinator's own HTTPS (renewed each start).

    ECDSA P-256, not Ed25519 like the nodes: browsers refuse Ed25519 server keys."""
    key = ec.generate_private_key(ec.SECP256R1())
    addresses = ["127.0.0.1"]
    name = "coordinator"
    try:
        ipaddress.ip_address(host)
        if host not in ("0.0.0.0", "::") and host not in addresses:
            addresses.append(host)
    except ValueError:
        name = host.lower()  # a DNS name: the certificate must name it for TLS hostname checks
    cert = auth.issue_node_certificate(
        ca, name, key.public_key(), "coordinator", hours=24 * 30, addresses=tuple(addresses)
    )
    tls_dir = data_dir / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = tls_dir / "https.key", tls_dir / "https.pem"
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_secret(key_path, pem.decode())
    cert_path.write_bytes(auth.certificate_chain_pem(cert, ca.certificate))
    return cert_path, key_path


def fingerprint_text(sha256_hex: str) -> str:
    """A certificate's sha256 as browsers show it: "SHA256:AB:CD:..."."""
    pairs = [sha256_hex[i : i + 2].upper() for i in range(0, len(sha256_hex), 2)]
    return "SHA256:" + ":".join(pairs)


def page_guidance(page_url: str, ca_path: Path, ca_fingerprint: str) -> str:
    """What the operator reads at start: where the page is and how to trust the swarm's
    certificate (the browser has never heard of this swarm's CA, so it warns)."""
    url = urlsplit(page_url)
    host = url.hostname or ""
    if host in ("0.0.0.0", "::"):  # every interface: this PC's own address, whatever it is
        local = f"https://127.0.0.1:{url.port or 443}/"
        where = f"https://THIS-PC'S-ADDRESS:{url.port or 443}/ ({local} on this PC)"
    else:
        where = page_url.rstrip("/") + "/"
    return (
        f"operator page: open {where}\n"
        "  your browser will warn about the certificate: it comes from this swarm's own CA,\n"
        f"  at {ca_path}, fingerprint {fingerprint_text(ca_fingerprint)}.\n"
        "  Check that fingerprint in the browser's certificate viewer (the issuer,\n"
        "  sangama-swarm) before accepting the warning, or import that file as a trusted\n"
        "  authority in the browser's certificate settings so it stops warning."
    )


def hosted_model(
    model: str, data_dir: Path, keep_pieces: bool = False, *, first: bool = True
) -> HostedModel:
    """The model to serve: a bundled model's name or a GGUF file (sliced once under
    data_dir/models), a folder of pieces `sangama slice` wrote, served as it is, or the
    https:// URL of a published GGUF (its first shard), whose pieces volunteers fetch
    from there (remote_model). ModelNotHostable, saying what would work, for anything else.
    The bundled default model is called "default" only where it is the `first` hosted
    (that name means the first); beside another, by its file's name."""
    if is_url(model):
        _private_data_dir(data_dir)
        name, folder, manifest, remote = register(model, data_dir, keep_pieces=keep_pieces)
        return HostedModel(name, folder, manifest, remote)
    source = Path(model).expanduser()
    try:
        if source.is_dir() and model not in BUNDLED_MODELS and model != DEFAULT_MODEL:
            manifest = pieces_manifest(source)
            return HostedModel(manifest.facts.name or source.name, source, manifest)
        # The first shard of a split model stands for it all: the slicer reads the rest.
        model_path = model_file(model, first_shard_ok=True)
        _private_data_dir(data_dir)  # checked: the pieces may go in now
        pieces_dir, manifest = sliced_model(model_path, data_dir / "models")
    except SplitShardError as exc:
        raise ModelNotHostable(
            f"--model {model}: shard {exc.shard} of {exc.count} of a split GGUF (gguf-split) "
            f"was given: give the first shard ({exc.first_shard}) instead; the slicer reads "
            "the others from the same folder"
        ) from exc
    except CoreError as exc:
        raise ModelNotHostable(f"--model {model}: {exc}") from exc
    name = DEFAULT_MODEL if model == DEFAULT_MODEL and first else model_path.stem
    return HostedModel(name, pieces_dir, manifest)


def _private_data_dir(data_dir: Path) -> None:
    """The data dir holds the CA key, the database (invites, node token hashes, operator
    sessions) and the operator's secrets: 0700, whatever the umask."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if hasattr(os, "getuid") and data_dir.stat().st_uid == os.getuid():
        data_dir.chmod(0o700)


def _private_sqlite_file(url: str) -> None:
    """An SQLite database file made 0600 before SQLite makes it with the umask (0644);
    its journals take the database's mode."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == prefix + ":memory:":
        return
    path = Path(url[len(prefix) :].split("?", 1)[0])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)


def build(options: CoordinatorOptions) -> tuple[Coordinator, Path, Path]:
    data_dir = options.data_dir
    # The models first: a mistyped --model must not leave a database and a CA behind.
    model = hosted_model(options.model, data_dir, options.keep_pieces)
    more = tuple(
        hosted_model(m, data_dir, options.keep_pieces, first=False) for m in options.more_models
    )
    try:
        check_names((model, *more))
    except ValueError as exc:
        raise ModelNotHostable(f"--model: {exc}") from exc
    _private_data_dir(data_dir)
    url = options.db_url or default_db_url(data_dir)
    _private_sqlite_file(url)
    migrate(url)
    store = Store(url)
    ca = load_or_create_ca(data_dir)
    public = options.public_url or f"https://{options.host}:{options.port}"
    coord = Coordinator(store, ca, public, model, options.settings, more_models=more)
    _ensure_operator_secrets(coord, data_dir, options.admin_password)
    cert_path, key_path = https_identity(ca, data_dir, options.host)
    return coord, cert_path, key_path


def _ensure_operator_secrets(coord: Coordinator, data_dir: Path, password: str | None) -> None:
    if password is not None:
        coord.set_admin_password(password)
    elif coord.store.get_setting(ADMIN_PASSWORD) is None:
        generated = secrets.token_urlsafe(12)
        coord.set_admin_password(generated)
        _write_secret(data_dir / ADMIN_PASSWORD_FILE, generated)
        print(f"operator password written to {data_dir / ADMIN_PASSWORD_FILE}", file=sys.stderr)
    token_file = data_dir / ADMIN_TOKEN_FILE
    if not token_file.exists() or coord.store.get_setting("admin_token_hash") is None:
        token = secrets.token_urlsafe(24)
        coord.store.set_setting("admin_token_hash", hash_token(token))
        _write_secret(token_file, token)


def start_answer_probe(coord: Coordinator, every_s: float) -> AnswerProber | None:
    """The thread that asks the planned chain for two tokens (None: `every_s` 0, off)."""
    if every_s <= 0:
        return None
    ca_pem = coord.ca_pem.encode()

    def keep(state: AnswerState) -> None:
        coord.answer = state

    prober = AnswerProber(
        coord.answer_chain,
        coord.model.name,
        lambda: probe_credentials(coord.ca, ca_pem),
        ProbePolicy(every_s=every_s, retry_s=min(every_s, ProbePolicy.retry_s)),
        keep,
    )
    prober.start()
    return prober


def serve(options: CoordinatorOptions) -> int:
    import uvicorn

    from coordinator.server.api import create_app

    coord, cert_path, key_path = build(options)
    app = create_app(coord, Path(__file__).parent / "web")
    prober = start_answer_probe(coord, options.answer_probe_every_s)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        ssl_certfile=str(cert_path),
        ssl_keyfile=str(key_path),
        log_level="warning",
        access_log=False,
        # uvicorn would believe X-Forwarded-For from any loopback peer, so behind a
        # proxy on this machine every caller could name itself: the API reads the
        # header itself, from --trusted-proxy peers only (api_callers.caller_address).
        proxy_headers=False,
    )
    server = uvicorn.Server(config)

    # Scripts and the demo wait for this line.
    original_startup = server.startup

    async def startup(sockets: object = None) -> None:
        await original_startup(sockets)  # type: ignore[arg-type]
        print(f"READY {coord.public_url} ca={coord.ca_fingerprint}", flush=True)
        ca_path = options.data_dir / "ca" / "ca.pem"
        print(page_guidance(coord.public_url, ca_path, coord.ca_fingerprint), file=sys.stderr)

    server.startup = startup  # type: ignore[method-assign]
    server.run()
    if prober is not None:
        prober.stop()
    coord.store.close()
    return 0
