"""A model registered by URL, its pieces fetched from the mirror: real HTTPS range servers
on loopback stand in for the hub (serving the published GGUF or its gguf-split shards)
and for the coordinator's pieces endpoint (coordinator.server.remote_model, as api.py
answers it). Asserted: the pieces are byte-identical to sliced ones, and the bytes each
source served; a mirror serving corrupt, truncated, stalled, failing or another file's
bytes is routed around and nothing unverified is ever put in place. Nothing is timed.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from coordinator import invites as inv
from coordinator.client.mirror import FetchReport, fetch_pieces
from coordinator.errors import ModelNotHostable
from coordinator.mirror_reads import FIRST_HEADER_READ
from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.remote_model import RemotePieces, local_piece, piece_response, register
from coordinator.server.secret_hashes import hash_token
from coordinator.server.serve import CoordinatorOptions, build
from core.errors import PieceCorruptError
from core.gguf_slices import slice_model
from core.manifest import MANIFEST_FILE, Manifest, PieceInfo
from core.piece_sources import piece_segments, plan_reads
from core.types import LayerRange
from net import auth
from tests.support.gguf_fixtures import split_gguf, write_rich_model
from tests.support.range_server import RangeServer
from tests.support.tls_files import TlsFiles, loopback_tls

pytestmark = pytest.mark.integration

CHUNK = 16 << 10


class CoordinatorPieces(RangeServer):
    """`GET /{file}` as the coordinator's pieces endpoint answers it: the kept copy when
    there is one, else the piece built from its header and the mirror."""

    def __init__(self, folder: Path, manifest: Manifest, remote: RemotePieces) -> None:
        super().__init__(folder)
        self.sizes = {p.file: p.size for p in manifest.pieces}
        self.remote = remote

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = str(scope.get("path", "")).lstrip("/")
        if scope["type"] != "http" or local_piece(self.root, name, self.sizes[name]):
            await super().__call__(scope, receive, send)
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        with self._lock:
            self.requests[name] += 1
            self.ranges.setdefault(name, []).append(headers.get("range"))
        response = piece_response(self.remote, name, headers.get("range"))
        await response(scope, receive, self._faulty_send(send, name, None, None, False))


@dataclass
class Swarm:
    hub: RangeServer
    coordinator: CoordinatorPieces
    manifest: Manifest
    sliced: Path
    """The same model sliced locally: what every fetched piece must equal."""
    folder: Path
    mirror: requests.Session
    model_file: str
    tmp: Path

    def fetch(
        self, layers: LayerRange, dest: str, only: list[str] | None = None, **kw: Any
    ) -> FetchReport:
        """Fetch the pieces of a stage holding `layers` (those named in `only`, if given)."""
        pieces = [p for p in self.manifest.pieces_for(layers) if only is None or p.name in only]
        kw.setdefault("chunk_bytes", CHUNK)
        kw.setdefault("backoff", 0.0)
        with requests.Session() as coord:
            return fetch_pieces(
                coord,
                self.coordinator.url,
                self.manifest.mirror,
                pieces,
                self.tmp / dest,
                mirror_session=self.mirror,
                **kw,
            )

    def assert_pieces(self, dest: str, layers: LayerRange) -> list[PieceInfo]:
        pieces = self.manifest.pieces_for(layers)
        for p in pieces:
            assert (self.tmp / dest / p.file).read_bytes() == (self.sliced / p.file).read_bytes()
        assert sorted(f.name for f in (self.tmp / dest).iterdir()) == sorted(p.file for p in pieces)
        return pieces


def mirror_read_bytes(manifest: Manifest, pieces: list[PieceInfo]) -> int:
    """What the mirror must send for `pieces`: each request's range, gaps included."""
    assert manifest.mirror is not None
    total = 0
    for p in pieces:
        ranges = manifest.mirror.ranges(p.name)
        assert ranges is not None
        total += sum(r.stop - r.start for r in plan_reads(piece_segments(ranges)) if r.from_mirror)
    return total


def header_bytes(manifest: Manifest, pieces: list[PieceInfo]) -> int:
    assert manifest.mirror is not None
    return sum(manifest.mirror.pieces[p.name].header for p in pieces)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return loopback_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def keep() -> bool:
    """Whether the coordinator keeps a copy of the pieces (--keep-pieces)."""
    return False


@pytest.fixture(params=["one-file", "shards"])
def swarm(
    request: pytest.FixtureRequest, tls: TlsFiles, tmp_path: Path, keep: bool
) -> Iterator[Swarm]:
    model = write_rich_model(tmp_path / "rich.gguf", n_layer=4, n_embd=128)
    sliced = tmp_path / "sliced"
    slice_model(model, sliced)
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    if request.param == "shards":
        first = split_gguf(model, hub_dir, "rich", 5)[0].name
    else:
        first = Path(shutil.copy(model, hub_dir / "rich.gguf")).name
    with requests.Session() as mirror:
        mirror.verify = str(tls.ca)
        hub = RangeServer(hub_dir, tls.pair)
        hub.start()
        try:
            _, folder, manifest, remote = register(
                f"{hub.url}/{first}", tmp_path / "data", keep_pieces=keep, session=mirror
            )
            coordinator = CoordinatorPieces(folder, manifest, remote)
            coordinator.start()
            try:
                yield Swarm(hub, coordinator, manifest, sliced, folder, mirror, first, tmp_path)
            finally:
                coordinator.stop()
        finally:
            hub.stop()


def test_registered_by_url_volunteers_fetch_from_the_mirror(swarm: Swarm) -> None:
    sliced = Manifest.load(swarm.sliced)
    assert swarm.manifest.pieces == sliced.pieces  # same names, sizes and sha256
    assert swarm.manifest.facts == sliced.facts
    # The coordinator keeps the manifest, no piece.
    assert [f.name for f in swarm.folder.iterdir()] == [MANIFEST_FILE]
    # Registering read the start of each published file (its header: one read, as these
    # headers are under FIRST_HEADER_READ) and each piece's tensor bytes once.
    assert swarm.manifest.mirror is not None
    heads = sum(min(FIRST_HEADER_READ, f.size) for f in swarm.manifest.mirror.files)
    tensors = mirror_read_bytes(swarm.manifest, list(swarm.manifest.pieces))
    assert sum(swarm.hub.sent_bytes.values()) == heads + tensors
    swarm.hub.reset_counters()

    n = sliced.facts.n_layer
    first = swarm.fetch(LayerRange(0, 2), "w1")
    last = swarm.fetch(LayerRange(2, n), "w2", parallel=2)

    for report, dest, layers in ((first, "w1", LayerRange(0, 2)), (last, "w2", LayerRange(2, n))):
        pieces = swarm.assert_pieces(dest, layers)
        assert report.demoted == ""
        assert report.mirror_bytes == mirror_read_bytes(swarm.manifest, pieces)
        # From the coordinator: the pieces' headers, nothing else.
        assert report.coordinator_bytes == header_bytes(swarm.manifest, pieces)
    assert sum(swarm.hub.sent_bytes.values()) == first.mirror_bytes + last.mirror_bytes
    assert sum(swarm.coordinator.sent_bytes.values()) == (
        first.coordinator_bytes + last.coordinator_bytes
    )
    assert all(
        r is not None and r.startswith("bytes=0-")
        for rs in swarm.coordinator.ranges.values()
        for r in rs
    )


def test_registering_again_reuses_the_hashes(swarm: Swarm) -> None:
    swarm.hub.reset_counters()
    url = f"{swarm.hub.url}/{swarm.model_file}"
    _, folder, manifest, _ = register(url, swarm.tmp / "data", session=swarm.mirror)
    assert manifest == swarm.manifest and folder == swarm.folder
    assert swarm.manifest.mirror is not None
    # Only the headers were read: one request per published file.
    assert sum(swarm.hub.requests.values()) == len(swarm.manifest.mirror.files)


@pytest.mark.parametrize("keep", [True])  # --keep-pieces
def test_a_corrupting_mirror_is_demoted_and_the_coordinator_serves(
    swarm: Swarm, keep: bool
) -> None:
    kept = {f.name for f in swarm.folder.iterdir()}
    assert kept == {MANIFEST_FILE} | {p.file for p in swarm.manifest.pieces}
    for f in swarm.hub.root.iterdir():
        swarm.hub.corrupt.add(f.name)

    report = swarm.fetch(LayerRange(0, 3), "w")

    pieces = swarm.assert_pieces("w", LayerRange(0, 3))
    assert "sha256" in report.demoted
    # Every piece came whole from the coordinator's copy at last.
    for p in pieces:
        assert swarm.coordinator.sent_bytes[p.file] >= p.size


def test_a_corrupting_mirror_without_a_copy_never_gives_a_corrupt_piece(swarm: Swarm) -> None:
    for f in swarm.hub.root.iterdir():
        swarm.hub.corrupt.add(f.name)
    with pytest.raises(PieceCorruptError):
        swarm.fetch(LayerRange(1, 2), "w")
    # Through the coordinator the bytes were the mirror's, as corrupt: nothing in place.
    assert not any(p.suffix == ".gguf" for p in (swarm.tmp / "w").iterdir())


@pytest.mark.parametrize("keep", [True])  # --keep-pieces
def test_another_file_at_the_url_is_caught_by_its_size(swarm: Swarm, tmp_path: Path) -> None:
    # Larger than the real one, so every range asked for lies inside it.
    other = write_rich_model(tmp_path / "other.gguf", n_layer=6, n_embd=256)
    for f in swarm.hub.root.iterdir():
        shutil.copy(other, f)
    swarm.hub.reset_counters()

    report = swarm.fetch(LayerRange(1, 3), "w")

    pieces = swarm.assert_pieces("w", LayerRange(1, 3))
    assert "another file" in report.demoted
    assert report.mirror_bytes == 0  # refused before its bytes were taken
    assert report.coordinator_bytes >= sum(p.size for p in pieces)


@pytest.mark.parametrize("keep", [True])  # --keep-pieces
def test_a_failing_mirror_is_demoted_after_a_run_of_errors(swarm: Swarm) -> None:
    swarm.hub.reset_counters()
    for f in swarm.hub.root.iterdir():
        swarm.hub.status_override[f.name] = 503

    report = swarm.fetch(LayerRange(0, 2), "w", parallel=1, retries=3)

    swarm.assert_pieces("w", LayerRange(0, 2))
    assert "503" in report.demoted
    assert sum(swarm.hub.requests.values()) == 3  # three in a row, then never again
    assert report.mirror_bytes == 0


def test_a_dropped_mirror_link_resumes_from_the_mirror(swarm: Swarm) -> None:
    victim = swarm.manifest.piece("blk.001")
    assert swarm.manifest.mirror is not None
    ranges = swarm.manifest.mirror.pieces[victim.name]
    url_file = swarm.manifest.mirror.files[ranges.spans[0].file].url.rsplit("/", 1)[1]
    swarm.fetch(LayerRange(1, 2), "w", only=["shared"])  # so the cut falls on blk.001
    swarm.hub.reset_counters()
    swarm.hub.fail_after_bytes[url_file] = 5000

    report = swarm.fetch(LayerRange(1, 2), "w", parallel=1)

    swarm.assert_pieces("w", LayerRange(1, 2))
    assert report.demoted == ""
    assert report.coordinator_bytes == header_bytes(swarm.manifest, [victim])
    # The cut range was asked again from where the link dropped, not from its start.
    asked = [r for r in swarm.hub.ranges[url_file] if r is not None]
    starts = [int(r.split("=")[1].split("-")[0]) for r in asked]
    assert any(b == a + 5000 for a, b in itertools.pairwise(starts))
    # Nothing received twice: the bytes before the drop were kept.
    assert report.mirror_bytes == mirror_read_bytes(swarm.manifest, [victim])


def test_a_stalled_mirror_is_left_after_its_timeout_and_resumed(swarm: Swarm) -> None:
    assert swarm.manifest.mirror is not None
    swarm.hub.reset_counters()
    for f in swarm.hub.root.iterdir():
        swarm.hub.stall_after_bytes[f.name] = 3000

    report = swarm.fetch(LayerRange(0, 1), "w", parallel=1, timeout=0.5)

    swarm.assert_pieces("w", LayerRange(0, 1))
    assert report.demoted == ""
    assert report.mirror_bytes == mirror_read_bytes(
        swarm.manifest, swarm.manifest.pieces_for(LayerRange(0, 1))
    )


def test_a_url_that_is_not_https_or_not_a_model_is_refused(swarm: Swarm) -> None:
    with pytest.raises(ModelNotHostable, match="https"):
        register("http://127.0.0.1:1/x.gguf", swarm.tmp / "data2")
    (swarm.hub.root / "notes.gguf").write_bytes(b"not a model at all" * 100)
    with pytest.raises(ModelNotHostable, match="GGUF"):
        register(f"{swarm.hub.url}/notes.gguf", swarm.tmp / "data2", session=swarm.mirror)


def test_the_coordinator_api_serves_a_registered_model_it_keeps_no_copy_of(
    swarm: Swarm, tls: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sangama coordinator --model URL` as serve.build makes it: the manifest carries the
    mirror, and the pieces endpoint builds any range of a piece from header and mirror."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))  # the hub's test CA
    url = f"{swarm.hub.url}/{swarm.model_file}"
    options = CoordinatorOptions(data_dir=swarm.tmp / "coord", model=url, admin_password="pw")
    coord, _, _ = build(options)
    try:
        assert coord.model.remote is not None
        assert not any(p.suffix == ".gguf" for p in coord.model.directory.iterdir())
        http = TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)
        coord.store.set_setting(ADMIN_TOKEN, hash_token("admin"))
        made = http.post(
            "/api/v1/invites",
            json={"role": "worker", "uses": 1, "expires": "1d"},
            headers={"Authorization": "Bearer admin"},
        )
        secret = inv.InviteCode.decode(made.json()["code"]).secret
        key = auth.new_private_key()
        csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
        joined = http.post("/api/v1/join", json={"secret": secret, "csr_pem": csr}).json()
        node = {"X-Sangama-Node": joined["node_id"], "Authorization": f"Bearer {joined['token']}"}
        name = coord.model.name
        manifest = Manifest.from_json(
            http.get(f"/api/v1/models/{name}/manifest", headers=node).text
        )
        assert manifest == swarm.manifest and manifest.mirror is not None
        piece = manifest.piece("blk.002")
        want = (swarm.sliced / piece.file).read_bytes()
        base = f"/api/v1/models/{name}/pieces/{piece.file}"
        whole = http.get(base, headers=node)
        assert whole.status_code == 200 and whole.content == want
        head = manifest.mirror.pieces[piece.name].header
        r = http.get(base, headers={**node, "Range": f"bytes=0-{head - 1}"})
        assert r.status_code == 206 and r.content == want[:head]
        r = http.get(base, headers={**node, "Range": "bytes=1000-"})
        assert r.status_code == 206 and r.content == want[1000:]
        r = http.get(base, headers={**node, "Range": f"bytes={piece.size}-"})
        assert r.status_code == 416
    finally:
        coord.store.close()
