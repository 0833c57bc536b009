"""One coordinator, two models (`sangama coordinator --model A --model B`): real workers
split between the two chains, and a client getting from each model the tokens that
model gives run whole, directly and through the OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.openai_api import create_openai_app
from app.api.openai_serve import other_models
from app.api.swarm_backend import SwarmBackend
from app.client.route import fetch_route
from app.client.swarm_client import SwarmClient
from app.identity import Identity, join_swarm
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from core.tokenizer import Tokenizer
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
LAYERS = {"tiny8": 8, "tiny4": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("m")
    return {
        "tiny8": write_tiny_model(folder / "tiny8.gguf", n_layer=8, seed=0),
        "tiny4": write_tiny_model(folder / "tiny4.gguf", n_layer=4, seed=7),
    }


@pytest.fixture(scope="module")
def coord(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    c = CoordinatorProcess.start(
        tmp_path_factory.mktemp("coordinator"),
        models["tiny8"],
        min_stages=2,
        extra_args=["--model", str(models["tiny4"])],
    )
    yield c
    c.stop()


def whole(path: Path, n_layer: int) -> list[int]:
    pipeline = build_pipeline([path], [LayerRange(0, n_layer)], n_layer, 512, 64, 1, True)
    try:
        return list(pipeline.generate(PROMPT, 6).tokens)
    finally:
        pipeline.shutdown()


async def _start_worker(coord: CoordinatorProcess, wd: Path, name: str) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180, wait_ready=True)


async def _through_the_api(me: Identity) -> dict[str, str]:
    """Each model's answer through the OpenAI-compatible API, as `sangama api` builds it
    for a joined client: /v1/models lists both, and a request's model picks one."""
    loop = asyncio.get_running_loop()
    default, tokenizer = await loop.run_in_executor(None, fetch_route, me)
    more = await loop.run_in_executor(None, other_models, me, default)
    opened = [(default, tokenizer), *more]
    backends = [
        SwarmBackend(me.credentials(), route, Tokenizer.from_gguf(path)) for route, path in opened
    ]
    transport = httpx.ASGITransport(app=create_openai_app(backends))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            listed = (await http.get("/v1/models")).json()
            assert [m["id"] for m in listed["data"]] == ["tiny8", "tiny4"]
            texts = {}
            for name in ("tiny8", "tiny4"):
                # Greedy and no repetition penalty, as the whole model ran.
                body: dict[str, Any] = {"model": name, "prompt": PROMPT, "max_tokens": 6}
                body |= {"temperature": 0, "repetition_penalty": 1.0}
                answer = (await http.post("/v1/completions", json=body, timeout=60)).json()
                assert answer["model"] == name, answer
                texts[name] = answer["choices"][0]["text"]
            unknown = await http.post("/v1/completions", json={**body, "model": "nope"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
            return texts
    finally:
        for b in backends:
            await b.aclose()
            b.tokenizer.close()


def _settled(swarm: dict[str, Any]) -> bool:
    """Both models have a two-stage chain and every stage serves its layers."""
    serving = {n["node_id"]: n["n_layers"] for n in swarm["nodes"]}
    return len(swarm["models"]) == 2 and all(
        len(m["plan"]) == 2
        and all(serving.get(s["node_id"]) == s["layers"][1] - s["layers"][0] for s in m["plan"])
        for m in swarm["models"]
    )


def test_one_coordinator_serves_two_models_each_as_run_whole(
    coord: CoordinatorProcess, models: dict[str, Path], tmp_path: Path
) -> None:
    expected = {name: whole(path, LAYERS[name]) for name, path in models.items()}
    assert expected["tiny8"] != expected["tiny4"]

    async def scenario() -> tuple[dict[str, list[int]], dict[str, list[str]], Any, Any]:
        # The first model's chain fills first; the next two workers make the second's.
        workers = list(
            await asyncio.gather(*(_start_worker(coord, tmp_path, f"w{i}") for i in range(2)))
        )
        try:
            workers += await asyncio.gather(
                *(_start_worker(coord, tmp_path, f"w{i}") for i in range(2, 4))
            )
            loop = asyncio.get_running_loop()
            deadline = time.monotonic() + 240
            while not _settled(coord.admin.swarm()):
                assert time.monotonic() < deadline, coord.admin.swarm()
                await asyncio.sleep(1.0)
            code = coord.admin.create_invite("client")["code"]
            me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "client")
            listed = await loop.run_in_executor(None, lambda: me.client().models())
            answers, chains = {}, {}
            for name in ("default", "tiny4"):
                route, _ = await loop.run_in_executor(None, fetch_route, me, name)
                async with SwarmClient(me.credentials(), route) as client:
                    out = [t async for ev in client.generate(PROMPT, 6) for t in ev.tokens]
                answers[route.model] = out
                chains[route.model] = [s.node_id for s in route.stages]
            api = await _through_the_api(me)
            assert api == {k: "".join(f"<{t}>" for t in v) for k, v in answers.items()}
            return answers, chains, listed, coord.admin.swarm()
        finally:
            for w in workers:
                await w.stop()

    answers, chains, listed, swarm = asyncio.run(scenario())
    assert answers == expected  # each model answers as that model run whole
    assert not set(chains["tiny8"]) & set(chains["tiny4"])  # a worker serves one model
    assert [m.name for m in listed.models] == ["tiny8", "tiny4"]
    assert listed.models[0].default and not listed.models[1].default
    assert [m.stages for m in listed.models] == [2, 2]
    assert swarm["model"] == "tiny8" and [m["name"] for m in swarm["models"]] == ["tiny8", "tiny4"]
    serves = {n["node_id"]: n["model"] for n in swarm["nodes"]}
    assert all(serves[n] == name for name, ids in chains.items() for n in ids)
