"""bench/token_parts.py's CPU accounting: a process's CPU time and this process's children."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.rpc_client import cpu_ms
from bench.token_parts import _children

pytestmark = pytest.mark.unit


def test_cpu_time_grows_with_work_and_not_with_sleep() -> None:
    before = cpu_ms(os.getpid())
    deadline = time.process_time() + 0.15
    while time.process_time() < deadline:
        pass
    busy = cpu_ms(os.getpid()) - before
    assert busy >= 100  # 150 ms of CPU, counted in clock ticks of 10 ms
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        time.sleep(0.1)
        assert child.pid in _children()
        assert cpu_ms(child.pid) < 400  # a sleeper's start-up, not its 0.5 s of sleep
    finally:
        child.wait(5)
    assert child.pid not in _children()
