"""The OpenAI-compatible API in a process of its own, reached over a real socket: it
answers only requests with its API key and a Host header naming its own address, so a
web page cannot use the volunteer's swarm identity through it (DNS rebinding)."""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.api.access import HostRule, key_matches, load_or_create_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from app.api.access import load_or_create_key
    from app.api.openai_serve import serve_api

    class Backend:
        model_name = "tiny"
        tokenizer = None
        context_length = None

    key = load_or_create_key(Path(sys.argv[1]))
    asyncio.run(serve_api(Backend(), "127.0.0.1", 0, api_key=key,
                          ready=lambda port: print(port, flush=True)))
    """
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, Path]]:
    key_file = tmp_path_factory.mktemp("api") / "private" / "api-key"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(key_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield port, key_file.read_text().strip(), key_file
    finally:
        proc.terminate()
        proc.wait(30)


def _get(port: int, host: str, key: str | None) -> tuple[int, dict[str, Any]]:
    """GET /v1/models with exactly this Host header, as a rebinding page would send it."""
    headers = {"Host": host}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v1/models", headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_the_key_is_made_once_and_private(api: tuple[int, str, Path]) -> None:
    _, key, key_file = api
    assert len(key) > 30
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert load_or_create_key(key_file) == key  # read back, not made again


def test_a_foreign_host_header_is_refused_even_with_the_key(api: tuple[int, str, Path]) -> None:
    port, key, _ = api
    for host in (f"rebind.attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
        status, body = _get(port, host, key)
        assert status == 403, host
        assert body["error"] == {**body["error"], "code": "bad_host"}


def test_a_request_without_the_key_is_refused(api: tuple[int, str, Path]) -> None:
    port, key, _ = api
    for sent in (None, "x", key + "x", key[:-1]):
        status, body = _get(port, f"127.0.0.1:{port}", sent)
        assert status == 401
        assert body["error"] == {**body["error"], "code": "invalid_api_key"}


def test_the_key_through_a_local_host_name_is_served(api: tuple[int, str, Path]) -> None:
    port, key, _ = api
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        status, body = _get(port, host, key)
        assert status == 200, host
        assert body["data"] == [{**body["data"][0], "id": "tiny"}]


def test_host_rules() -> None:
    local = HostRule("127.0.0.1", 8000)
    assert local.allows("127.0.0.1:8000") and local.allows("LOCALHOST:8000")
    assert local.allows("[::1]:8000") and local.allows("127.0.0.2:8000")
    for bad in ("127.0.0.1:8001", "evil.example:8000", "", "127.0.0.1:8000@evil", "a b", "[::1"):
        assert not local.allows(bad), bad
    everywhere = HostRule("0.0.0.0", 8000)
    assert everywhere.allows("192.0.2.7:8000") and not everywhere.allows("evil.example:8000")
    assert not HostRule("192.0.2.7", 8000).allows("192.0.2.8:8000")
    assert key_matches("Bearer k1", "k1") and not key_matches("Bearer k2", "k1")
    assert not key_matches("k1", "k1") and not key_matches(None, "k1")


def test_an_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    from app.errors import ConfigError

    key_file = tmp_path / "api-key"
    key_file.mkdir()  # a folder where the file should be
    with pytest.raises(ConfigError):
        load_or_create_key(key_file)
    if os.geteuid() != 0:
        assert not os.access(key_file / "x", os.F_OK)
