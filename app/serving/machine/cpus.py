"""Keeps a stage's compute threads on the CPUs the operator chose (WorkerConfig.cpus).

The shell around core.cpu_placement: after each step, on the thread that ran it, the
threads of this process are listed (/proc/self/task); that thread is a team leader,
and every thread that Python did not start is a helper of an OpenMP team (llama.cpp's
CPU backend starts them at a leader's first graph and keeps them). Only threads not yet
where the plan puts them are moved, so a step pays one directory listing once the
teams stand. Linux only: the config refuses `cpus` where os.sched_setaffinity is
missing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from app.errors import ConfigError
from core.cpu_placement import format_cpu_list, place_compute_threads

log = logging.getLogger(__name__)

TASKS = "/proc/self/task"


def python_thread_ids() -> set[int]:
    """Native ids of the threads Python started (the loop, the engine thread, executors)."""
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def process_thread_ids() -> set[int]:
    return {int(name) for name in os.listdir(TASKS)}


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir(TASKS)


class ComputePinning:
    """Call `after_step()` on the thread that ran a step, right after it."""

    def __init__(
        self,
        cpus: tuple[int, ...],
        *,
        threads_of_process: Callable[[], set[int]] = process_thread_ids,
        threads_of_python: Callable[[], set[int]] = python_thread_ids,
        set_affinity: Callable[[int, set[int]], None] | None = None,
    ) -> None:
        if not cpus:
            raise ValueError("ComputePinning needs at least one CPU")
        self.cpus = cpus
        self._threads_of_process = threads_of_process
        self._threads_of_python = threads_of_python
        self._set_affinity = set_affinity or os.sched_setaffinity
        self._leaders: set[int] = set()
        self._placed: dict[int, int] = {}
        self._known: set[int] = set()
        self.moves = 0
        """Threads moved so far (tests, diagnostics)."""

    def after_step(self) -> None:
        me = threading.get_native_id()
        tasks = self._threads_of_process()
        if me in self._leaders and tasks == self._known:
            return  # the teams stand as they were placed
        self._leaders.add(me)
        self._leaders &= tasks  # leaders that ended are let go (this thread is listed)
        helpers = tasks - self._threads_of_python() - self._leaders
        plan = place_compute_threads(self.cpus, self._leaders, helpers)
        for tid, cpu in plan.items():
            if self._placed.get(tid) == cpu:
                continue
            try:
                self._set_affinity(tid, {cpu})
            except OSError as exc:  # the thread ended meanwhile, or the CPU went offline
                log.debug("could not pin thread %d to CPU %d: %s", tid, cpu, exc)
                continue
            self._placed[tid] = cpu
            self.moves += 1
        self._placed = {tid: cpu for tid, cpu in self._placed.items() if tid in tasks}
        self._known = tasks


def compute_pinning(cpus: tuple[int, ...]) -> Callable[[], None] | None:
    """The after-call hook for EngineCalls: None (no pinning) where no CPUs are chosen.
    CPUs this process may not run on are refused here, before the stage is built."""
    if not cpus:
        return None
    refuse_unusable(cpus)
    return ComputePinning(cpus).after_step


def refuse_unusable(cpus: tuple[int, ...]) -> None:
    """ConfigError unless this process may run on every CPU of `cpus` (`sangama worker
    --cpus` asks at start, not once a stage is assigned and loading)."""
    if not supported():
        raise ConfigError("cpus: this platform cannot pin threads")
    usable = os.sched_getaffinity(0)
    missing = [c for c in cpus if c not in usable]
    if missing:
        raise ConfigError(
            f"cpus {format_cpu_list(cpus)}: CPU(s) {format_cpu_list(missing)} are not among "
            f"this process's {format_cpu_list(sorted(usable))}"
        )
