"""Calls into a stage's engine: one at a time, in the order they were made.

The engine is not thread-safe, and a session's open, steps and close must reach it in
order, so every call goes to one engine thread. A short decode step may instead run on
the event loop's own thread, saving the two cross-thread wake-ups of a hand-off (the
engine thread's, then the loop's), but only when nothing is queued or running on the
engine thread: only the loop thread makes calls, so nothing can overtake it then.

Which steps count as short is `runs_inline`, a pure policy: few rows, and the last such
step took no longer than the loop may stop serving its links. Off by default
(WorkerConfig.inline_step_ms = 0): measured on a busy 2-core machine, a worker whose
loop thread does the compute waits longer for every wake-up (bench/README.md). At more
than one thread WorkerConfig allows it only with `cpus`: a step on the loop thread
starts a second OpenMP team beside the engine thread's, and unpinned the two teams'
threads were seen sharing one core; pinned (app.serving.machine.cpus) every team keeps
the CPUs the plan gives it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

INLINE_MAX_ROWS = 8
"""Steps of more rows (prompt chunks, large batches) always go to the engine thread."""


@dataclass(frozen=True)
class InlinePolicy:
    limit_ms: float
    """The longest a step may hold the event loop; 0: never run a step inline."""
    max_rows: int = INLINE_MAX_ROWS


def runs_inline(policy: InlinePolicy, rows: int, last_short_step_ms: float | None) -> bool:
    """Whether a step of `rows` rows runs on the loop thread. `last_short_step_ms`: how
    long the last step of at most `policy.max_rows` rows took (None: none measured yet,
    so the first one goes to the engine thread and is timed)."""
    if policy.limit_ms <= 0 or rows > policy.max_rows or last_short_step_ms is None:
        return False
    return last_short_step_ms <= policy.limit_ms


class EngineCalls:
    """The engine thread, and a count of calls submitted to it and not yet finished."""

    def __init__(self, after_each_call: Callable[[], None] | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._after_each_call = after_each_call
        """Run right after every call, on the thread that made it (inline steps too):
        app.serving.machine.cpus keeps the compute threads where WorkerConfig.cpus says."""
        self._lock = threading.Lock()
        self._outstanding = 0
        self.inline_calls = 0
        """Steps that ran on the loop thread (stats, tests)."""
        self.after_steps: Callable[[], None] | None = None
        """Run on the engine thread right after a step when nothing else is queued there
        (the step's result is out by then): core.omp_idle's park, where it is enabled."""

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Queue a call on the engine thread (from the loop thread)."""
        with self._lock:
            self._outstanding += 1
        try:
            return self._executor.submit(self._counted, fn, *args)
        except BaseException:
            with self._lock:
                self._outstanding -= 1
            raise

    def _counted(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return self._then_after(fn(*args))
        finally:
            with self._lock:
                self._outstanding -= 1

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run a call on the engine thread and wait for it."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    async def run_step(self, inline: bool, fn: Callable[..., T], *args: object) -> T:
        """Run a step: on this (the loop's) thread when `inline` and the engine thread
        has nothing queued or running, else on the engine thread."""
        if inline:
            with self._lock:
                idle = self._outstanding == 0
            if idle:
                self.inline_calls += 1
                return self._then_after(fn(*args))
        future = self.submit(fn, *args)
        if self.after_steps is not None:
            self._executor.submit(self._after_step_if_alone, self.after_steps)
        return await asyncio.wrap_future(future)

    def _then_after(self, result: T) -> T:
        if self._after_each_call is not None:
            self._after_each_call()
        return result

    def _after_step_if_alone(self, hook: Callable[[], None]) -> None:
        with self._lock:
            alone = self._outstanding == 0
        if alone:  # a queued call goes first: its graph keeps the threads busy anyway
            hook()

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait)
