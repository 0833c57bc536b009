"""`sangama demo`: the whole system on loopback, as an operator and volunteers would run it.

A coordinator starts; the operator creates invites; three workers join with them, get
their stages from placement, download only their pieces from the coordinator and serve;
a client joins, asks for a route and chats. Every part is a real process on real sockets.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from app.client.chat_run import demo_prompt, print_report, stream_answer
from app.client.connect import open_joined_chat
from app.client.route import fetch_route
from app.errors import AppError
from app.identity import join_swarm
from app.lab.processes import Child, spawn_sangama
from app.ports import free_tcp_port
from coordinator.server.serve import ADMIN_TOKEN_FILE
from net.wire.tensors import WireDtype


class OperatorApi:
    """What the operator's page does, as HTTP calls with the admin token."""

    def __init__(self, base_url: str, data_dir: Path) -> None:
        self.base_url = base_url
        self.session = requests.Session()
        self.verify = str(data_dir / "ca" / "ca.pem")
        token = (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.session.request(
            method, f"{self.base_url}{path}", verify=self.verify, timeout=30, **kw
        )
        if r.status_code >= 400:
            raise AppError(f"coordinator refused {method} {path}: {r.text[:200]}")
        return r.json()

    def invite(self, role: str, note: str) -> str:
        return str(
            self.call(
                "POST",
                "/api/v1/invites",
                json={"role": role, "uses": 1, "expires": "1h", "note": note},
            )["code"]
        )


def _say(text: str) -> None:
    print(text, flush=True)


async def _wait_for_route(identity: Any, stages: int, timeout: float = 60.0) -> tuple[Any, Path]:
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while True:
        try:
            route, tok = await loop.run_in_executor(None, fetch_route, identity)
            if len(route.stages) >= stages:
                return route, tok
        except Exception as exc:  # not placed yet: the coordinator says so; try again
            last = exc
        if time.monotonic() > deadline:
            raise AppError(f"no route after {timeout:.0f} s: {last}")
        await asyncio.sleep(1.0)


async def run_demo_swarm(
    model: str,
    stages: int,
    prompt: str | None,
    max_tokens: int,
    dtype: WireDtype,
    api_port: int | None = None,
) -> int:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sangama-demo-") as tmp:
        wd = Path(tmp)
        port = free_tcp_port()
        data = wd / "coordinator"
        children: list[Child] = []
        try:
            _say(f"1. starting the coordinator (model {model!r}, at least {stages} stages) ...")
            coord = await spawn_sangama(
                "coordinator",
                [
                    "coordinator",
                    "--data",
                    str(data),
                    "--port",
                    str(port),
                    "--model",
                    model,
                    "--min-stages",
                    str(stages),
                ],
                wd / "coordinator.log",
                600,
            )
            children.append(coord)
            base = coord.ready_line.split()[1]
            _say(f"   {coord.ready_line}")
            operator = OperatorApi(base, data)
            codes = [operator.invite("worker", f"demo volunteer {i}") for i in range(stages)]
            client_code = operator.invite("client", "demo chat")
            _say(
                f"2. operator created {stages} worker invites and 1 client invite, "
                f"e.g.\n   {codes[0]}"
            )
            _say(
                f"3. {stages} volunteers join, get stages from placement, download their pieces ..."
            )
            workers = await asyncio.gather(
                *(
                    spawn_sangama(
                        f"worker {i}",
                        [
                            "worker",
                            "--join",
                            code,
                            "--identity-dir",
                            str(wd / f"volunteer{i}"),
                            "--threads",
                            "1",
                        ],
                        wd / f"volunteer{i}.log",
                        600,
                    )
                    for i, code in enumerate(codes)
                )
            )
            children.extend(workers)
            # READY NODE ADDRESS layers A-B (core.types.format_layers)
            for w in sorted(workers, key=lambda c: int(c.ready_line.split()[-1].split("-")[0])):
                _, node_id, address, layers = w.ready_line.split(maxsplit=3)
                _say(f"   {node_id} serves {layers} on udp {address}")
            loop = asyncio.get_running_loop()
            identity = await loop.run_in_executor(None, join_swarm, client_code, wd / "client")
            route, tokenizer_path = await _wait_for_route(identity, stages)
            _say(
                f"4. client {identity.node_id} joined; route: "
                + " -> ".join(f"{s.node_id} ({s.layers})" for s in route.stages)
            )
            _say(f"   ready after {time.perf_counter() - t0:.1f} s\n")
            conn = await open_joined_chat(identity, route, tokenizer_path)
            text, chat = demo_prompt(conn.tokenizer, prompt)
            sys.stdout.write(f"Q: {text}\nA: " if chat else text)
            try:
                report = await stream_answer(
                    conn.client, conn.tokenizer, text, max_tokens, dtype, chat_format=chat
                )
            finally:
                await conn.close()
            print_report(report, len(route.stages))
            swarm = operator.call("GET", "/api/v1/swarm")
            _say(
                f"\noperator view: {len(swarm['nodes'])} nodes, plan "
                + ", ".join(f"{s['node_id']}{tuple(s['layers'])}" for s in swarm["plan"])
            )
            if api_port is not None:  # keep the swarm up behind the API until Ctrl+C
                from app.api.openai_serve import serve_identity

                _say("")
                await serve_identity(identity, route, tokenizer_path, port=api_port)
        finally:
            for child in reversed(children):
                await child.stop()
        _say("all processes stopped cleanly")
    return 0
