"""bench/engine_thread.py's accounting: CPU time per thread of a process, from /proc."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bench.engine_thread import thread_cpu_ms

pytestmark = pytest.mark.unit


def test_a_busy_thread_is_charged_and_a_sleeping_one_is_not() -> None:
    stop = threading.Event()

    def spin() -> None:
        deadline = time.thread_time() + 0.15
        while time.thread_time() < deadline:
            pass
        stop.wait(5)

    busy = threading.Thread(target=spin)
    idle = threading.Thread(target=stop.wait, args=(5,))
    busy.start()
    idle.start()
    try:
        deadline = time.monotonic() + 10
        comm = Path(f"/proc/self/task/{busy.native_id}/comm").read_text().strip()
        busy_key, idle_key = f"{comm}-{busy.native_id}", f"{comm}-{idle.native_id}"
        while thread_cpu_ms(os.getpid()).get(busy_key, 0.0) < 140:
            assert time.monotonic() < deadline, "the spinning thread was never charged"
            time.sleep(0.02)
        seen = thread_cpu_ms(os.getpid())
        assert "loop" in seen  # the process's own thread, under the name the bench reads
        assert seen[idle_key] < 50  # start-up only, not its wait
    finally:
        stop.set()
        busy.join()
        idle.join()
