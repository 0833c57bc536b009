"""Pieces from peers: a piece fetched from a swarm member that holds it, before the
model's mirror and the coordinator.

The coordinator lists where a piece can be had, best first (GET …/pieces/{file}/sources:
peers that hold it, ranked by round trip and by how many downloads it pointed at them
lately, then the mirror, then itself). Each peer is asked over HTTPS with mutual TLS:
this node shows its own certificate, and the peer's must chain to the swarm CA and
name the node id the coordinator listed (the certificate's DNS name), so a peer cannot
be impersonated by whoever holds its address. The piece streams through
downloads.download_pieces into a folder of its own (`PEER_PARTS` below the pieces
folder), so a peer's part never mixes with the mirror's or the coordinator's, and it is
renamed into place only once its size and sha256 match the manifest. A peer that
refuses, fails, stalls past the timeout or serves wrong bytes is demoted for the rest
of the download; the piece then comes from the next peer, and after the peers from the
mirror and the coordinator as before.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter

from coordinator.client.downloads import (
    DownloadError,
    DownloadProgress,
    StoppedEarly,
    download_pieces,
)
from coordinator.contract import PEER_PIECES, PieceSource
from core.errors import PieceCorruptError
from core.manifest import PieceInfo
from net import auth
from net.rate import Throttle

log = logging.getLogger(__name__)

PEER_PARTS = ".from-peers"
"""Below a pieces folder: the parts of pieces coming from peers."""
PEER_TIMEOUT_S = 10.0
"""A peer that sends nothing for this long is given up for the rest of the download."""


def load_identity(ctx: ssl.SSLContext, credentials: auth.CertifiedKey) -> None:
    """The node's certificate and key into `ctx`: ssl reads them only from files, so
    they pass through a private temporary folder that is gone when this returns."""
    with tempfile.TemporaryDirectory(prefix="sangama-tls-") as folder:
        cert, key = Path(folder) / "node.pem", Path(folder) / "node.key"
        cert.write_bytes(auth.certificate_pem(credentials.certificate))
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(auth.private_key_pem(credentials.private_key))
        ctx.load_cert_chain(cert, key)


def peer_context(credentials: auth.CertifiedKey, ca_pem: bytes) -> ssl.SSLContext:
    """TLS toward a peer's piece server: the swarm CA only (no public CAs), this node's
    certificate shown, the peer's checked against the node id it must name."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cadata=ca_pem.decode())
    load_identity(ctx, credentials)
    return ctx


class _PeerAdapter(HTTPAdapter):
    """Connections to one peer: its node id is the name TLS checks, whatever address
    it is reached at."""

    def __init__(self, context: ssl.SSLContext, node_id: str) -> None:
        self._context, self._node_id = context, node_id
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(ssl_context=self._context, server_hostname=self._node_id)
        super().init_poolmanager(*args, **kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        # The context holds the swarm CA and this node's certificate; requests would add
        # its public CA bundle to it.
        return


def peer_session(context: ssl.SSLContext, node_id: str) -> requests.Session:
    web = requests.Session()
    web.trust_env = False  # no proxy, no REQUESTS_CA_BUNDLE: straight to the peer
    web.mount("https://", _PeerAdapter(context, node_id))
    return web


@dataclass(frozen=True)
class Peers:
    """How a download reaches peers: where each piece is (the coordinator's answer),
    and a session toward one peer."""

    model: str
    sources: Callable[[PieceInfo], Sequence[PieceSource]]
    session_for: Callable[[PieceSource], requests.Session]
    timeout: float = PEER_TIMEOUT_S


def peers_of(
    credentials: auth.CertifiedKey,
    ca_pem: bytes,
    model: str,
    sources: Callable[[PieceInfo], Sequence[PieceSource]],
) -> Peers:
    """Peers reached with this node's identity; one session per peer, kept."""
    context = peer_context(credentials, ca_pem)
    sessions: dict[str, requests.Session] = {}
    lock = threading.Lock()

    def session_for(source: PieceSource) -> requests.Session:
        with lock:
            if source.node_id not in sessions:
                sessions[source.node_id] = peer_session(context, source.node_id)
            return sessions[source.node_id]

    return Peers(model, sources, session_for)


class Demoted:
    """Peers given up for the rest of one download (shared by its piece threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: dict[str, str] = {}

    def add(self, node_id: str, reason: str) -> None:
        with self._lock:
            first = node_id not in self._why
            self._why.setdefault(node_id, reason)
        if first:
            log.warning("peer %s demoted (%s): its pieces come from elsewhere", node_id, reason)

    def __contains__(self, node_id: object) -> bool:
        with self._lock:
            return node_id in self._why

    def reasons(self) -> dict[str, str]:
        with self._lock:
            return dict(self._why)


def from_peers(
    peers: Peers,
    piece: PieceInfo,
    dest: Path,
    demoted: Demoted,
    stop: threading.Event,
    *,
    chunk_bytes: int,
    throttle: Throttle | None,
    progress: Callable[[DownloadProgress], None],
) -> Path | None:
    """The piece from the best peer that has it, verified and in `dest`; None when no
    peer could give it (the caller goes on to the mirror and the coordinator)."""
    try:
        listed = peers.sources(piece)
    except Exception as exc:  # an older coordinator, or none now: no peers this time
        log.info("no piece sources for %s: %s", piece.name, exc)
        return None
    staging = dest / PEER_PARTS
    for source in listed:
        if source.kind != "peer" or source.node_id in demoted:
            continue
        if stop.is_set():
            raise StoppedEarly
        url = f"https://{source.address}" + PEER_PIECES.format(
            model=quote(peers.model, safe=""), file=""
        ).rstrip("/")
        try:
            (got,) = download_pieces(
                peers.session_for(source),
                url,
                [piece],
                staging,
                parallel=1,
                progress=progress,
                chunk_bytes=chunk_bytes,
                retries=1,  # one failure is enough: the next source is as good
                timeout=peers.timeout,
                backoff=0.0,
                throttle=throttle,
            )
        except (DownloadError, PieceCorruptError, requests.RequestException, OSError) as exc:
            demoted.add(source.node_id, str(exc)[:200])
            continue
        final = dest / piece.file
        os.replace(got, final)  # verified by download_pieces: size and sha256
        log.info("piece %s from peer %s", piece.name, source.node_id)
        return final
    return None


def drop_peer_part(dest: Path, piece: PieceInfo) -> None:
    """A peer's part of a piece that came from elsewhere: no longer worth keeping."""
    (dest / PEER_PARTS / (piece.file + ".part")).unlink(missing_ok=True)
