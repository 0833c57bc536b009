"""`sangama worker --config FILE`: prepare the stage file, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from app import node_status
from app.config import WorkerConfig, format_address
from app.credentials import load_credentials
from app.serving.machine.cpus import compute_pinning
from app.serving.machine.openmp import apply_stage_omp_settings
from app.serving.steps.engine_calls import EngineCalls
from core.admission import AdmissionPolicy, kv_bytes_per_token
from core.gguf_slices import assemble_stage, stage_file_name
from core.manifest import MANIFEST_FILE, Manifest
from core.models import resolve_model, stage_files
from core.types import StageSpec
from net import event_loop
from net.channel import NodeCredentials

if TYPE_CHECKING:
    from app.serving.links.downstream import Dialer
    from app.serving.worker import StageWorker
    from core.stage import Stage

log = logging.getLogger(__name__)

apply_stage_omp_settings()  # before anything loads llama.cpp (and with it libgomp)


def prepare_stage_file(config: WorkerConfig) -> tuple[Path, int]:
    """The stage GGUF for config.layers and the model's layer count."""
    source = Path(config.model)
    if source.is_dir() and (source / MANIFEST_FILE).exists():
        manifest = Manifest.load(source)
        path = source / "stages" / stage_file_name(manifest.facts, config.layers)
        if not path.exists():
            assemble_stage(manifest, source, config.layers, path)
        return path, manifest.facts.n_layer
    manifest, paths = stage_files(resolve_model(config.model), [config.layers])
    return paths[0], manifest.facts.n_layer


@dataclass(frozen=True)
class LoadedStage:
    """A stage built from its file and not yet served: what a warm spare holds ready."""

    config: WorkerConfig
    path: Path
    spec: StageSpec
    stage: Stage
    calibration: tuple[int, list[tuple[int, float]]] | None = None
    """The row budget and the step timings it came from, measured while standing by (the
    calibration takes longer than the promotion otherwise would on a busy PC)."""
    admission: AdmissionPolicy | None = None
    """What a session costs here, read while standing by: the first stage's file carries
    the tokenizer, and parsing it took 13.9 s of a 14.5 s warm takeover (SmolLM2, load 7)."""
    calls: EngineCalls = field(default_factory=EngineCalls)
    """The stage's engine thread, which built it and ran its calibrations; the worker
    serving it keeps stepping there. One thread, so one pool of OpenMP threads: libgomp
    keeps a pool per thread that starts a parallel region, and more pooled threads than
    CPUs cut its spin at every barrier (app.serving.machine.openmp)."""

    def fits(self, config: WorkerConfig) -> bool:
        """Whether `config` would build this very stage (its next hop may differ)."""
        same = ("model", "layers", "max_sessions", "n_ctx", "threads", "cpus", "device_cap_bytes")
        return all(getattr(config, k) == getattr(self.config, k) for k in same) and (
            config.row_budget,
            config.use_gpu,
            config.reproducible,
        ) == (self.config.row_budget, self.config.use_gpu, self.config.reproducible)


async def load_stage(config: WorkerConfig) -> LoadedStage:
    """Assemble the stage file and build the stage (in a thread: loading takes a while)."""
    from app.serving.machine.threads import calibrated_threads
    from core.stage import Stage

    path, n_layer = await asyncio.get_running_loop().run_in_executor(
        None, prepare_stage_file, config
    )
    spec = StageSpec(
        config.layers,
        n_layer,
        n_ctx=config.n_ctx * config.max_sessions,
        n_batch=config.row_budget,
        n_seq_max=config.max_sessions,
        n_threads=config.threads or 1,  # auto: set after the measurement below
        use_gpu=config.use_gpu,
        device_cap_bytes=config.device_cap_bytes,
        reproducible=config.reproducible,
    )
    calls = EngineCalls(compute_pinning(config.cpu_list))
    try:
        stage = await calls.run(Stage.from_file, path, spec)
        if config.threads == 0:  # "auto": measured before the row budget, which then uses it
            threads, samples = await calls.run(
                calibrated_threads, stage, len(config.cpu_list) or None
            )
            log.info("threads %d from one-row step times %s", threads, samples)
    except BaseException:
        calls.shutdown(wait=False)
        raise
    return LoadedStage(config, path, spec, stage, calls=calls)


async def start_worker(
    config: WorkerConfig,
    creds: NodeCredentials,
    dialer: Dialer | None = None,
    loaded: LoadedStage | None = None,
) -> StageWorker:
    """Build the stage, or take `loaded` (built for the same config), and serve it."""
    from app.serving.worker import StageWorker  # heavy imports after the environment is set

    if loaded is None or not loaded.fits(config):
        loaded = await load_stage(config)
    measured = loaded.calibration if config.calibrate_budget else None
    if measured is not None:
        config = replace(config, calibrate_budget=False)
    admission = loaded.admission or await asyncio.get_running_loop().run_in_executor(
        None, admission_policy, loaded.path, loaded.spec
    )  # in a thread: GGUF parsing in Python, seconds for a file holding the tokenizer
    worker = StageWorker(config, loaded.stage, creds, dialer, admission, loaded.calls)
    if measured is not None:
        worker.row_budget, worker.step_samples = measured[0], list(measured[1])
    log.info("worker built (row budget %s)", "measured" if measured else "to measure")
    await worker.start()
    return worker


def admission_policy(path: Path, spec: StageSpec) -> AdmissionPolicy:
    """What a session costs this stage: K and V per position over its own layers."""
    from core.llama_engine import stage_sizes

    sizes = stage_sizes(path, with_head=False)
    return AdmissionPolicy(
        n_ctx=spec.n_ctx,
        max_sessions=spec.n_seq_max,
        kv_bytes_per_token=kv_bytes_per_token(sizes.kv_bytes_per_token),
        session_ctx=spec.session_ctx,
    )


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the clean-shutdown trigger."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def report_stopped(worker: StageWorker) -> None:
    s = worker.stats
    print(
        f"STOPPED {worker.config.node_id}: {s.sessions_opened} sessions, {s.steps} steps in "
        f"{s.batches} batches, {s.errors} errors, {s.sessions_resumed} resumed, "
        f"{worker.next_hop_relinks} relinks",
        file=sys.stderr,
        flush=True,
    )


async def serve(config: WorkerConfig, ready_line: bool = True) -> None:
    creds = load_credentials(config.credentials, config.node_id)
    worker = await start_worker(config, creds)
    assert worker.address is not None
    stop = stop_event()
    if ready_line:
        # The demo and tests wait for this line before routing traffic here.
        layers = (config.layers.start, config.layers.stop)
        print(
            node_status.ready_line(config.node_id, format_address(worker.address), layers),
            flush=True,
        )
    log.info("worker %s serving %s", config.node_id, config.layers)
    try:
        await stop.wait()
    finally:
        await worker.stop()
        report_stopped(worker)


def run_worker(config_path: Path) -> int:
    config = WorkerConfig.load(config_path)
    event_loop.run(serve(config))  # uvloop on Linux
    return 0
