"""Engine calls: one at a time, in order, every one of them (steps too) on the engine thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.config import WorkerConfig
from app.errors import ConfigError
from app.serving.steps.engine_calls import EngineCalls


def test_a_step_runs_on_the_engine_thread_behind_queued_calls() -> None:
    """An open queued on the engine thread must reach the engine before the step."""
    calls = EngineCalls()
    order: list[str] = []
    release = threading.Event()

    def slow_open() -> None:
        release.wait(5)
        order.append("open")

    def step() -> str:
        order.append("step")
        return threading.current_thread().name

    async def main() -> str:
        opened = asyncio.wrap_future(calls.submit(slow_open))
        asyncio.get_running_loop().call_later(0.05, release.set)
        ran_on = await calls.run(step)
        await opened
        return ran_on

    try:
        ran_on = asyncio.run(main())
    finally:
        calls.shutdown()
    assert order == ["open", "step"]
    assert ran_on.startswith("engine")


def test_failed_call_still_frees_the_engine_thread() -> None:
    calls = EngineCalls()

    def boom() -> None:
        raise RuntimeError("engine failed")

    async def main() -> int:
        with pytest.raises(RuntimeError):
            await calls.run(boom)
        return await calls.run(threading.get_ident)

    try:
        assert asyncio.run(main()) != threading.get_ident()
    finally:
        calls.shutdown()


def test_a_config_naming_the_removed_inline_setting_is_refused_by_name() -> None:
    base = {
        "node_id": "s0",
        "listen": "127.0.0.1:1",
        "layers": [0, 2],
        "credentials": "/c",
    }
    assert "inline_step_ms" not in WorkerConfig.from_dict(base).to_toml()
    with pytest.raises(ConfigError, match="'inline_step_ms' was removed"):
        WorkerConfig.from_dict({**base, "inline_step_ms": 30})
