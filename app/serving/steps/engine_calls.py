"""Calls into a stage's engine: one at a time, in the order they were made.

The engine is not thread-safe, and a session's open, steps and close must reach it in
order, so every call, steps included, goes to one engine thread. That thread is also
the one whose OpenMP pool computes every graph (docs/engine.md). Steps never run on the
event loop's thread: measured in pairs it saved nothing, and unpinned it made a second
OpenMP team beside the engine thread's (docs/decisions/inline-engine-steps.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class EngineCalls:
    """The engine thread: calls run there one at a time, in the order submitted."""

    def __init__(self, after_each_call: Callable[[], None] | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._after_each_call = after_each_call
        """Run right after every call, on the engine thread: app.serving.machine.cpus
        keeps the compute threads where WorkerConfig.cpus says."""

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Queue a call on the engine thread (from the loop thread)."""
        return self._executor.submit(self._then_after, fn, *args)

    def _then_after(self, fn: Callable[..., T], *args: object) -> T:
        result = fn(*args)
        if self._after_each_call is not None:
            self._after_each_call()
        return result

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run a call on the engine thread and wait for it."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait)
