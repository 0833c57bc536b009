"""Which CPU each of a stage's compute threads runs on, where the operator chose CPUs.

Pure functions for `WorkerConfig.cpus`. Why pin at all: ggml's graph runs as a team of
OpenMP threads that meet at hundreds of barriers a token. Where several stages share a
machine (a swarm on one PC, `LocalSwarm`, the demo), each stage's team sleeps between
its steps and is woken for the next; the scheduler then sometimes wakes a thread on the
core its partner is already running on, and until it is moved every barrier is a
context switch: a 2-thread step of 1.8 ms took 8 ms in one step of ten
(docs/decisions/cpu-pinning.md). With the thread that runs the step on the first
CPU and the team's other threads on the others, each in turn, the team never shares a
core with itself.
"""

from __future__ import annotations

from collections.abc import Iterable


class CpuListError(ValueError):
    """A CPU list that is not "N", "N-M" and commas of those, or names no CPU."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """ "0-3,6" -> (0, 1, 2, 3, 6): taskset's and llama.cpp's notation, in the order
    given, each CPU once; "" -> () (no pinning)."""
    text = text.strip()
    if not text:
        return ()
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise CpuListError(f"a CPU list is like 0-3,6, not {text!r}")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise CpuListError(f"CPU range {part.strip()!r} runs backwards")
        cpus += [c for c in range(low, high + 1) if c not in cpus]
    return tuple(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpu_list for sorted runs: (0, 1, 2, 5) -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for cpu in cpus:
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(_run_text(run))
        run = [cpu]
    if run:
        out.append(_run_text(run))
    return ",".join(out)


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def place_compute_threads(
    cpus: tuple[int, ...], leaders: Iterable[int], helpers: Iterable[int]
) -> dict[int, int]:
    """thread id -> CPU. `leaders` are the threads that ran graphs (each starts its own
    OpenMP team: the engine thread, and any other thread an engine call came from);
    `helpers` are the teams' other threads. Leaders share cpus[0]: only one of them
    steps at a time. The helpers take cpus[1:] in thread-id (creation) order, round
    again for a second team, so the threads of one team (created together) land on
    distinct CPUs."""
    if not cpus:
        return {}
    leader_ids = sorted(set(leaders))
    placed = {tid: cpus[0] for tid in leader_ids}
    rest = cpus[1:] or cpus
    for i, tid in enumerate(sorted(set(helpers) - set(leader_ids))):
        placed[tid] = rest[i % len(rest)]
    return placed


def spread_for_stage(available: tuple[int, ...], stage: int, threads: int) -> tuple[int, ...]:
    """The CPUs for stage `stage` of a swarm sharing `available`: `threads` of them,
    starting where the previous stage's ended, so stages stepping at once (several
    sessions) begin on different cores; () where `threads` exceed the CPUs (pinning
    would put a team on fewer cores than threads)."""
    if threads < 1 or threads > len(available):
        return ()
    start = (stage * threads) % len(available)
    return tuple(available[(start + i) % len(available)] for i in range(threads))
