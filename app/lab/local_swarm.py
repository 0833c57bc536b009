"""A whole swarm on loopback: a CA, worker processes for each stage, a client identity.

Used by `sangama demo`, the integration tests and the benchmarks. Workers are real
`sangama worker` processes talking QUIC over real UDP sockets.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from app.config import Hop, Route, RouteStage, WorkerConfig, format_address
from app.credentials import init_ca, issue_node, load_credentials
from app.errors import AppError
from app.lab.processes import Child, spawn_sangama
from app.lab.wan.process import ProxyPool, ProxyReport, reports_of
from app.lab.wan.proxy import DelayProxy
from app.ports import free_udp_port
from core.cpu_placement import format_cpu_list, spread_for_stage
from core.models import resolve_model, stage_files
from core.types import LayerRange
from net.channel import NodeCredentials
from net.quic.links import DEFAULT_LIBRARY, QuicTuning

CLIENT_ID = "client"


@dataclass
class WorkerProcess:
    config: WorkerConfig
    child: Child

    @property
    def process(self) -> asyncio.subprocess.Process:
        return self.child.process

    @property
    def alive(self) -> bool:
        return self.child.alive


@dataclass
class LocalSwarm:
    model: str
    cuts: list[int]
    threads: int = 1
    max_sessions: int = 16
    n_ctx: int = 1024
    """Positions per session (WorkerConfig.n_ctx)."""
    max_datagram_size: int = 1200
    return_logits: bool = False
    quic_library: str = DEFAULT_LIBRARY
    idle_timeout: float = 5.0
    """Seconds of silence before a link counts as dead (tests shorten it)."""
    link_delays_ms: list[float] | None = None
    """One-way delay per link, WAN emulation through app.lab.wan.proxy: client->stage0,
    each stage->next, last stage->client (len = stages + 1)."""
    reproducible: bool = False
    """Workers in reproducible mode (WorkerConfig.reproducible)."""
    exact_guesses: bool = WorkerConfig.exact_guesses
    """WorkerConfig.exact_guesses of every worker."""
    mtp_p_min: float = 0.3
    """The last stage's MTP confidence threshold (WorkerConfig.mtp_p_min)."""
    pin_cpus: bool = True
    """Stages of 2 threads or more keep their compute threads on CPUs of their own
    (WorkerConfig.cpus, core.cpu_placement.spread_for_stage): stages sharing one
    machine's cores otherwise sometimes wake a team's threads on one core."""
    max_sessions_per_node: int | None = None
    """WorkerConfig.max_sessions_per_node of the first stage; None: every slot (a lab
    swarm's one client may fill the stage, as the many-sessions tests and benches do)."""
    auth_timeout: float = WorkerConfig.auth_timeout
    """Seconds a peer has to authenticate before its link is closed."""
    session_idle_s: float = WorkerConfig.session_idle_s
    """Sessions with no step for this long are closed."""
    worker_env: dict[int, dict[str, str]] = field(default_factory=dict)
    """Environment added for the worker of a stage, by its index (tests make one lie:
    app.serving.chaos_lies)."""
    workdir: Path | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    route: Route | None = None
    client_credentials: NodeCredentials | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    proxies: list[DelayProxy] = field(default_factory=list)
    proxy_processes: int = 0
    """0: the delay proxies run in this process (`proxies`, which tests may reach into);
    N: in N processes of their own (`proxy_pool`), so a benchmark's clients and the
    emulated links do not share one event loop."""
    proxy_pool: ProxyPool | None = None

    async def _delayed(self, target: tuple[str, int], delay_ms: float) -> tuple[str, int]:
        """An address that reaches `target` after `delay_ms` each way."""
        if self.proxy_processes:
            if self.proxy_pool is None:
                self.proxy_pool = ProxyPool(self.proxy_processes)
                await self.proxy_pool.start()
            return await self.proxy_pool.add(target, delay_ms)
        proxy = DelayProxy(("127.0.0.1", 0), target, delay_ms)
        await proxy.start()
        self.proxies.append(proxy)
        return ("127.0.0.1", proxy.bound_port)

    def _cpus_of(self, stage: int) -> str:
        if not self._pinned():
            return ""
        available = tuple(sorted(os.sched_getaffinity(0)))
        return format_cpu_list(spread_for_stage(available, stage, self.threads))

    def _pinned(self) -> bool:
        return (
            self.pin_cpus
            and self.threads >= 2
            and hasattr(os, "sched_getaffinity")
            and self.threads <= len(os.sched_getaffinity(0))
        )

    async def start(self, ready_timeout: float = 300.0) -> None:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sangama-swarm-")
            self.workdir = Path(self._tmp.name)
        wd = self.workdir
        ranges = LayerRange.from_cuts(self.cuts)
        model_path = resolve_model(self.model)
        # Cut and assemble once here, so worker processes never race on the cache.
        await asyncio.get_running_loop().run_in_executor(None, stage_files, model_path, ranges)
        ca_dir = wd / "ca"
        init_ca(ca_dir)
        ids = [f"stage{i}" for i in range(len(ranges))]
        ports = [free_udp_port() for _ in ranges]
        delays = self.link_delays_ms
        if delays is not None and len(delays) != len(ranges) + 1:
            raise AppError(f"need {len(ranges) + 1} link delays, got {len(delays)}")
        # Where each stage is reached from upstream: directly, or through a delay proxy.
        entry = [("127.0.0.1", p) for p in ports]
        if delays is not None:
            entry = [await self._delayed(a, d) for a, d in zip(entry, delays[:-1], strict=True)]
        configs = []
        for i, layers in enumerate(ranges):
            creds_dir = issue_node(ca_dir, ids[i], "worker", out_dir=wd / ids[i])
            hop = Hop(ids[i + 1], entry[i + 1]) if i + 1 < len(ranges) else None
            configs.append(
                WorkerConfig(
                    node_id=ids[i],
                    listen=("127.0.0.1", ports[i]),
                    model=str(model_path),
                    layers=layers,
                    credentials=creds_dir,
                    next_hop=hop,
                    threads=self.threads,
                    max_sessions=self.max_sessions,
                    n_ctx=self.n_ctx,
                    max_datagram_size=self.max_datagram_size,
                    return_logits=self.return_logits,
                    quic_library=self.quic_library,
                    idle_timeout=self.idle_timeout,
                    reproducible=self.reproducible,
                    exact_guesses=self.exact_guesses,
                    mtp_p_min=self.mtp_p_min,
                    cpus=self._cpus_of(i),
                    max_sessions_per_node=(
                        self.max_sessions
                        if self.max_sessions_per_node is None
                        else self.max_sessions_per_node
                    ),
                    auth_timeout=self.auth_timeout,
                    session_idle_s=self.session_idle_s,
                    # No fixed upstream: a lab swarm's stages take spares and replays
                    # from any stage (as coordinated stages do), so past the first stage
                    # any node certified as a worker opens sessions, never a client. A
                    # first stage behind a delay proxy is reached (and looped back to) at
                    # the proxy's address.
                    upstream="",
                    advertise=format_address(entry[0]) if i == 0 and delays else "",
                )
            )
        client_dir = issue_node(ca_dir, CLIENT_ID, "client", out_dir=wd / CLIENT_ID)
        self.client_credentials = load_credentials(client_dir, CLIENT_ID)
        addresses = [entry[0], *(c.listen for c in configs[1:])]
        if delays is not None:  # the client's own link to the last stage carries TOKENS back
            addresses[-1] = await self._delayed(configs[-1].listen, delays[-1])
        self.route = Route(
            str(model_path),
            tuple(
                RouteStage(c.node_id, a, c.layers) for c, a in zip(configs, addresses, strict=True)
            ),
        )
        (wd / "route.json").write_text(self.route.to_json(), encoding="utf-8")
        # Start from the last stage so each next hop is listening before traffic arrives.
        for i, config in reversed(list(enumerate(configs))):
            env = self.worker_env.get(i)
            self.workers.insert(0, await self._launch(config, ready_timeout, env))

    async def _launch(
        self, config: WorkerConfig, timeout: float, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        assert self.workdir is not None
        cfg_path = self.workdir / f"{config.node_id}.toml"
        cfg_path.write_text(config.to_toml(), encoding="utf-8")
        log_path = self.workdir / f"{config.node_id}.log"
        child = await spawn_sangama(
            f"worker {config.node_id}",
            ["worker", "--config", str(cfg_path)],
            log_path,
            timeout,
            env=env,
        )
        return WorkerProcess(config, child)

    def kill(self, index: int) -> None:
        """Kill one worker abruptly (SIGKILL), as a volunteer's PC vanishing would."""
        self.workers[index].process.kill()

    async def stop(self, timeout: float = 10.0) -> list[int | None]:
        """SIGTERM every worker and wait; return their exit codes."""
        codes: list[int | None] = [await w.child.stop(timeout) for w in self.workers]
        for proxy in self.proxies:
            await proxy.close()
        self.proxies.clear()
        if self.proxy_pool is not None:
            await self.proxy_pool.close()
            self.proxy_pool = None
        return codes

    async def proxy_reports(self) -> list[ProxyReport]:
        """Every link's proxy counters and lateness, in link order, wherever they run."""
        if self.proxy_pool is not None:
            return await self.proxy_pool.reports()
        return reports_of(self.proxies)

    @property
    def proxy_pids(self) -> list[int]:
        """The processes the proxies run in besides this one (none when they run here)."""
        return self.proxy_pool.pids if self.proxy_pool is not None else []

    @property
    def tuning(self) -> QuicTuning:
        """QUIC settings a client of this swarm should use."""
        return QuicTuning(
            max_datagram_size=self.max_datagram_size,
            library=self.quic_library,
            idle_timeout=self.idle_timeout,
            keepalive=self.idle_timeout / 4,
        )

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> LocalSwarm:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            self.cleanup()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self.cleanup()
