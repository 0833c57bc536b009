"""The soak's swarm: a real coordinator and workers as child processes on loopback, which
bench/soak.py kills with SIGKILL and starts again, and the memory (RSS) of every process,
sampled.

The coordinator is `tests.support.coordinator_proc.CoordinatorProcess` (restarted on the
same port and data directory, as a rebooted server would be); the relay (optional) is
`tests.support.relay_proc.LoopbackRelay`, a real coturn restarted on the same port, and
every other worker then runs `--relay-only`, so part of the chain's links go through it
(as tests/integration/test_relay_restart.py arranges it); workers are
`app.lab.processes.spawn_sangama` children, as in tests/integration/test_answer_survives.py:
joined once with an invite, started again from their identity directory (the same node
id; a fresh port and no KV, like a rebooted PC).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from app.identity import Identity, join_swarm
from app.lab.processes import Child, spawn_sangama
from app.ports import free_udp_port
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.relay_proc import LoopbackRelay

STALE_AFTER_S = 5.0
"""Silence that makes a worker stale (replaced at once when a client reports it; twice
that: replaced anyway). Short, so a soak round is short, yet longer than the chaos
policy's shortest outages: a worker back within it is a reboot (same place in the plan,
no KV), one back later has been replaced by a spare; both paths run."""
READY_TIMEOUT_S = 180.0


@dataclass
class Worker:
    name: str
    directory: Path
    child: Child
    port: int
    """Its QUIC port, kept across restarts (a PC with a configured port)."""
    node_id: str = ""
    starts: int = 1
    relay_only: bool = False
    """Reaches its peers only through the relay (its links onward and to it are relayed)."""


@dataclass
class RssSeries:
    """Per process kind: the largest RSS of any process of that kind at each sample."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, at: float, rss: int) -> None:
        self.samples.append((at, rss))

    def summary(self) -> dict[str, float]:
        values = [r for _, r in self.samples]
        if not values:
            return {}
        mib = 1 << 20
        warm = values[: max(1, len(values) // 10)]
        return {
            "start_mib": round(max(warm) / mib, 1),
            "peak_mib": round(max(values) / mib, 1),
            "end_mib": round(values[-1] / mib, 1),
            "median_mib": round(statistics.median(values) / mib, 1),
            "samples": len(values),
        }


def rss_bounded(summary: dict[str, float], factor: float = 1.5, slack_mib: float = 64.0) -> bool:
    """Whether a kind's memory stayed bounded: its peak within `factor` x the warm-up
    level plus `slack_mib` (a leak of one allocation per token or per session grows
    without limit over a soak; allocator noise and a restart's fresh process do not)."""
    if not summary:
        return True
    return summary["peak_mib"] <= summary["start_mib"] * factor + slack_mib


class SoakSwarm:
    def __init__(
        self,
        workdir: Path,
        model: Path,
        n_workers: int,
        stages: int,
        stale_after_s: float = STALE_AFTER_S,
        relay: bool = False,
    ) -> None:
        self.workdir = workdir
        self.with_relay = relay
        self.relay: LoopbackRelay | None = None
        self.stale_after_s = stale_after_s
        self.model = model
        self.n_workers = n_workers
        self.stages = stages
        self.coordinator: CoordinatorProcess | None = None
        self.port = 0
        self.workers: dict[str, Worker] = {}
        self.rss: dict[str, RssSeries] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self.extra_pids: dict[str, int] = {"client": os.getpid()}

    # ---------------------------------------------------------------- coordinator

    def _start_coordinator(self) -> CoordinatorProcess:
        turn = self.relay.coordinator_args(self.workdir) if self.relay is not None else []
        args = [
            *turn,
            *("--spares", str(self.n_workers - self.stages)),
            *(
                "--stale-after",
                str(self.stale_after_s),
                "--dead-after",
                str(2 * self.stale_after_s),
            ),
        ]
        return CoordinatorProcess.start(
            self.workdir / "coordinator",
            self.model,
            min_stages=self.stages,
            port=self.port or None,
            extra_args=args,
            timeout=READY_TIMEOUT_S,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.with_relay:  # on this thread: see relay_proc on coturn's parent-death signal
            self.relay = LoopbackRelay.start(self.workdir / "relay")
            self.extra_pids["relay"] = self.relay.current.pid
        self.coordinator = await loop.run_in_executor(None, self._start_coordinator)
        self.port = int(self.coordinator.url.rsplit(":", 1)[1].split("/")[0])
        names = [f"w{i}" for i in range(self.n_workers)]
        # The chain first (each prints READY once it serves), then the spares.
        # With a relay, w0, w2, ... reach peers only through it: every chain of three has
        # a relayed link, whichever workers it is made of.
        relayed = {n: self.relay is not None and i % 2 == 0 for i, n in enumerate(names)}
        chain = await asyncio.gather(
            *(self._join(n, True, relayed[n]) for n in names[: self.stages])
        )
        spares = [await self._join(n, False, relayed[n]) for n in names[self.stages :]]
        for w in [*chain, *spares]:
            self.workers[w.name] = w
        self._sampler = loop.create_task(self._sample_forever())

    async def _join(self, name: str, wait: bool, relay_only: bool) -> Worker:
        assert self.coordinator is not None
        code = self.coordinator.admin.create_invite("worker")["code"]
        directory = self.workdir / name
        port = free_udp_port()
        args = [
            *("worker", "--join", code, "--identity-dir", str(directory)),
            *_worker_args(port, relay_only),
        ]
        child = await spawn_sangama(name, args, self._log(name), READY_TIMEOUT_S, wait)
        self._keep_reading(child)
        worker = Worker(name, directory, child, port, relay_only=relay_only)
        if wait:
            worker.node_id = child.ready_line.split()[1]
        else:
            worker.node_id = await self._node_id(directory)
        return worker

    def _keep_reading(self, child: Child) -> None:
        """Read the child's stdout (its READY/PAUSED lines) into its log: a pipe nobody
        reads fills up over a long soak and blocks the worker's next print."""
        stream = child.process.stdout
        if stream is None:
            return

        async def pump() -> None:
            with open(child.log_path, "ab") as f:
                while line := await stream.readline():
                    f.write(b"stdout: " + line)
                    f.flush()

        self._readers.add(asyncio.get_running_loop().create_task(pump()))
        self._readers = {t for t in self._readers if not t.done()}

    def _log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    async def _node_id(self, directory: Path) -> str:
        """The node id a joining worker wrote to its identity directory (it joins first)."""
        for _ in range(int(READY_TIMEOUT_S * 10)):
            with contextlib.suppress(Exception):
                return Identity.load(directory).node_id
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{directory} holds no identity after {READY_TIMEOUT_S:.0f} s")

    def join_client(self, name: str) -> Identity:
        assert self.coordinator is not None
        return join_swarm(
            self.coordinator.admin.create_invite("client")["code"], self.workdir / name
        )

    @property
    def coordinator_up(self) -> bool:
        return self.coordinator is not None and self.coordinator.proc.poll() is None

    async def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.proc.kill()  # SIGKILL: no clean shutdown
        await asyncio.get_running_loop().run_in_executor(None, self.coordinator.proc.wait)
        self.coordinator.stop()  # closes its admin session; the process is gone already

    async def restart_coordinator(self) -> None:
        loop = asyncio.get_running_loop()
        self.coordinator = await loop.run_in_executor(None, self._start_coordinator)

    # ---------------------------------------------------------------- workers

    def kill_worker(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.workers[name].child.process.pid, signal.SIGKILL)

    async def restart_worker(self, name: str) -> None:
        w = self.workers[name]
        await w.child.process.wait()
        if w.child.stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.child.stderr_task, 2)
        args = ["worker", "--identity", str(w.directory), *_worker_args(w.port, w.relay_only)]
        # Not waiting for READY: a restarted worker may come back as a spare (no stage).
        w.child = await spawn_sangama(name, args, self._log(name), READY_TIMEOUT_S, False)
        self._keep_reading(w.child)
        w.starts += 1

    def relayed_nodes(self) -> set[str]:
        """The workers whose last heartbeat said their link onward runs through the relay
        (read from the coordinator's database, as tests/integration/test_relay_restart.py
        does; empty while the coordinator is down or the database busy)."""
        db = self.workdir / "coordinator" / "coordinator.db"
        with (
            contextlib.suppress(sqlite3.Error),
            contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c,
        ):
            rows = c.execute("SELECT node_id FROM nodes WHERE path = 'relayed'").fetchall()
            return {r[0] for r in rows}
        return set()

    # ---------------------------------------------------------------- relay

    @property
    def relay_up(self) -> bool | None:
        """None: this swarm runs no relay."""
        return None if self.relay is None else self.relay.up

    def kill_relay(self) -> None:
        assert self.relay is not None
        self.relay.kill()
        self.extra_pids.pop("relay", None)

    async def restart_relay(self) -> None:
        assert self.relay is not None
        await self.relay.restart_async()
        self.extra_pids["relay"] = self.relay.current.pid

    def running_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.child.alive]

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        await asyncio.gather(*(w.child.stop() for w in self.workers.values()))
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.relay is not None:
            self.relay.stop()

    # ---------------------------------------------------------------- memory

    def pids(self) -> dict[str, list[int]]:
        kinds: dict[str, list[int]] = {k: [p] for k, p in self.extra_pids.items()}
        if self.coordinator_up:
            assert self.coordinator is not None
            kinds["coordinator"] = [self.coordinator.proc.pid]
        kinds["worker"] = [w.child.process.pid for w in self.running_workers()]
        return kinds

    def sample(self) -> None:
        at = time.monotonic()
        for kind, pids in self.pids().items():
            sizes = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    sizes.append(psutil.Process(pid).memory_info().rss)
            if sizes:
                self.rss.setdefault(kind, RssSeries()).add(at, max(sizes))

    async def _sample_forever(self, every_s: float = 1.0) -> None:
        while True:
            self.sample()
            await asyncio.sleep(every_s)


def _worker_args(port: int, relay_only: bool = False) -> list[str]:
    # Reproducible: sessions batched together on a stage change each other's float
    # rounding, and a near-tie between two tokens then flips a greedy answer (the soak
    # saw 3 of 99 answers differ at one position with no fault at all). One decode per
    # session makes an answer depend on its tokens only, so a difference is a loss.
    relay = ["--relay-only"] if relay_only else []
    return ["--listen", f"127.0.0.1:{port}", "--reproducible", *relay]
