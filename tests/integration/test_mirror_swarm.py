"""A swarm serving a model registered by URL, with real processes: `sangama coordinator
--model https://…/model.gguf` (a loopback HTTPS server stands in for the hub) keeps no
piece; two workers join, fetch their pieces' tensor bytes from the hub and serve; a
client's answer equals the whole model's. The hub's byte count shows every tensor byte
came straight from it, once: a fallback through the coordinator would have read the hub
again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.route import fetch_route
from app.client.swarm_client import SwarmClient
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from core.manifest import MANIFEST_FILE, Manifest
from core.piece_sources import piece_segments, plan_reads
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.range_server import serve_dir
from tests.support.tiny_models import write_tiny_model
from tests.support.tls_files import loopback_tls

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]


def mirror_bytes(manifest: Manifest, names: list[str]) -> int:
    assert manifest.mirror is not None
    total = 0
    for name in names:
        reads = plan_reads(piece_segments(manifest.mirror.pieces[name]))
        total += sum(r.stop - r.start for r in reads if r.from_mirror)
    return total


def test_a_swarm_serves_a_model_registered_by_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    model = write_tiny_model(hub_dir / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, 6).tokens)
    whole.shutdown()
    tls = loopback_tls(tmp_path / "tls")
    # Every process started from here trusts the hub's test CA, as they trust the hub's.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))

    with serve_dir(hub_dir, tls.pair) as hub:
        data = tmp_path / "coordinator"
        coord = CoordinatorProcess.start(data, f"{hub.url}/tiny8.gguf", min_stages=2)
        try:
            assert not list(data.rglob("*.gguf"))  # the coordinator keeps no piece
            (manifest_path,) = data.rglob(MANIFEST_FILE)
            manifest = Manifest.load(manifest_path.parent)
            hub.reset_counters()

            async def scenario() -> tuple[list[int], list[LayerRange], list[Child]]:
                async def worker(name: str) -> Child:
                    code = coord.admin.create_invite("worker")["code"]
                    args = ["worker", "--join", code, "--identity-dir", str(tmp_path / name)]
                    # Peers off: every tensor byte comes from the mirror, counted exactly
                    # (test_peer_pieces_swarm.py takes pieces from peers).
                    args.append("--no-peer-pieces")
                    return await spawn_sangama(name, args, tmp_path / f"{name}.log", 180)

                workers = list(await asyncio.gather(worker("w0"), worker("w1")))
                try:
                    loop = asyncio.get_running_loop()
                    code = coord.admin.create_invite("client")["code"]
                    me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "client")
                    route, _ = await loop.run_in_executor(None, fetch_route, me)
                    async with SwarmClient(me.credentials(), route) as client:
                        out = [t async for ev in client.generate(PROMPT, 6) for t in ev.tokens]
                    return out, [s.layers for s in route.stages], workers
                finally:
                    for w in workers:
                        await w.stop()

            tokens, stages, _ = asyncio.run(scenario())
        finally:
            coord.stop()

    assert tokens == expected  # the swarm equals the whole model
    assert len(stages) == 2
    names = [p.name for layers in stages for p in manifest.pieces_for(layers)]
    names.append("embedding")  # the client's, for its tokenizer
    assert hub.sent_bytes["tiny8.gguf"] == mirror_bytes(manifest, names)
    for log in ("w0.log", "w1.log"):
        assert "demoted" not in (tmp_path / log).read_text()
