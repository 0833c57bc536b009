"""Join storm: N volunteers join at once and fetch their stages' pieces, the coordinator's
upload capped; with the model registered by URL (tensor bytes from the mirror, capped
too) side by side with the coordinator serving every byte itself.

One synthetic llama model (random bytes as weights, bench/slice.py's fixture) is
published on a loopback HTTPS server standing in for the hub, and sliced locally for the
coordinator-only run. Both servers cap their total upload with one token bucket each
(every connection shares it, as one uplink). The volunteers are threads of this process,
each running the worker's own download (coordinator.client.mirror.fetch_pieces) for an
even share of the layers, all started together; "ready" is every stage's pieces
downloaded and verified (what a worker needs before it assembles and serves). Reported
per mode: seconds until the last stage is ready, each stage's seconds, and bytes served
by each source (counted by the servers); registering the model (headers read, each
piece hashed once from the mirror) is reported apart, as it happens before anyone joins.
Then one volunteer dies and its replacement fetches that stage: from the coordinator
alone, and from a peer holding the stage (a warm spare's piece server, its upload capped).
Not a test: figures depend on the machine; rates are MB/s (10^6 bytes).

    .venv/bin/python bench/join_storm.py [--volunteers 8] [--coordinator-mbps 5]
        [--mirror-mbps 20] [--peer-mbps 20] [--model-mb 64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests
from starlette.types import Receive, Scope, Send

from app.serving.piece_server import PieceServer
from bench.slice import write_fixture
from coordinator.client.mirror import FetchReport, fetch_pieces
from coordinator.client.peer_pieces import peers_of
from coordinator.contract import PieceSource
from coordinator.server.remote_model import RemotePieces, local_piece, piece_response, register
from core.gguf_slices import slice_model
from core.manifest import Manifest, PieceInfo
from core.model_inputs import stage_ranges
from core.types import LayerRange
from net import auth
from net.rate import TokenBucket, bucket_for
from tests.support.range_server import RangeServer
from tests.support.tls_files import loopback_tls

N_EMBD, N_FF, N_VOCAB = 1024, 2816, 8000
MB = 1_000_000


class CappedServer(RangeServer):
    """A RangeServer whose body bytes, over all connections, go out at most `rate` bytes
    a second; with `remote`, pieces it has no file for are built as the coordinator's
    pieces endpoint builds them (header from memory, tensor bytes from the mirror)."""

    def __init__(
        self,
        root: Path,
        rate: float,
        tls: tuple[Path, Path] | None = None,
        remote: RemotePieces | None = None,
        sizes: dict[str, int] | None = None,
    ) -> None:
        super().__init__(root, tls)
        self.bucket: TokenBucket = bucket_for(rate)
        self.remote = remote
        self.sizes = sizes or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = str(scope.get("path", "")).lstrip("/")
        if (
            scope["type"] != "http"
            or self.remote is None
            or local_piece(self.root, name, self.sizes.get(name, -1))
        ):
            await super().__call__(scope, receive, send)
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        with self._lock:
            self.requests[name] += 1
        response = piece_response(self.remote, name, headers.get("range"))
        await response(scope, receive, self._faulty_send(send, name, None, None, False))

    async def _send_body(self, send: Send, name: str, message: MutableMapping[str, Any]) -> None:
        with self._lock:
            wait = self.bucket.reserve(len(message.get("body", b"")), time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)
        await super()._send_body(send, name, message)


def storm(
    coordinator_url: str,
    manifest: Manifest,
    mirror_session: requests.Session,
    volunteers: int,
    out: Path,
) -> dict[str, Any]:
    """Every volunteer fetches its stage at once; seconds until each is ready."""
    cuts = [round(i * manifest.facts.n_layer / volunteers) for i in range(volunteers + 1)]
    ranges: list[LayerRange] = stage_ranges(manifest.facts, cuts)
    start = threading.Event()
    t0 = 0.0

    def one(i: int) -> tuple[float, FetchReport]:
        start.wait()
        with requests.Session() as coord:
            report = fetch_pieces(
                coord,
                coordinator_url,
                manifest.mirror,
                manifest.pieces_for(ranges[i]),
                out / f"volunteer-{i}",
                mirror_session=mirror_session,
                timeout=120.0,
            )
        return time.monotonic() - t0, report

    with ThreadPoolExecutor(volunteers) as pool:
        futures = [pool.submit(one, i) for i in range(volunteers)]
        t0 = time.monotonic()
        start.set()
        results = [f.result() for f in futures]
    return {
        "all_ready_s": round(max(s for s, _ in results), 2),
        "stage_ready_s": [round(s, 2) for s, _ in results],
        "stages": [f"{r.start}-{r.stop - 1}" for r in ranges],
        "client_mirror_bytes": sum(r.mirror_bytes for _, r in results),
        "client_coordinator_bytes": sum(r.coordinator_bytes for _, r in results),
        "demoted": sorted({r.demoted for _, r in results if r.demoted}),
    }


def _always(listed: tuple[PieceSource, ...]) -> Callable[[PieceInfo], tuple[PieceSource, ...]]:
    return lambda _piece: listed


def replacement(
    coordinator_url: str,
    manifest: Manifest,
    volunteers: int,
    held: Path,
    peer_rate: float,
    out: Path,
) -> dict[str, Any]:
    """One volunteer of the storm dies; its replacement fetches the stage's pieces, from
    the coordinator alone and then from a peer that holds them (a warm spare that stood
    by for that stage, as app/serving/piece_server.py serves them: mutual TLS, its upload
    capped at `peer_rate`). `held`: the dead volunteer's folder, the spare's copy."""
    cuts = [round(i * manifest.facts.n_layer / volunteers) for i in range(volunteers + 1)]
    k = volunteers // 2
    stage = stage_ranges(manifest.facts, cuts)[k]
    pieces = manifest.pieces_for(stage)
    ca = auth.create_ca("join storm")
    ca_pem = auth.certificate_pem(ca.certificate)

    def node(name: str) -> auth.CertifiedKey:
        key = auth.new_private_key()
        return auth.CertifiedKey(
            auth.issue_node_certificate(ca, name, key.public_key(), "worker"), key
        )

    spare = PieceServer(node("spare"), ca_pem, "127.0.0.1", upload_bytes_per_s=int(peer_rate))
    spare.offer("storm", held, manifest)
    spare.start()
    me = node("replacement")
    try:
        result: dict[str, Any] = {"stage": f"{stage.start}-{stage.stop - 1}"}
        for label, listed in (
            ("without_peers", (PieceSource("coordinator"),)),
            (
                "with_peers",
                (PieceSource("peer", "spare", spare.address), PieceSource("coordinator")),
            ),
        ):
            peers = peers_of(me, ca_pem, "storm", _always(listed))
            t = time.monotonic()
            with requests.Session() as coord:
                report = fetch_pieces(
                    coord, coordinator_url, None, pieces, out / label, timeout=120.0, peers=peers
                )
            result[label] = {
                "ready_s": round(time.monotonic() - t, 2),
                "peer_bytes": report.peer_bytes,
                "coordinator_bytes": report.coordinator_bytes,
            }
    finally:
        spare.stop()
    result["speedup"] = round(
        result["without_peers"]["ready_s"] / max(result["with_peers"]["ready_s"], 1e-3), 2
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--volunteers", type=int, default=8)
    ap.add_argument("--coordinator-mbps", type=float, default=5.0)
    ap.add_argument("--mirror-mbps", type=float, default=20.0)
    ap.add_argument("--peer-mbps", type=float, default=20.0, help="a peer's upload cap")
    ap.add_argument("--model-mb", type=float, default=64.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="join-storm-", dir=args.dir))
    try:
        hub = work / "hub"
        hub.mkdir()
        per_block = 4 * (N_EMBD * N_EMBD // 32 * 18) + 3 * (N_FF * N_EMBD // 32 * 18)
        n_layer = max(args.volunteers, round(args.model_mb * MB / per_block))
        size = write_fixture(hub / "storm.gguf", n_layer, N_EMBD, N_FF, N_VOCAB)
        sliced = work / "sliced"
        plain = slice_model(hub / "storm.gguf", sliced)
        tls = loopback_tls(work / "tls")
        sizes = {p.file: p.size for p in plain.pieces}
        result: dict[str, Any] = {
            "volunteers": args.volunteers,
            "model_bytes": size,
            "n_layer": n_layer,
            "coordinator_cap_mbps": args.coordinator_mbps,
            "mirror_cap_mbps": args.mirror_mbps,
            "cpus": os.cpu_count(),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        }
        with requests.Session() as mirror_http:
            mirror_http.verify = str(tls.ca)
            # Coordinator only: every byte over the coordinator's capped uplink.
            coord = CappedServer(sliced, args.coordinator_mbps * MB)
            coord.start()
            try:
                only = storm(coord.url, plain, mirror_http, args.volunteers, work / "a")
                only["coordinator_sent_bytes"] = sum(coord.sent_bytes.values())
                only["mirror_sent_bytes"] = 0
                if args.volunteers > 1:
                    held = work / "a" / f"volunteer-{args.volunteers // 2}"
                    result["replacement"] = replacement(
                        coord.url, plain, args.volunteers, held, args.peer_mbps * MB, work / "r"
                    )
            finally:
                coord.stop()
            # Registered by URL: tensor bytes from the capped mirror, headers from the
            # coordinator (which keeps no piece).
            mirror = CappedServer(hub, args.mirror_mbps * MB, tls.pair)
            mirror.start()
            try:
                t = time.monotonic()
                _, folder, manifest, remote = register(
                    f"{mirror.url}/storm.gguf", work / "data", session=mirror_http
                )
                registering = {
                    "seconds": round(time.monotonic() - t, 2),
                    "mirror_sent_bytes": sum(mirror.sent_bytes.values()),
                    "same_pieces_as_sliced": manifest.pieces == plain.pieces,
                }
                mirror.reset_counters()
                coord = CappedServer(folder, args.coordinator_mbps * MB, remote=remote, sizes=sizes)
                coord.start()
                try:
                    from_mirror = storm(
                        coord.url, manifest, mirror_http, args.volunteers, work / "b"
                    )
                    from_mirror["coordinator_sent_bytes"] = sum(coord.sent_bytes.values())
                    from_mirror["mirror_sent_bytes"] = sum(mirror.sent_bytes.values())
                finally:
                    coord.stop()
            finally:
                mirror.stop()
        result["coordinator_only"] = only
        result["registering_by_url"] = registering
        result["mirror"] = from_mirror
        result["speedup_all_ready"] = round(only["all_ready_s"] / from_mirror["all_ready_s"], 2)
        result["coordinator_bytes_saved"] = (
            only["coordinator_sent_bytes"] - from_mirror["coordinator_sent_bytes"]
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"{args.volunteers} volunteers, model {size / MB:.0f} MB ({n_layer} layers), "
        f"coordinator capped at {args.coordinator_mbps} MB/s, mirror at {args.mirror_mbps} MB/s"
    )
    print(f"{'':26}{'coordinator only':>18}{'mirror':>14}")
    for label, key in (
        ("every stage ready, s", "all_ready_s"),
        ("coordinator sent, MB", "coordinator_sent_bytes"),
        ("mirror sent, MB", "mirror_sent_bytes"),
    ):
        a, b = result["coordinator_only"][key], result["mirror"][key]
        if key.endswith("bytes"):
            a, b = a / MB, b / MB
        print(f"{label:26}{a:>18.2f}{b:>14.2f}")
    rep = result.get("replacement")
    if rep is not None:
        print(
            f"replacing the volunteer of layers {rep['stage']}: "
            f"{rep['without_peers']['ready_s']} s from the coordinator, "
            f"{rep['with_peers']['ready_s']} s from a peer (capped at {args.peer_mbps} MB/s), "
            f"{rep['with_peers']['coordinator_bytes'] / MB:.1f} MB from the coordinator"
        )
    reg = result["registering_by_url"]
    print(
        f"registering by URL (before the storm): {reg['seconds']} s, "
        f"{reg['mirror_sent_bytes'] / MB:.1f} MB from the mirror; "
        f"pieces identical to sliced: {reg['same_pieces_as_sliced']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
