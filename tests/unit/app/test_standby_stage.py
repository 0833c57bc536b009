"""A warm spare's pre-loaded stage: kept for its own stage, freed for another
(app/serving/standby_stage.py). The stage is a stand-in with a shutdown count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from app.config import WorkerConfig
from app.serving import standby_stage
from app.serving.serve import LoadedStage
from core.types import LayerRange, StageSpec


class _Stage:
    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


FIRST = LayerRange(0, 4)


def _loaded(layers: LayerRange = FIRST) -> tuple[LoadedStage, _Stage]:
    config = WorkerConfig(
        node_id="n", listen=("127.0.0.1", 1), model="m", layers=layers, credentials=Path("c")
    )
    stage = _Stage()
    spec = StageSpec(layers, 8)
    return LoadedStage(config, Path("m"), spec, cast(Any, stage)), stage


def _done(value: object) -> asyncio.Future[object]:
    done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    done.set_result(value)
    return done


def test_the_standby_stage_is_promoted_as_loaded_and_another_frees_it() -> None:
    async def run() -> None:
        loaded, stage = _loaded()
        assert await standby_stage.take((_done(loaded)), same=True) is loaded
        assert stage.shutdowns == 0
        other, freed = _loaded()
        assert await standby_stage.take((_done(other)), same=False) is None
        assert freed.shutdowns == 1
        # A pre-load that kept only the pieces (over the cap) promotes nothing.
        assert await standby_stage.take((_done(None)), same=True) is None
        assert await standby_stage.take(None, same=True) is None
        # One still downloading for another stage is stopped, not waited for.
        slow = asyncio.ensure_future(asyncio.sleep(60))
        assert await standby_stage.take(slow, same=False) is None and slow.cancelled()

    asyncio.run(run())


def test_a_pre_load_fits_the_same_stage_whatever_its_next_hop() -> None:
    loaded, _ = _loaded()
    from dataclasses import replace

    from app.config import Hop

    assert loaded.fits(replace(loaded.config, next_hop=Hop("x", ("127.0.0.1", 2))))
    assert not loaded.fits(replace(loaded.config, layers=LayerRange(4, 8)))
    assert not loaded.fits(replace(loaded.config, max_sessions=loaded.config.max_sessions + 1))
