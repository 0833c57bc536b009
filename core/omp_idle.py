"""Send OpenMP's worker threads to sleep right after a graph, so an idle stage does not
spin on a core another stage of the same machine is computing on (libgomp only).

ggml's CPU backend is built with OpenMP (GNU libgomp). Inside a graph its threads meet
at hundreds of barriers, and a barrier must spin for a while before it sleeps, or every
one of them costs a futex sleep and a wake-up (docs/decisions/omp-spin-count.md:
65-85 sleeps a token at GOMP_SPINCOUNT=10000 and a 10x slower step). But
libgomp spins just as long after the graph, in its idle "dock", so with several stages
on one machine each stage's idle threads spin through the next stage's compute.

libgomp spins briefly ("throttled", 100 turns by default) whenever it manages more
threads than the CPUs it saw at start. `OmpIdle.park` uses that: one empty parallel
region of one thread more than those CPUs (each thread calls free(NULL)); the threads
then wait in the dock throttled and sleep almost at once. The next graph's team is
smaller, so libgomp counts fewer threads again and its barriers spin as before. Cost: a
thread created and one released per park (tens of microseconds), so it is used only
where the stage's threads cover (nearly) every CPU, the case where the spin hurts.
Not libgomp (other OpenMP runtimes, builds without OpenMP): `OmpIdle.load` gives None.

Opt-in (SANGAMA_OMP_PARK=1, app/serving/thread_calibration.idle_parker): it does stop
the spin (a stage's idle thread 3.8-4.3 ms of CPU after a step without, 0.02 with), but
a swarm of three 2-thread stages on a busy 2-core machine made 9.9-10.9 tok/s with it
and 25.7-27.4 without: a parked thread has given up its core and waits for one when the
next graph wakes it, the very wait the spin exists to avoid
(docs/decisions/omp-park-idle-threads.md). Those
figures were taken at a 100000-turn spin; workers now spin 1000 turns (~37 us,
app/serving/serve.py), so an idle thread sleeps almost at once anyway.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["OmpIdle", "park_threads"]

MAX_EXTRA = 2
"""Park only when it takes at most this many threads beyond the stage's own."""


def park_threads(threads: int, cpus: int, max_extra: int = MAX_EXTRA) -> int | None:
    """How many threads the parking region needs (one more than the CPUs libgomp saw),
    or None where parking is not worth it: one thread (no idle OpenMP threads), or a
    machine with many more CPUs than the stage uses (they are free to spin on)."""
    if threads < 1 or cpus < 1:
        raise ValueError("threads and cpus must be >= 1")
    if threads == 1:
        return None
    needed = max(threads, cpus) + 1
    return needed if needed - threads <= max_extra else None


class OmpIdle:
    """libgomp as already loaded by ggml, and libc's free as the region's no-op body."""

    def __init__(self, gomp: ctypes.CDLL, body: int, region_threads: int) -> None:
        self._parallel = gomp.GOMP_parallel
        self._parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._parallel.restype = None
        self._body = body
        self.region_threads = region_threads
        self.parks = 0

    @classmethod
    def load(cls, threads: int, cpus: int) -> OmpIdle | None:
        """For a stage of `threads` threads on `cpus` CPUs; None where parking does not
        apply (see park_threads) or libgomp is not in this process (RTLD_NOLOAD: only
        the copy ggml loaded counts; never a second one)."""
        region = park_threads(threads, cpus)
        noload = getattr(os, "RTLD_NOLOAD", 0)
        if region is None or not noload:
            return None
        try:
            gomp = ctypes.CDLL("libgomp.so.1", mode=noload | os.RTLD_LAZY)
            libc = ctypes.CDLL(None)
        except OSError:
            return None
        if not hasattr(gomp, "GOMP_parallel") or not hasattr(libc, "free"):
            return None
        body = ctypes.cast(libc.free, ctypes.c_void_p).value
        return None if body is None else cls(gomp, body, region)

    def park(self) -> None:
        """One empty parallel region; afterwards the pool's threads sleep within ~100
        spins. Call on the thread that runs the graphs (their pool is per thread)."""
        self._parallel(self._body, None, self.region_threads, 0)
        self.parks += 1
