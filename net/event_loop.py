"""The event loop: uvloop on Linux where it is installed, the standard loop elsewhere.

A hop's software cost is mostly event-loop turns (a wake-up per burst, a transmit per
turn, timers); uvloop's are cheaper (bench/README.md). Nothing depends on which loop
runs: both watch file descriptors, so net.quic.udp reads sockets directly on either.
`SANGAMA_LOOP=asyncio` forces the standard loop (to compare, or to rule uvloop out).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor where it should be used, else None (the standard loop)."""
    if sys.platform != "linux" or os.environ.get("SANGAMA_LOOP", "").lower() == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name() -> str:
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    factory = loop_factory()
    if factory is None:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
