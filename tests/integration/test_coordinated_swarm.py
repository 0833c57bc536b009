"""The whole front door with real processes: a coordinator, invites on the command line,
`sangama join` refusals, workers that join and get stages from placement, a client that
asks for a route, and a spare taking over when a worker goes silent."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client.route import fetch_route
from app.client.swarm_client import SwarmClient
from app.identity import Identity, join_swarm
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from coordinator import invites as inv
from coordinator.server.store import Invite, Store
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]


def sangama(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny8.gguf", n_layer=8)


@pytest.fixture(scope="module")
def coord(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    data = tmp_path_factory.mktemp("coordinator")
    c = CoordinatorProcess.start(
        data,
        model,
        min_stages=2,
        extra_args=["--spares", "1", "--stale-after", "2", "--dead-after", "4"],
    )
    yield c
    c.stop()


def _invite_cli(coord: CoordinatorProcess, role: str = "worker", uses: int = 1) -> str:
    r = sangama(
        "invite",
        "create",
        "--role",
        role,
        "--uses",
        str(uses),
        "--expires",
        "1d",
        "--data",
        str(coord.data_dir),
        "--coordinator",
        coord.url,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]  # the code is the last line


def test_join_refusals_exit_non_zero_with_a_one_line_reason(
    coord: CoordinatorProcess, tmp_path: Path
) -> None:
    code = _invite_cli(coord)
    ok = sangama("join", code, "--identity", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stderr
    assert Identity.load(tmp_path / "a").role == "worker"

    def refused(code: str) -> str:
        r = sangama("join", code, "--identity", str(tmp_path / "x"))
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        return lines[0]

    assert "already been used" in refused(code)
    decoded = inv.InviteCode.decode(code)
    forged = inv.InviteCode(decoded.coordinator, decoded.ca_fingerprint, "made-up-secret").encode()
    assert "not known" in refused(forged)
    assert "damaged" in refused(code[:-3] + ("AAA" if not code.endswith("AAA") else "BBB"))
    wrong_pin = inv.InviteCode(decoded.coordinator, "0" * 64, decoded.secret).encode()
    assert "fingerprint" in refused(wrong_pin)

    revoked = _invite_cli(coord)
    listing = sangama("invite", "list", "--data", str(coord.data_dir)).stdout
    last_id = int(listing.strip().splitlines()[-1].split()[0])
    assert sangama("invite", "revoke", str(last_id), "--data", str(coord.data_dir)).returncode == 0
    assert "revoked" in refused(revoked)

    expired = _invite_cli(coord)
    store = Store(f"sqlite:///{coord.data_dir / 'coordinator.db'}")
    with store.session() as s:
        row = (
            s.query(Invite)
            .filter(Invite.secret_hash == inv.hash_secret(inv.InviteCode.decode(expired).secret))
            .one()
        )
        row.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    store.close()
    assert "expired" in refused(expired)


async def _start_worker(coord: CoordinatorProcess, wd: Path, name: str, wait: bool) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180, wait_ready=wait)


def test_workers_join_get_stages_and_a_spare_takes_over(
    coord: CoordinatorProcess, model: Path, tmp_path: Path
) -> None:
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, 6).tokens)
    whole.shutdown()

    async def scenario() -> tuple[list[int], list[int], list[str], list[str], str]:
        # Two workers are needed before placement assigns anyone (min_stages=2): start them
        # together; the third joins as the spare and gets no stage yet.
        workers = list(
            await asyncio.gather(*(_start_worker(coord, tmp_path, f"w{i}", True) for i in range(2)))
        )
        workers.append(await _start_worker(coord, tmp_path, "w2", False))
        try:
            client_code = coord.admin.create_invite("client")["code"]
            loop = asyncio.get_running_loop()
            me = await loop.run_in_executor(None, join_swarm, client_code, tmp_path / "client")

            async def tokens() -> tuple[list[int], list[str]]:
                route, _ = await loop.run_in_executor(None, fetch_route, me)
                async with SwarmClient(me.credentials(), route) as client:
                    out = [t async for ev in client.generate(PROMPT, 6) for t in ev.tokens]
                return out, [s.node_id for s in route.stages]

            before, chain = await tokens()
            # Kill one stage of the chain: the coordinator marks it gone and the spare serves.
            victim = next(w for w in workers[:2] if w.ready_line.split()[1] in chain)
            victim.process.kill()
            await victim.process.wait()
            after: list[int] = []
            new_chain: list[str] = []
            for _ in range(60):
                await asyncio.sleep(1)
                try:
                    after, new_chain = await tokens()
                    if victim.ready_line.split()[1] not in new_chain:
                        break
                except Exception:
                    continue  # the chain is being rebuilt
            # `sangama status` as the spare that took over sees its stage and the route.
            loop = asyncio.get_running_loop()
            status = await loop.run_in_executor(
                None, sangama, "status", "--identity", str(tmp_path / "w2")
            )
            return before, after, chain, new_chain, status.stdout
        finally:
            for w in workers:
                await w.stop()

    before, after, chain, new_chain, status = asyncio.run(scenario())
    me = Identity.load(tmp_path / "w2")
    assert f"node        {me.node_id} (worker)" in status, status
    assert "certificate valid until" in status
    assert "stage       layers" in status and "route" in status and "->" in status
    assert before == expected  # the swarm equals the whole model
    assert len(chain) == 2 and len(new_chain) == 2 and set(new_chain) != set(chain)
    assert after == expected
    swarm = coord.admin.swarm()
    health = {n["node_id"]: n["health"] for n in swarm["nodes"]}
    assert health[next(iter(set(chain) - set(new_chain)))] in ("stale", "gone")
    # The stage that served throughout said what runs it (app/compute.py, by heartbeat).
    survivor = next(n for n in swarm["nodes"] if n["node_id"] in set(chain) & set(new_chain))
    assert survivor["backend"], survivor
    assert 0 < survivor["n_layers"] < 8 and survivor["gpu_layers"] <= survivor["n_layers"]
