"""The coordinator knows whether its swarm can answer: a real coordinator asking its
planned chain for two tokens (coordinator/server/answer_prober.py), two worker
processes on the tiny model. Each worker is reached through a UDP forwarder
(app.lab.wan.proxy, its `--advertise` address); dropping every datagram on the last
stage's forwarder cuts the chain while both workers keep heartbeating (over HTTPS, not
through it): the coordinator must say "cannot answer", naming that stage, well within a
minute, and "can answer" again once the link carries datagrams again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from app.lab.processes import Child, spawn_sangama
from app.lab.wan.proxy import DelayProxy
from app.ports import free_udp_port
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROBE_EVERY_S = 3.0
NOTICE_S = 60.0
"""The operator hears of a broken chain within a minute (probe every 3 s + 20 s budget)."""


async def _until(coord: CoordinatorProcess, pred: Any, within: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    swarm: Any = None
    while loop.time() < deadline:
        swarm = await loop.run_in_executor(None, coord.admin.swarm)
        if pred(swarm):
            return swarm
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not seen within {within:.0f} s; last view: {swarm}")


def test_a_cut_link_shows_as_cannot_answer_while_every_node_heartbeats(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=2,
        extra_args=["--answer-probe-every", str(PROBE_EVERY_S)],
    )

    async def scenario() -> tuple[Any, Any, Any, str]:
        proxies: dict[str, DelayProxy] = {}
        workers: list[Child] = []
        try:
            for name in ("w0", "w1"):
                port, front = free_udp_port(), free_udp_port()
                proxy = DelayProxy(("127.0.0.1", front), ("127.0.0.1", port), 0.0)
                await proxy.start()
                proxies[name] = proxy
            starts = []
            for name, proxy in proxies.items():
                code = coord.admin.create_invite("worker")["code"]
                args = [
                    *("worker", "--join", code, "--identity-dir", str(tmp_path / name)),
                    *("--listen", f"127.0.0.1:{proxy.target[1]}"),
                    *("--advertise", f"127.0.0.1:{proxy.listen[1]}"),
                ]
                starts.append(spawn_sangama(name, args, tmp_path / f"{name}.log", 180))
            workers = list(await asyncio.gather(*starts))
            by_address = {f"127.0.0.1:{p.listen[1]}": n for n, p in proxies.items()}

            answering = await _until(
                coord,
                lambda s: len(s["plan"]) == 2 and (s.get("answer") or {}).get("can_answer"),
                120,
                "the chain answering",
            )
            last = answering["plan"][-1]
            proxies[by_address[last["address"]]].loss = 1.0  # the link to the last stage: cut
            cut_at = time.time()
            broken = await _until(
                coord,
                lambda s: (s.get("answer") or {}).get("can_answer") is False,
                NOTICE_S,
                "cannot answer",
            )
            proxies[by_address[last["address"]]].loss = 0.0
            repaired = await _until(
                coord,
                lambda s: (s.get("answer") or {}).get("can_answer") is True,
                NOTICE_S,
                "can answer again",
            )
            return answering, broken, repaired, str(cut_at)
        finally:
            for w in workers:
                await w.stop()
            for p in proxies.values():
                await p.close()

    try:
        answering, broken, repaired, cut_at = asyncio.run(scenario())
    finally:
        coord.stop()
    last = answering["plan"][-1]["node_id"]
    answer = broken["answer"]
    # Every node still heartbeats: nothing but the probe sees the chain broken.
    assert all(n["health"] == "healthy" for n in broken["nodes"]), broken["nodes"]
    assert len(broken["plan"]) == 2
    assert last in answer["reason"], answer
    assert answer["since"] >= float(cut_at) - 1
    assert answering["answer"]["chain"] == [s["node_id"] for s in answering["plan"]]
    assert repaired["answer"]["reason"] == ""
