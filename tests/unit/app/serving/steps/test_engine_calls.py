"""Engine calls: one at a time, in order; a short step runs inline only when nothing is queued."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from app.config import WorkerConfig
from app.errors import ConfigError
from app.serving.steps.engine_calls import EngineCalls, InlinePolicy, runs_inline
from core.types import LayerRange


def test_policy_inlines_short_decode_steps_only() -> None:
    policy = InlinePolicy(limit_ms=50.0, max_rows=8)
    assert runs_inline(policy, 1, 20.0)
    assert runs_inline(policy, 8, 50.0)
    assert not runs_inline(policy, 1, None)  # not measured yet: the engine thread times it
    assert not runs_inline(policy, 1, 50.1)  # too long to hold the event loop
    assert not runs_inline(policy, 9, 1.0)  # a prompt chunk or a big batch
    assert not runs_inline(InlinePolicy(limit_ms=0.0), 1, 0.1)  # switched off


def test_inline_step_runs_on_the_loop_thread_when_idle() -> None:
    calls = EngineCalls()

    async def main() -> tuple[int, int]:
        inline = await calls.run_step(True, threading.get_ident)
        threaded = await calls.run_step(False, threading.get_ident)
        return inline, threaded

    try:
        inline, threaded = asyncio.run(main())
    finally:
        calls.shutdown()
    assert inline == threading.get_ident()
    assert threaded != inline
    assert calls.inline_calls == 1


def test_inline_step_waits_behind_queued_calls() -> None:
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
        ran_on = await calls.run_step(True, step)
        await opened
        return ran_on

    try:
        ran_on = asyncio.run(main())
    finally:
        calls.shutdown()
    assert order == ["open", "step"]
    assert ran_on.startswith("engine")
    assert calls.inline_calls == 0


def test_failed_call_still_frees_the_engine_thread() -> None:
    calls = EngineCalls()

    def boom() -> None:
        raise RuntimeError("engine failed")

    async def main() -> int:
        with pytest.raises(RuntimeError):
            await calls.run(boom)
        return await calls.run_step(True, threading.get_ident)

    try:
        assert asyncio.run(main()) == threading.get_ident()
    finally:
        calls.shutdown()


def test_worker_config_inline_setting_round_trips() -> None:
    base = {
        "node_id": "s0",
        "listen": "127.0.0.1:1",
        "layers": [0, 2],
        "credentials": "/c",
    }
    assert WorkerConfig.from_dict(base).inline_step_ms == 0.0
    cfg = WorkerConfig.from_dict({**base, "inline_step_ms": 30})
    assert cfg.inline_step_ms == 30.0
    assert "inline_step_ms = 30.0" in cfg.to_toml()
    with pytest.raises(ConfigError):
        WorkerConfig(
            "s0", ("127.0.0.1", 1), "default", LayerRange(0, 2), cfg.credentials, inline_step_ms=-1
        )


@pytest.mark.parametrize("threads", [0, 2])
def test_steps_inline_at_more_threads_only_pinned(threads: int) -> None:
    # At more threads (or auto), a step on the loop thread starts a second OpenMP team,
    # which unpinned was found sharing a core with itself.
    with pytest.raises(ConfigError, match="needs cpus"):
        WorkerConfig(
            "s0", ("127.0.0.1", 1), "default", LayerRange(0, 2), Path("/c"),
            threads=threads, inline_step_ms=30,
        )  # fmt: skip
    pinned = WorkerConfig(
        "s0", ("127.0.0.1", 1), "default", LayerRange(0, 2), Path("/c"),
        threads=threads, inline_step_ms=30, cpus="0-1",
    )  # fmt: skip
    assert pinned.cpu_list == (0, 1) and pinned.inline_step_ms == 30.0
    assert (
        WorkerConfig(
            "s0", ("127.0.0.1", 1), "default", LayerRange(0, 2), Path("/c"), threads=threads
        ).inline_step_ms
        == 0.0
    )


def test_after_steps_runs_on_the_engine_thread_only_when_nothing_is_queued() -> None:
    """core.omp_idle's park goes there: after the step's result, never before a call
    already waiting (that call's graph would only have to wake the threads again)."""
    calls = EngineCalls()
    hooks: list[int] = []
    calls.after_steps = lambda: hooks.append(threading.get_ident())
    release = threading.Event()

    async def main() -> tuple[int, int]:
        alone = await calls.run_step(False, threading.get_ident)
        # The hook runs on the engine thread after the step's result is out; a call
        # submitted before it looks would make it stand aside, so wait without one.
        for _ in range(500):
            if hooks:
                break
            await asyncio.sleep(0.01)
        assert len(hooks) == 1
        # A step with another call queued behind it: the hook stands aside.
        step = asyncio.ensure_future(calls.run_step(False, lambda: release.wait(5)))
        await asyncio.sleep(0)
        queued = calls.submit(threading.get_ident)
        release.set()
        await step
        return alone, await asyncio.wrap_future(queued)

    try:
        alone, engine_thread = asyncio.run(main())
    finally:
        calls.shutdown()
    assert hooks == [alone] and alone == engine_thread != threading.get_ident()
