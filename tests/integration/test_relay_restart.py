"""An answer survives the relay restarting: a real coturn (`sangama relay`'s config), a
coordinator handing out TURN credentials, two relay-only workers whose link between
them runs through coturn, and a joined client. coturn is killed with SIGKILL after the
5th of 24 greedy tokens and started again on the same port; the relayed link is dialled
again (a new ICE session, a new allocation) and the answer completes, equal to the
whole model's. The stall is printed. ~40 s (tiny model, two stages)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from app.cli.relay import RelayError, find_turnserver, relay_config, start_relay
from app.client.connect import avoiding_source
from app.client.recovering import RecoveringClient
from app.client.route import fetch_route
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from coordinator.server.store import Node, Store
from core.types import LayerRange
from tests.integration.test_relay import _free_port, _relay_range
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 24
KILL_AFTER = 5
SECRET = "relay-restart-secret"


def test_coturn_killed_and_restarted_mid_answer_the_answer_completes(tmp_path: Path) -> None:
    try:
        binary = find_turnserver()
    except RelayError as exc:
        pytest.skip(f"coturn cannot be used here: {exc}")
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()

    port = _free_port()
    low, high = _relay_range(port)
    run_dir = tmp_path / "relay"
    run_dir.mkdir()
    cfg = relay_config(
        run_dir,
        listening_ip="127.0.0.1",
        relay_ip="127.0.0.1",
        port=port,
        min_port=low,
        max_port=high,
        shared_secret=SECRET,
        allow_loopback_peers=True,  # the nodes are on loopback
    )
    relays = [start_relay(cfg, run_dir, binary=binary)]
    secret_file = tmp_path / "turn-secret"
    secret_file.write_text(SECRET + "\n")
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=2,
        extra_args=["--turn", f"127.0.0.1:{port}", "--turn-secret-file", str(secret_file)],
    )

    async def worker(name: str) -> Child:
        code = coord.admin.create_invite("worker")["code"]
        args = ["worker", "--join", code, "--identity-dir", str(tmp_path / name), "--relay-only"]
        return await spawn_sangama(name, args, tmp_path / f"{name}.log", 180)

    restart_errors: list[str] = []

    def start_again() -> None:
        # On this (the main) thread: coturn's parent-death signal (app/parent_watch.py)
        # follows the thread that started it, so a helper thread's exit would end it.
        for _ in range(40):  # its TCP listening port may linger a moment after the kill
            try:
                relays.append(start_relay(cfg, run_dir, binary=binary))
                return
            except RelayError as exc:
                restart_errors.append(str(exc))
                time.sleep(0.25)

    async def scenario() -> tuple[list[int], float, RecoveringClient, str]:
        workers = list(await asyncio.gather(worker("w0"), worker("w1")))
        try:
            loop = asyncio.get_running_loop()
            code = coord.admin.create_invite("client")["code"]
            me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "me")
            route, _ = await loop.run_in_executor(None, fetch_route, me)
            assert len(route.stages) == 2
            # The first worker reports its link onward: it must run through the relay.
            store = Store(f"sqlite:///{coord.data_dir / 'coordinator.db'}")
            deadline = time.monotonic() + 30
            path = ""
            while time.monotonic() < deadline and path != "relayed":
                async with RecoveringClient(me.credentials(), route, avoiding_source(me)) as c:
                    _ = [t async for ev in c.generate(PROMPT, 2) for t in ev.tokens]
                await asyncio.sleep(4.5)  # two heartbeats
                with store.session() as s:
                    node = s.get(Node, route.stages[0].node_id)
                    path = "" if node is None else node.path
            store.close()
            client = RecoveringClient(me.credentials(), route, avoiding_source(me))
            out: list[int] = []
            killed_at = gap = 0.0
            async with client:
                async for event in client.generate(PROMPT, N_TOKENS):
                    out.extend(event.tokens)
                    if len(out) == KILL_AFTER:
                        killed_at = time.monotonic()
                        relays[0].proc.send_signal(signal.SIGKILL)
                        relays[0].proc.wait()
                        # Down for a second, as a crashed relay under a supervisor is.
                        loop.call_later(1.0, start_again)
                    elif len(out) == KILL_AFTER + 1:
                        gap = time.monotonic() - killed_at
            return out, gap, client, path
        finally:
            await asyncio.gather(*(w.stop() for w in workers))

    try:
        out, gap, client, path = asyncio.run(scenario())
    finally:
        coord.stop()
        for r in relays:
            r.stop()
    assert path == "relayed"  # the link that was cut ran through coturn
    assert len(relays) == 2, restart_errors  # coturn was killed and started again mid-answer
    assert out == expected  # every token, no error, equal to the whole model
    w0 = (tmp_path / "w0.log").read_text()
    how = "the link re-allocated" if not client.recoveries else "a replay on a new session"
    print(
        f"\ncoturn kill -9 + restart after token {KILL_AFTER}: next token after {gap:.2f} s "
        f"({how}; {len(client.recoveries)} client recoveries; "
        f"worker relinks logged: {w0.count('re-establishing')})"
    )
