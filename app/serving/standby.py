"""A warm spare's stage: built ahead of time, served the moment it is assigned.

The coordinator names a standby stage to a spare (the stage most at risk). The spare
downloads its pieces, assembles the stage file and builds the engine here, in the
background, without announcing anything: it is no stage of the plan and serves no one.
When the coordinator then assigns it that stage, the worker starts on the stage already
built (a promotion: no second load); assigned another, it frees this one first.

A pre-load is kept only if it fits the volunteer's cap (the same check a serving stage
passes); one that does not is freed again and the spare keeps just the pieces."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from app.compute import stage_compute
from app.config import WorkerConfig
from app.errors import AppError
from app.serving.machine.vram import check_within_cap
from app.serving.serve import LoadedStage, admission_policy, load_stage
from core.hardware import memory_in_use

log = logging.getLogger(__name__)


async def preload(config: WorkerConfig) -> LoadedStage | None:
    """Build `config`'s stage without serving it; None when it cannot be kept (over the
    cap, or the build failed: the spare then loads at promotion, as a cold one)."""
    loop = asyncio.get_running_loop()
    building = asyncio.ensure_future(load_stage(config))
    try:
        loaded = await asyncio.shield(building)
    except asyncio.CancelledError:
        # Assigned another stage mid-load: the load's thread runs on regardless; what it
        # builds is freed the moment it is done instead of holding memory until GC.
        building.add_done_callback(_free_when_built)
        raise
    except (AppError, OSError, RuntimeError, ValueError) as exc:
        log.warning("could not pre-load the standby stage %s: %s", config.layers, exc)
        return None
    try:
        measured = await loop.run_in_executor(None, memory_in_use)
        check_within_cap(stage_compute(loaded.stage), config.device_cap_bytes, measured)
    except AppError as exc:
        log.warning("standby stage %s not kept loaded: %s", config.layers, exc)
        free(loaded)
        return None
    if config.calibrate_budget:
        # The worker would measure its row budget at start; measured now, the promotion
        # does not wait for it.
        from app.serving.machine.row_budget import calibrated_row_budget

        budget = await loaded.calls.run(calibrated_row_budget, loaded.stage)  # where it steps
        loaded = replace(loaded, calibration=budget)
    # Read now, not at promotion (see LoadedStage.admission).
    admission = await loop.run_in_executor(None, admission_policy, loaded.path, loaded.spec)
    loaded = replace(loaded, admission=admission)
    print(f"PRELOADED {config.layers}", flush=True)
    return loaded


def _free_when_built(building: asyncio.Future[LoadedStage]) -> None:
    if not building.cancelled() and building.exception() is None:
        free(building.result())


def free(loaded: LoadedStage | None) -> None:
    """Free a pre-loaded stage that will not be served (its native memory, at once)."""
    if loaded is None:
        return
    loaded.calls.submit(loaded.stage.shutdown)
    loaded.calls.shutdown()  # waits for the shutdown queued just before


async def take(fetching: asyncio.Future[Any] | None, same: bool) -> LoadedStage | None:
    """The pre-loaded stage when the assignment is the standby stage (`same`): waiting for
    a pre-load under way, which is further along than a fresh load would be. Otherwise
    the pre-load stops (a download resumes later where it stopped) or is freed."""
    if fetching is None:
        return None
    if not same and not fetching.done():
        fetching.cancel()
    try:
        loaded = await fetching
    except asyncio.CancelledError:
        return None
    if not isinstance(loaded, LoadedStage):
        return None
    if same:
        return loaded
    free(loaded)
    return None
