"""bench/rpc_compare.py's result rows and bench/tcp_delay.py's forwarding (no llama.cpp)."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from bench.rpc_build import RECIPES, binaries, cache_dir
from bench.rpc_compare import Row, as_json, table
from bench.tcp_delay import delayed_links

pytestmark = pytest.mark.unit


def test_ratio_is_sangama_over_rpc_and_json_carries_it_per_delay() -> None:
    rows = [Row(0.0, 30.0, 20.0), Row(5.0, 12.0, 16.0), Row(10.0, 7.5, 0.0)]
    assert [r.ratio for r in rows[:2]] == [1.5, 0.75]
    assert rows[2].ratio == float("inf")  # RPC made no progress: never a division error
    doc = json.loads(json.dumps(as_json(rows[:2], {"model": "m"})))
    assert doc["model"] == "m"
    assert [(r["delay_ms"], r["sangama_tps"], r["rpc_tps"], r["ratio"]) for r in doc["rows"]] == [
        (0.0, 30.0, 20.0, 1.5),
        (5.0, 12.0, 16.0, 0.75),
    ]
    lines = table(rows[:2])
    assert len(lines) == 3 and "ratio" in lines[0]
    assert lines[1].split()[-1] == "1.50" and lines[2].split()[-1] == "0.75"


def test_with_rounds_the_ratio_is_the_median_of_the_rounds_ratios() -> None:
    """Each round's pair is taken seconds apart; the medians of tok/s come from different
    rounds, so their quotient is not the figure."""
    row = Row(5.0, 20.0, 18.0, round_ratios=(1.4, 0.9, 1.2))
    assert row.ratio == 1.2
    assert json.loads(json.dumps(as_json([row], {})))["rows"][0]["round_ratios"] == [1.4, 0.9, 1.2]


def test_the_build_cache_is_named_by_its_recipe_and_empty_until_built(tmp_path: object) -> None:
    assert cache_dir().parent.name == "rpc"
    assert {name for name, *_ in RECIPES} == {"ggml-rpc-server", "libggml-rpc.so"}
    assert binaries(tmp_path) is None  # type: ignore[arg-type]


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, int(srv.getsockname()[1])


@pytest.mark.parametrize("delay_ms", [0.0, 3.0])
def test_tcp_lanes_carry_every_byte_in_order_both_ways(delay_ms: float) -> None:
    srv, port = _echo_server()
    payload = bytes(range(256)) * 800  # 200 KB: many reads, many lane entries
    with (
        srv,
        delayed_links([("127.0.0.1", port)], delay_ms) as (link,),
        socket.create_connection(link, 5) as c,
    ):
        c.sendall(payload)
        c.shutdown(socket.SHUT_WR)  # the end travels through the lanes too
        got = bytearray()
        while data := c.recv(65536):
            got += data
    assert bytes(got) == payload
