"""No orphans: a `sangama` child started by app/lab/processes.py (as `sangama demo` starts
its coordinator and workers) ends when its parent is killed with SIGKILL, by the kernel's
parent-death signal on Linux and, with that switched off, by the stdin-pipe watch alone
(the mechanism Windows relies on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.ports import free_tcp_port
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PARENT = """
import asyncio, sys
from pathlib import Path
import app.lab.processes as processes
from app.lab.processes import spawn_sangama

if sys.argv[1] == "pipe-only":
    processes.child_preexec = lambda _parent: None  # leave only the stdin-pipe watch

async def main() -> None:
    wd = Path(sys.argv[2])
    child = await spawn_sangama(
        "coordinator",
        ["coordinator", "--host", "127.0.0.1", "--port", sys.argv[3], "--data", str(wd / "c"),
         "--model", sys.argv[4]],
        wd / "coordinator.log",
        120,
    )
    print(child.process.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state  # a zombie has ended; only its exit status is left


@pytest.mark.parametrize("mode", ["both", "pipe-only"])
def test_children_end_when_the_parent_is_killed(mode: str, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", n_layer=2)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, str(tmp_path), str(free_tcp_port()), str(model)],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(200):
            if _gone(child):
                break
            time.sleep(0.1)
        assert _gone(child), f"child {child} outlived its parent ({mode})"
    finally:
        parent.kill()
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)
