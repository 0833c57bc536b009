"""A worker's piece server: the pieces it holds, to other members of its swarm.

A replacement or spare volunteer gets its stage's pieces from a peer that holds them
(coordinator.client.peer_pieces), not only from the coordinator's uplink or the model's
mirror. HTTPS with mutual TLS, exactly as the swarm's identities are used elsewhere:
the server's certificate is the node's own, a client must show a certificate of the
swarm CA (the TLS handshake refuses any other), and only a worker's certificate that is
not revoked gets an answer (403 otherwise). It answers `GET /pieces/{model}/{file}`
(a Range of one interval too) only for a file named exactly as a piece of the manifest
it offers, complete and verified against the manifest's sha256 once: never a `.part`,
never a path outside the cache, never a piece of another model. What it sends shares
the volunteer's upload cap (`upload_bytes_per_s`), and at most `max_requests` run at
once (503 beyond). It runs only while the coordinated worker runs, so a paused node
serves no pieces.

What a request gets is decided by pure functions (`answer`, `byte_range`); the thread
around them only reads files and writes bytes.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import ssl
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from app.identity import Identity
from app.ports import LOOPBACK, outward_host
from coordinator.client.peer_pieces import load_identity
from coordinator.client.session import CoordinatorClient
from core.errors import PieceCorruptError
from core.manifest import Manifest, PieceInfo, verify_piece
from net import auth
from net.rate import Throttle

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
REVOKED_EVERY_S = 30.0
"""How often the server asks the coordinator for revoked certificates."""
_PATH = re.compile(r"/pieces/([^/]{1,256})/([^/]{1,256})")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True)
class Offered:
    """What the server offers: one model's pieces in one folder of the cache."""

    model: str
    folder: Path
    pieces: tuple[PieceInfo, ...]


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


@dataclass(frozen=True)
class PieceFile:
    piece: PieceInfo
    path: Path


def answer(path: str, offered: Offered | None) -> PieceFile | Refusal:
    """Which file a request path names, or why it gets none. Only a name that is exactly
    a manifest piece's file name is looked up, so no request reaches a `.part` or any
    path outside the cache folder."""
    m = _PATH.fullmatch(path.split("?", 1)[0])
    if m is None:
        return Refusal(404, "not a piece path")
    model, name = unquote(m.group(1)), unquote(m.group(2))
    if offered is None or model != offered.model:
        return Refusal(404, f"no pieces of model {model!r} here")
    piece = next((p for p in offered.pieces if p.file == name), None)
    if piece is None:
        return Refusal(404, f"{name!r} is not a piece of {model!r}")
    return PieceFile(piece, offered.folder / piece.file)


def byte_range(header: str | None, size: int) -> tuple[int, int] | Refusal | None:
    """The [start, stop) a Range header asks of a file of `size` bytes; None for the
    whole file (no header, or one this server does not honour, as HTTP allows)."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # the last N bytes
        n = int(m.group(2))
        return (max(0, size - n), size) if n > 0 else Refusal(416, "empty suffix")
    start = int(m.group(1))
    stop = min(int(m.group(2)) + 1, size) if m.group(2) else size
    if start >= size or stop <= start:
        return Refusal(416, f"range from {start} of {size} bytes")
    return start, stop


def accepted_peer(
    der: bytes | None, ca: Any, revoked: Collection[int]
) -> auth.NodeIdentity | Refusal:
    """The worker a client certificate names, or why it gets nothing: TLS already
    checked it chains to the swarm CA; this adds revocation and the role."""
    if not der:
        return Refusal(403, "no client certificate")
    try:
        who = auth.verify_node_certificate(auth.load_certificate(der), ca, revoked=revoked)
    except auth.AuthError as exc:
        return Refusal(403, str(exc))
    if who.role is not auth.Role.WORKER:
        return Refusal(403, f"{who.role.value} certificates fetch no pieces")
    return who


class PieceServer:
    """The server's state: what it offers, the revoked serials, its limits."""

    def __init__(
        self,
        credentials: auth.CertifiedKey,
        ca_pem: bytes,
        host: str,
        *,
        upload_bytes_per_s: int = 0,
        max_requests: int = 4,
        timeout_s: float = 30.0,
        revoked: Callable[[], Iterable[str | int]] | None = None,
        certificate_file: Path | None = None,
    ) -> None:
        """`revoked`: the swarm's revoked serials, asked every REVOKED_EVERY_S;
        `certificate_file`: where the node's renewed certificate appears (same key),
        read again when it changes."""
        self.ca = auth.load_certificate(ca_pem)
        self._ca_pem = ca_pem
        self._credentials = credentials
        self._certificate_file = certificate_file
        self._certificate_mtime = _mtime(certificate_file)
        self._context = _server_context(credentials, ca_pem)
        self._throttle = Throttle(upload_bytes_per_s) if upload_bytes_per_s > 0 else None
        self._slots = threading.BoundedSemaphore(max_requests)
        self._connections = threading.BoundedSemaphore(max_requests * 4)
        self._timeout_s = timeout_s
        self._fetch_revoked = revoked
        self._lock = threading.Lock()
        self._offered: Offered | None = None
        self._verified: dict[str, tuple[int, int]] = {}
        """File name -> (size, mtime_ns) whose sha256 matched: hashed once, not per request."""
        self.revoked: frozenset[int] = frozenset()
        self.bytes_sent = 0
        self._stop = threading.Event()
        self._httpd = _Httpd((host, 0), _Handler, self)
        self.address = f"{host}:{self._httpd.server_address[1]}"
        if ":" in host:
            self.address = f"[{host}]:{self._httpd.server_address[1]}"
        self._threads: list[threading.Thread] = []

    # -- the owner's side
    def start(self) -> str:
        serve = threading.Thread(target=self._httpd.serve_forever, name="pieces", daemon=True)
        serve.start()
        self._threads.append(serve)
        if self._fetch_revoked is not None or self._certificate_file is not None:
            watch = threading.Thread(target=self._watch, name="pieces-watch", daemon=True)
            watch.start()
            self._threads.append(watch)
        log.info("serving pieces to the swarm at %s", self.address)
        return self.address

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def offer(self, model: str, folder: Path, manifest: Manifest) -> None:
        """Serve `model`'s pieces found complete in `folder` (one model at a time)."""
        with self._lock:
            if self._offered is None or self._offered.folder != folder:
                self._verified = {}
            self._offered = Offered(model, folder, tuple(manifest.pieces))

    def set_revoked(self, serials: Iterable[str | int]) -> None:
        parsed = set()
        for s in serials:
            try:
                parsed.add(int(s))
            except ValueError:
                continue
        self.revoked = frozenset(parsed)

    def _watch(self) -> None:
        while True:
            if self._fetch_revoked is not None:
                try:
                    self.set_revoked(self._fetch_revoked())
                except Exception as exc:  # the coordinator away: keep the last list
                    log.info("could not read revocations for the piece server: %s", exc)
            self._renewed()
            if self._stop.wait(REVOKED_EVERY_S):
                return

    def _renewed(self) -> None:
        """The node's certificate again, once renewal wrote a new one (same key)."""
        mtime = _mtime(self._certificate_file)
        if self._certificate_file is None or mtime == self._certificate_mtime:
            return
        try:
            cert = auth.load_certificate(self._certificate_file.read_bytes())
            renewed = auth.CertifiedKey(cert, self._credentials.private_key)
            self._context = _server_context(renewed, self._ca_pem)
        except (OSError, ssl.SSLError, auth.AuthError) as exc:
            log.warning("piece server keeps its certificate: %s", exc)
            return
        self._credentials, self._certificate_mtime = renewed, mtime

    # -- the handlers' side
    def offered(self) -> Offered | None:
        with self._lock:
            return self._offered

    def complete(self, found: PieceFile) -> int | None:
        """The file's size when it is the complete piece (its sha256 checked once)."""
        try:
            st = found.path.stat()
        except OSError:
            return None
        if st.st_size != found.piece.size:
            return None
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            if self._verified.get(found.piece.file) == key:
                return st.st_size
        try:
            verify_piece(found.path.parent, found.piece)
        except (PieceCorruptError, OSError):
            return None
        with self._lock:
            self._verified[found.piece.file] = key
        return st.st_size

    def sent(self, n: int) -> None:
        if self._throttle is not None:
            self._throttle.take(n)
        with self._lock:
            self.bytes_sent += n


def _mtime(path: Path | None) -> int:
    try:
        return 0 if path is None else path.stat().st_mtime_ns
    except OSError:
        return 0


def _server_context(credentials: auth.CertifiedKey, ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=ca_pem.decode())
    load_identity(ctx, credentials)  # the node's own certificate, as on its links
    return ctx


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, owner: PieceServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.owner = owner
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Each connection is a thread: past the cap a new one is closed at once.
        if not self.owner._connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._connections.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs here, on the connection's thread, never on the accept loop.
        request.settimeout(self.owner._timeout_s)
        try:
            tls = self.owner._context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            log.debug("piece request from %s refused in TLS: %s", client_address, exc)
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            tls.close()


class _Handler(BaseHTTPRequestHandler):
    server: _Httpd
    server_version = "sangama-pieces"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("piece server: " + format, *args)

    def do_GET(self) -> None:
        owner = self.server.owner
        assert isinstance(self.connection, ssl.SSLSocket)
        who = accepted_peer(self.connection.getpeercert(binary_form=True), owner.ca, owner.revoked)
        if isinstance(who, Refusal):
            return self._refuse(who)
        found = answer(self.path, owner.offered())
        if isinstance(found, Refusal):
            return self._refuse(found)
        if not owner._slots.acquire(blocking=False):
            return self._refuse(Refusal(503, "busy"), retry=True)
        try:
            self._send(found, who.node_id)
        finally:
            owner._slots.release()

    def _send(self, found: PieceFile, to: str) -> None:
        owner = self.server.owner
        size = owner.complete(found)
        if size is None:
            return self._refuse(Refusal(404, f"{found.piece.file} is not complete here"))
        asked = byte_range(self.headers.get("Range"), size)
        if isinstance(asked, Refusal):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, stop = asked or (0, size)
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        log.debug("piece %s [%d, %d) to %s", found.piece.file, start, stop, to)
        with open(found.path, "rb") as f:
            f.seek(start)
            left = stop - start
            while left > 0:
                chunk = f.read(min(CHUNK_BYTES, left))
                if not chunk:
                    break
                owner.sent(len(chunk))
                self.wfile.write(chunk)
                left -= len(chunk)

    def _refuse(self, refusal: Refusal, retry: bool = False) -> None:
        body = refusal.reason.encode()[:300]
        self.send_response(refusal.status)
        if retry:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_piece_server(
    identity: Identity, client: CoordinatorClient, host: str, upload_bytes_per_s: int
) -> PieceServer | None:
    """This node's piece server on `host` (a free TCP port), or None where it cannot
    start (the node then only fetches, never serves). Blocking: run it in an executor."""
    try:
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:  # listening everywhere: said as the address toward the coordinator
            host = outward_host(urlsplit(client.base_url).hostname or LOOPBACK)
        server = PieceServer(
            identity.certified,
            identity.ca_pem,
            host,
            upload_bytes_per_s=upload_bytes_per_s,
            revoked=client.revoked,
            certificate_file=identity.directory / "node.pem",
        )
        server.start()
    except (OSError, ValueError, ssl.SSLError) as exc:
        log.warning("not serving pieces to peers: %s", exc)
        return None
    return server
