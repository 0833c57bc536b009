"""A worker's piece server (app/serving/piece_server.py) on loopback, asked by the
downloader's own mutual-TLS sessions (coordinator/client/peer_pieces.py): a piece of
the offered model, whole and by range, for a worker of the swarm; refused without a
client certificate, with a certificate of another CA, for a revoked node or a client,
for a path outside the cache, a `.part`, a piece not complete, a piece of another model;
and the downloader routing around a peer that serves wrong bytes."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from app.serving.piece_server import PieceServer
from coordinator.client.mirror import fetch_pieces
from coordinator.client.peer_pieces import PEER_PARTS, Peers, peer_context, peer_session
from coordinator.contract import PieceSource
from core.manifest import Manifest, PieceInfo, verify_piece
from net import auth
from tests.support.range_server import serve_dir

pytestmark = pytest.mark.integration

MODEL = "tiny"


def _node(ca: auth.CertifiedKey, node_id: str, role: str = "worker") -> auth.CertifiedKey:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return auth.CertifiedKey(cert, key)


def _pieces(folder: Path, n: int = 3, size: int = 300_000) -> Manifest:
    """A manifest of `n` pieces of random bytes written to `folder`."""
    import random

    folder.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(7)
    infos = []
    for i in range(n):
        data = rnd.randbytes(size + i)
        name = f"blk.{i:03d}"
        (folder / f"{name}.gguf").write_bytes(data)
        infos.append(
            PieceInfo(name, f"{name}.gguf", "block", i, hashlib.sha256(data).hexdigest(), len(data))
        )
    return _manifest(infos)


def _manifest(pieces: list[PieceInfo]) -> Manifest:
    # Only `pieces` is read by the server; the rest of a Manifest is not needed here.
    class _M:
        pass

    m = _M()
    m.pieces = pieces  # type: ignore[attr-defined]
    return m  # type: ignore[return-value]


Swarm = tuple[auth.CertifiedKey, PieceServer, Manifest, Path]


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    ca = auth.create_ca("test swarm")
    held = tmp_path / "held" / MODEL
    manifest = _pieces(held)
    (held / "blk.000.gguf.part").write_bytes(b"partial")
    (tmp_path / "held" / "secret.txt").write_bytes(b"outside the cache")
    server = PieceServer(_node(ca, "holder"), auth.certificate_pem(ca.certificate), "127.0.0.1")
    server.offer(MODEL, held, manifest)
    server.start()
    try:
        yield ca, server, manifest, held
    finally:
        server.stop()


def _session(
    ca: auth.CertifiedKey, who: auth.CertifiedKey, peer: str = "holder"
) -> requests.Session:
    return peer_session(peer_context(who, auth.certificate_pem(ca.certificate)), peer)


def _get(web: requests.Session, server: PieceServer, path: str, **kw: object) -> requests.Response:
    return web.get(f"https://{server.address}{path}", timeout=10, **kw)  # type: ignore[arg-type]


def test_a_worker_of_the_swarm_gets_a_piece_whole_and_by_range(swarm: Swarm) -> None:
    ca, server, manifest, held = swarm
    web = _session(ca, _node(ca, "asker"))
    whole = _get(web, server, f"/pieces/{MODEL}/blk.001.gguf")
    assert whole.status_code == 200
    assert whole.content == (held / "blk.001.gguf").read_bytes()
    part = _get(web, server, f"/pieces/{MODEL}/blk.001.gguf", headers={"Range": "bytes=10-19"})
    assert part.status_code == 206
    assert part.content == (held / "blk.001.gguf").read_bytes()[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{manifest.pieces[1].size}"
    assert server.bytes_sent == manifest.pieces[1].size + 10


def test_no_client_certificate_is_refused(swarm: Swarm) -> None:
    import ssl

    ca, server, _m, _h = swarm
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=auth.certificate_pem(ca.certificate).decode())
    web = requests.Session()
    from coordinator.client.peer_pieces import _PeerAdapter

    web.mount("https://", _PeerAdapter(ctx, "holder"))
    with pytest.raises(requests.RequestException):
        _get(web, server, f"/pieces/{MODEL}/blk.000.gguf")


def test_a_certificate_of_another_ca_is_refused(swarm: Swarm) -> None:
    ca, server, _m, _h = swarm
    other = auth.create_ca("test swarm")  # same name, another key
    web = peer_session(
        peer_context(_node(other, "asker"), auth.certificate_pem(ca.certificate)), "holder"
    )
    with pytest.raises(requests.RequestException):
        _get(web, server, f"/pieces/{MODEL}/blk.000.gguf")


def test_the_server_must_name_the_listed_node(swarm: Swarm) -> None:
    ca, server, _m, _h = swarm
    web = _session(ca, _node(ca, "asker"), peer="someone-else")
    with pytest.raises(requests.exceptions.SSLError):
        _get(web, server, f"/pieces/{MODEL}/blk.000.gguf")


def test_a_revoked_node_and_a_client_are_refused(swarm: Swarm) -> None:
    ca, server, _m, _h = swarm
    revoked = _node(ca, "revoked")
    server.set_revoked([str(revoked.certificate.serial_number)])
    assert _get(_session(ca, revoked), server, f"/pieces/{MODEL}/blk.000.gguf").status_code == 403
    client = _node(ca, "chatter", role="client")
    assert _get(_session(ca, client), server, f"/pieces/{MODEL}/blk.000.gguf").status_code == 403


@pytest.mark.parametrize(
    "path",
    [
        f"/pieces/{MODEL}/blk.000.gguf.part",
        f"/pieces/{MODEL}/..%2Fsecret.txt",
        f"/pieces/{MODEL}/%2E%2E",
        "/pieces/other-model/blk.000.gguf",
        f"/pieces/{MODEL}/manifest.json",
        "/etc/passwd",
    ],
)
def test_only_manifest_pieces_of_the_offered_model(swarm: Swarm, path: str) -> None:
    ca, server, _m, _h = swarm
    answer = _get(_session(ca, _node(ca, "asker")), server, path)
    assert answer.status_code == 404
    assert b"outside the cache" not in answer.content


def test_a_piece_not_complete_or_corrupt_on_disk_is_not_served(swarm: Swarm) -> None:
    ca, server, _m, held = swarm
    web = _session(ca, _node(ca, "asker"))
    (held / "blk.002.gguf").unlink()
    assert _get(web, server, f"/pieces/{MODEL}/blk.002.gguf").status_code == 404
    data = bytearray((held / "blk.001.gguf").read_bytes())
    data[5] ^= 0xFF
    (held / "blk.001.gguf").write_bytes(bytes(data))
    assert _get(web, server, f"/pieces/{MODEL}/blk.001.gguf").status_code == 404


def test_a_download_takes_pieces_from_a_peer(swarm: Swarm, tmp_path: Path) -> None:
    ca, server, manifest, held = swarm
    me = _node(ca, "newcomer")
    listed = (PieceSource("peer", "holder", server.address), PieceSource("coordinator"))
    peers = Peers(
        MODEL,
        lambda _p: listed,
        lambda s: _session(ca, me, s.node_id),
    )
    with serve_dir(held) as coordinator:
        report = fetch_pieces(
            requests.Session(),
            coordinator.url,
            None,
            manifest.pieces,
            tmp_path / "got",
            peers=peers,
        )
    assert report.peer_bytes == sum(p.size for p in manifest.pieces)
    assert report.coordinator_bytes == 0
    for p in manifest.pieces:
        verify_piece(tmp_path / "got", p)


def test_a_peer_serving_wrong_bytes_is_routed_around(tmp_path: Path) -> None:
    ca = auth.create_ca("test swarm")
    good = tmp_path / "good"
    manifest = _pieces(good)
    bad = tmp_path / "bad"
    bad.mkdir()
    # The bad peer's files are the right size, but their manifest entry says otherwise:
    # it serves whatever it holds (its own sha256 check passes against its own entry).
    wrong = []
    for p in manifest.pieces:
        data = bytearray((good / p.file).read_bytes())
        data[100] ^= 0x01
        (bad / p.file).write_bytes(bytes(data))
        wrong.append(replace(p, sha256=hashlib.sha256(bytes(data)).hexdigest()))
    liar = PieceServer(_node(ca, "liar"), auth.certificate_pem(ca.certificate), "127.0.0.1")
    liar.offer(MODEL, bad, _manifest(wrong))
    honest = PieceServer(_node(ca, "honest"), auth.certificate_pem(ca.certificate), "127.0.0.1")
    honest.offer(MODEL, good, manifest)
    liar.start()
    honest.start()
    me = _node(ca, "newcomer")
    asked = []
    lock = threading.Lock()

    def sources(piece: PieceInfo) -> tuple[PieceSource, ...]:
        with lock:
            asked.append(piece.name)
        return (
            PieceSource("peer", "liar", liar.address),
            PieceSource("peer", "honest", honest.address),
            PieceSource("coordinator"),
        )

    peers = Peers(MODEL, sources, lambda s: _session(ca, me, s.node_id))
    try:
        with serve_dir(good) as coordinator:
            report = fetch_pieces(
                requests.Session(),
                coordinator.url,
                None,
                manifest.pieces,
                tmp_path / "got",
                peers=peers,
                parallel=1,
            )
    finally:
        liar.stop()
        honest.stop()
    assert report.demoted_peers == ("liar",)
    assert report.coordinator_bytes == 0
    for p in manifest.pieces:
        verify_piece(tmp_path / "got", p)
    assert not list((tmp_path / "got" / PEER_PARTS).glob("*.part"))
    # Demoted for the rest of the download: the liar served the first piece only.
    assert liar.bytes_sent <= 2 * manifest.pieces[0].size


def test_with_no_peer_the_coordinator_serves(tmp_path: Path) -> None:
    ca = auth.create_ca("test swarm")
    held = tmp_path / "held"
    manifest = _pieces(held, n=2)
    me = _node(ca, "newcomer")
    gone = PieceSource("peer", "gone", "127.0.0.1:9")  # nothing listens there
    peers = Peers(MODEL, lambda _p: (gone,), lambda s: _session(ca, me, s.node_id), timeout=2.0)
    with serve_dir(held) as coordinator:
        report = fetch_pieces(
            requests.Session(),
            coordinator.url,
            None,
            manifest.pieces,
            tmp_path / "got",
            peers=peers,
        )
    assert report.peer_bytes == 0
    assert report.coordinator_bytes == sum(p.size for p in manifest.pieces)
    assert report.demoted_peers == ("gone",)


def test_a_stopped_server_serves_nothing(tmp_path: Path) -> None:
    # A paused node's serve loop stops its piece server.
    ca = auth.create_ca("test swarm")
    held = tmp_path / "held"
    manifest = _pieces(held, n=1)
    server = PieceServer(_node(ca, "holder"), auth.certificate_pem(ca.certificate), "127.0.0.1")
    server.offer(MODEL, held, manifest)
    server.start()
    web = _session(ca, _node(ca, "asker"))
    assert _get(web, server, f"/pieces/{MODEL}/blk.000.gguf").status_code == 200
    server.stop()
    with pytest.raises(requests.RequestException):
        _get(_session(ca, _node(ca, "asker")), server, f"/pieces/{MODEL}/blk.000.gguf")
