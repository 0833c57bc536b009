"""A real coordinator, a chain of workers and a warm spare on loopback, as processes: the
set-up of every "a stage dies mid-answer" test and of bench/spare_takeover.py.

    swarm = await SpareSwarm.start(tmp_path, model)        # w0..w2 serving, a spare
    me = await swarm.join_client("me")
    route = await swarm.route(me)
    out, gap = await generate_killing(client, PROMPT, 40, 5, lambda: swarm.kill(victim))
    await swarm.stop()

Workers are `sangama worker --join` children (app.lab.processes.spawn_sangama); the
spare's stdout lines (PRELOADED, STANDBY, LOADING, READY) are kept with the time each
came, so a test can say what the spare loaded and when.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.route import fetch_route
from app.config import Route
from app.identity import Identity, join_swarm
from app.lab.processes import Child, spawn_sangama
from tests.support.coordinator_proc import CoordinatorProcess, wait_settled

TAKEOVER_ARGS = ("--spares", "1", "--stale-after", "2", "--dead-after", "4")
"""The coordinator of these tests: one spare, a silent stage stale after 2 s, dead after 4."""


async def spawn_worker(
    coord: CoordinatorProcess,
    root: Path,
    name: str,
    wait: bool = True,
    extra: Sequence[str] = (),
    timeout: float = 300.0,
    verbose: bool = False,
    env: Mapping[str, str] | None = None,
) -> Child:
    """`sangama worker --join` with a fresh invite, its identity in root/name and its
    output in root/name.log; `wait`: until it prints READY (serves a stage); `verbose`:
    `sangama -v` (debug lines, each timestamped, in its log); `env`: added to its
    environment (e.g. SANGAMA_TEST_LIE)."""
    code = coord.admin.create_invite("worker")["code"]
    args = [*(["-v"] if verbose else []), "worker", "--join", code]
    args += ["--identity-dir", str(root / name), *extra]
    log = root / f"{name}.log"
    return await spawn_sangama(name, args, log, timeout, wait_ready=wait, env=env)


def middle_leaves_first(minutes: int = 20) -> list[list[str]]:
    """Worker arguments for a chain of three whose middle stage is the one most at risk.
    The caps order the chain (the planner puts the biggest node last and the next
    biggest first when nothing is measured yet: 2G, 1G, 3G); the middle worker's
    volunteer leaves in `minutes`, within the spare policy's horizon."""
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)).isoformat("T", "seconds")
    return [
        ["--vram-cap", "3G"],
        ["--vram-cap", "1G", "--available-until", until],
        ["--vram-cap", "2G"],
    ]


def node_id(child: Child) -> str:
    """The node id a serving worker printed in its READY line."""
    return child.ready_line.split()[1]


@dataclass
class SpareSwarm:
    root: Path
    coord: CoordinatorProcess
    chain: list[Child]
    spare: Child
    said: list[tuple[float, str]] = field(default_factory=list)
    """The spare's stdout lines, each with the time.monotonic() it came."""
    _reading: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        root: Path,
        model: Path,
        *,
        chain_args: Sequence[Sequence[str]] = ((), (), ()),
        spare_args: Sequence[str] = (),
        coordinator_args: Sequence[str] = TAKEOVER_ARGS,
        timeout: float = 300.0,
        verbose: bool = False,
    ) -> SpareSwarm:
        """The coordinator, then the chain (one worker per `chain_args` entry, together,
        each serving), then the spare (joined after the chain: the plan is formed)."""
        loop = asyncio.get_running_loop()
        coord = await loop.run_in_executor(
            None,
            lambda: CoordinatorProcess.start(
                root / "coordinator",
                model,
                min_stages=len(chain_args),
                # No two-token probes of the chain: the tests count every row a
                # stage computes (a later --answer-probe-every in coordinator_args wins).
                extra_args=["--answer-probe-every", "0", *coordinator_args],
                timeout=timeout,
            ),
        )
        chain: list[Child] = []
        try:
            chain = list(
                await asyncio.gather(
                    *(
                        spawn_worker(coord, root, f"w{i}", True, extra, timeout, verbose)
                        for i, extra in enumerate(chain_args)
                    )
                )
            )
            spare = await spawn_worker(coord, root, "spare", False, spare_args, timeout, verbose)
        except BaseException:
            await asyncio.gather(*(c.stop() for c in chain))
            coord.stop()
            raise
        swarm = cls(root, coord, chain, spare)
        swarm._reading = loop.create_task(swarm._read())
        return swarm

    async def _read(self) -> None:
        assert self.spare.process.stdout is not None
        while line := await self.spare.process.stdout.readline():
            self.said.append((time.monotonic(), line.decode().strip()))

    def spare_lines(self, prefix: str = "") -> list[str]:
        return [x for _, x in self.said if x.startswith(prefix)]

    async def until_spare_says(self, prefix: str, timeout: float = 300.0) -> str:
        """The spare's first line starting with `prefix`, waiting for it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = self.spare_lines(prefix)
            if found:
                return found[0]
            await asyncio.sleep(0.2)
        raise AssertionError(f"the spare said no {prefix} within {timeout:.0f} s: {self.said}")

    async def settled(self, n_spares: int = 1, timeout: float = 300.0) -> None:
        """Until the plan has its stages and spares, every stage serving."""
        await asyncio.get_running_loop().run_in_executor(
            None, wait_settled, self.coord, len(self.chain), n_spares, timeout
        )

    async def join_client(self, name: str = "me", uses: int = 1) -> Identity:
        code = self.coord.admin.create_invite("client", uses=uses)["code"]
        return await asyncio.get_running_loop().run_in_executor(
            None, join_swarm, code, self.root / name
        )

    async def route(self, me: Identity) -> Route:
        route, _ = await asyncio.get_running_loop().run_in_executor(None, fetch_route, me)
        return route

    def worker(self, node: str) -> Child:
        """The chain worker serving as `node`."""
        return next(w for w in self.chain if node_id(w) == node)

    def standby_layers(self) -> tuple[int, int] | None:
        """The layers the coordinator has the spare stand by for (its operator API)."""
        standby = self.coord.admin.swarm().get("standby", {})
        ready = next(iter(standby.values()), None)
        return None if ready is None else (int(ready[0]), int(ready[1]))

    @staticmethod
    def kill(child: Child) -> None:
        """SIGKILL: a power cut, no goodbye."""
        os.kill(child.process.pid, signal.SIGKILL)

    async def stop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        await asyncio.gather(*(c.stop() for c in [*self.chain, self.spare]))
        self.coord.stop()


async def generate_killing(
    client: RecoveringClient, prompt: list[int], n: int, after: int, kill: Callable[[], None]
) -> tuple[list[int], float, float]:
    """Generate `n` tokens, calling `kill` once the `after`-th has arrived: the tokens,
    the kill's time.monotonic() and the seconds from the kill to the next token."""
    out: list[int] = []
    killed_at = gap = 0.0
    async for event in client.generate(prompt, n):
        apply_event(out, event)
        if len(out) >= after and not killed_at:
            kill()
            killed_at = time.monotonic()
        elif killed_at and not gap:
            gap = time.monotonic() - killed_at
    return out, killed_at, gap
