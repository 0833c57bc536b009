"""Child `sangama` processes for the demo, tests and benchmarks: start one, wait for its
READY line, keep its stderr in a log file, stop it with SIGTERM. Every child ends with
this process, however this one ends (kill -9 included: app/parent_watch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.errors import AppError
from app.parent_watch import PARENT_WATCH_ENV, child_preexec

LOG_TAIL_LINES = 12
"""Lines of a child's log quoted when it exits before it is ready."""


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    ready_line: str = ""
    stderr_task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; return the exit code."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        if self.stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.stderr_task, 2)
        return code


async def _drain(stream: asyncio.StreamReader, log_path: Path) -> None:
    with open(log_path, "ab") as f:
        while line := await stream.readline():
            f.write(line)
            f.flush()


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a child's log, to quote in an error: a temporary work folder
    (app.lab.local_swarm) is gone by the time anyone reads the path."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "; it ended with:\n" + "\n".join(kept) if kept else ""


async def spawn_sangama(
    name: str,
    args: list[str],
    log_path: Path,
    timeout: float,
    wait_ready: bool = True,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Run `sangama ARGS...` and return once it prints its READY line (or at once);
    `env` adds to this process's environment."""
    parent = os.getpid()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        *args,
        # The child's stdin is a pipe nobody writes to: EOF there means this process is
        # gone, and the child stops itself (app/parent_watch.py); on Linux the kernel
        # also sends it SIGTERM when this process dies.
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", PARENT_WATCH_ENV: "1"},
        preexec_fn=(lambda: child_preexec(parent)) if sys.platform == "linux" else None,
    )
    assert proc.stdout is not None and proc.stderr is not None
    child = Child(name, proc, log_path)
    child.stderr_task = asyncio.get_running_loop().create_task(_drain(proc.stderr, log_path))
    if not wait_ready:
        return child
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            if not line:
                await child.stop()  # waits for its stderr to reach the log
                raise AppError(
                    f"{name} exited before it was ready; see {log_path}{log_tail(log_path)}"
                )
            if line.startswith(b"READY"):
                child.ready_line = line.decode().strip()
                return child
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AppError(f"{name} not ready after {timeout:.0f} s; see {log_path}") from None
