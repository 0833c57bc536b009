"""An answer survives its middle stage dying, through the product's own entry point:
`sangama api --identity DIR` (the OpenAI API as a joined client, which connects as
chat and the tray do, app.client.connect). Real coordinator, three workers and a spare
serving SmolLM2 (it has a tokenizer: the API speaks text); the middle worker is killed
with SIGKILL after the 5th streamed token of a 40-token greedy answer, and the streamed
text equals the same request answered without a kill."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import keyring
import pytest
import requests
from keyring.backends import fail

from app.identity import join_swarm
from app.lab.processes import Child, spawn_sangama
from tests.support.coordinator_proc import free_port
from tests.support.spare_swarm import SpareSwarm

pytestmark = pytest.mark.e2e  # heavy: SmolLM2 on four workers and the API, ~4-5 min here

N_TOKENS = 40
KILL_AFTER = 5
BODY = {
    "model": "swarm",
    "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
    "max_tokens": N_TOKENS,
    "temperature": 0,
    "stream": True,
}


def _stream(url: str, on_piece: object = None) -> list[str]:
    """The streamed answer's pieces (one per SSE chunk with content)."""
    pieces: list[str] = []
    with requests.post(
        f"{url}/v1/chat/completions", json=BODY, headers=_auth(url), stream=True, timeout=180
    ) as r:
        r.raise_for_status()
        for raw in r.iter_lines():
            if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
                continue
            chunk = json.loads(raw[6:])
            assert "error" not in chunk, chunk  # the person never sees an error
            text = chunk["choices"][0]["delta"].get("content")
            if text:
                pieces.append(text)
                if callable(on_piece):
                    on_piece(len(pieces))
    return pieces


_KEYS: dict[str, Path] = {}
"""The API key file of the API at each URL (made by the API when it starts)."""


def _auth(url: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {_KEYS[url].read_text().strip()}"}


def _join_with_files(code: str, directory: Path) -> None:
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())  # type: ignore[no-untyped-call]
    try:
        join_swarm(code, directory)
    finally:
        keyring.set_keyring(before)


def _wait_for_api(url: str, api: Child, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert api.alive, api.log_path.read_text()
        try:
            if (
                _KEYS[url].exists()
                and requests.get(f"{url}/v1/models", headers=_auth(url), timeout=2).ok
            ):
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"the API did not come up: {api.log_path.read_text()}")


def test_middle_stage_killed_mid_answer_the_api_answer_completes_unchanged(
    tmp_path: Path, smollm2_path: Path
) -> None:
    async def scenario() -> tuple[list[str], list[str], float, str]:
        swarm = await SpareSwarm.start(tmp_path, smollm2_path)
        children: list[Child] = []
        try:
            loop = asyncio.get_running_loop()
            await swarm.settled()
            code = swarm.coord.admin.create_invite("client", uses=2)["code"]
            me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "me")
            route = await swarm.route(me)
            chain = [s.node_id for s in route.stages]
            assert len(chain) == 3
            victim = swarm.worker(chain[1])
            # The API process must find the identity's secrets: in 0600 files, whatever
            # keyring backend this test process happens to have (CI found it missing).
            await loop.run_in_executor(None, _join_with_files, code, tmp_path / "api")
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            _KEYS[url] = tmp_path / "api" / "api-key"
            api_args = ["api", "--identity", str(tmp_path / "api"), "--port", str(port)]
            api = await spawn_sangama("api", api_args, tmp_path / "api.log", 60, wait_ready=False)
            children.append(api)
            await loop.run_in_executor(None, _wait_for_api, url, api)
            expected = await loop.run_in_executor(None, _stream, url)
            killed_at: list[float] = []
            resumed_at: list[float] = []

            def on_piece(n: int) -> None:
                if n == KILL_AFTER:
                    swarm.kill(victim)
                    killed_at.append(time.monotonic())
                elif n == KILL_AFTER + 1:
                    resumed_at.append(time.monotonic())

            got = await loop.run_in_executor(None, _stream, url, on_piece)
            gap = resumed_at[0] - killed_at[0] if resumed_at and killed_at else float("nan")
            return expected, got, gap, victim.ready_line.split()[1]
        finally:
            await asyncio.gather(*(c.stop() for c in children))
            await swarm.stop()

    expected, got, gap, victim = asyncio.run(scenario())
    api_log = (tmp_path / "api.log").read_text()
    assert len(expected) >= KILL_AFTER + 10  # the answer is long enough to kill mid-way
    assert "".join(got) == "".join(expected)  # every piece, no error, unchanged
    assert "answer resumed on" in api_log  # it was recovered, not merely lucky
    resumed = [ln for ln in api_log.splitlines() if "answer resumed on" in ln]
    assert all(
        victim not in ln.split("answer resumed on", 1)[1].split(" after ")[0] for ln in resumed
    )
    print(
        f"\nAPI answer, kill -9 of the middle stage after piece {KILL_AFTER}: "
        f"next piece after {gap:.2f} s"
    )
    for ln in resumed:
        print("  " + ln.strip()[-160:])
