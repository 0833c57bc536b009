"""How a stage's OpenMP threads wait, set in the environment before llama.cpp loads libgomp.

libgomp reads these once, when it is loaded, so `apply_stage_omp_settings` must run before
the first import of llama_cpp in the process: app.serving.serve calls it on import (every
worker), and bench/stage_compute.py in each process it starts, so its per-stage figures
are taken as a swarm's workers run. A value already in the environment wins.
"""

from __future__ import annotations

import os

STAGE_OMP_SETTINGS: dict[str, str] = {
    # How long an OpenMP thread spins before it sleeps: at each of the hundreds of
    # barriers of one token's graph, and after the graph, in libgomp's idle dock. Short
    # (1000 turns, ~37 us on a 2-core VM): a thread whose partner is preempted soon gives
    # its core back instead of spinning on it, and an idle stage stops spinning before the
    # next stage of the same machine computes. Every shared-machine case measured side by
    # side was fastest so; the former 100000 made a 2-thread stage 4-5x slower beside a
    # test suite, and 10000 is the worst of both (it holds the core and still sleeps):
    # docs/decisions/omp-spin-count.md.
    "GOMP_SPINCOUNT": "1000",
    # libgomp spins less than that once the threads it manages outnumber the CPUs: 100
    # turns unless the wait policy is active, then 1000 (its "throttled" count, never
    # above the one above). A second pool of OpenMP threads is enough to get there (one
    # per thread that starts a parallel region), and on a 2-core VM the whole model slowed
    # from 53 to 31 tok/s with it (docs/decisions/one-engine-thread.md). Active here changes
    # only that count: GOMP_SPINCOUNT sets the other one.
    "OMP_WAIT_POLICY": "active",
}


def apply_stage_omp_settings() -> None:
    """Put STAGE_OMP_SETTINGS into this process's environment where not set already."""
    for name, value in STAGE_OMP_SETTINGS.items():
        os.environ.setdefault(name, value)
