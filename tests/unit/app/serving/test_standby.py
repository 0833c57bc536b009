"""A warm spare's pre-loaded stage: kept for its own stage, freed for another
(app/serving/standby.py). The stage is a stand-in with a shutdown count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from app.config import WorkerConfig
from app.serving import standby as standby_stage
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


def test_a_spare_re_targeted_frees_the_stage_it_had_pre_loaded(monkeypatch: Any) -> None:
    # The soak's finding: the coordinator moved a spare's standby stage eight times (the
    # riskiest stage changes as workers restart) and the spare kept every stage it had
    # built. Standby A, then B, then the assignment B: A is freed, B is served as built.
    from types import SimpleNamespace

    from app.node_status import NodeStatus
    from app.serving import coordinated

    a = SimpleNamespace(layers=(0, 4))
    b = SimpleNamespace(layers=(4, 8))
    beats = iter(
        [
            SimpleNamespace(assignment=None, standby=a),
            SimpleNamespace(assignment=None, standby=b),
            SimpleNamespace(assignment=b, standby=None),
        ]
    )
    monkeypatch.setattr(coordinated, "send_beat", lambda _c, _r: next(beats))
    monkeypatch.setattr(coordinated, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(coordinated, "STANDBY_BEAT_S", 0.01)
    built: dict[tuple[int, int], _Stage] = {}

    async def prepare(ready: Any) -> LoadedStage:
        loaded, stage = _loaded(LayerRange(*ready.layers))
        built[ready.layers] = stage
        return loaded

    async def run() -> tuple[Any, Any]:
        return await coordinated._wait_for_assignment(
            cast(Any, None),
            cast(Any, None),
            asyncio.Event(),
            lambda _s: None,
            cast(Any, NodeStatus),
            prepare,
        )

    monkeypatch.setattr(coordinated, "replace", lambda base, **_kw: base)
    assignment, loaded = asyncio.run(run())
    assert assignment is b
    assert built[(0, 4)].shutdowns == 1  # the first pre-load, freed when the target moved
    assert built[(4, 8)].shutdowns == 0 and loaded is not None
    assert loaded.spec.layers == LayerRange(4, 8)
