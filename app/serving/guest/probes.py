"""What the good-guest loop looks at: the GPU through NVML, the battery through psutil.

Each probe is a callable returning plain values and never raising: a machine without
NVIDIA's library (or with a broken driver) reports no GPU figures and so never pauses for
the GPU; a desktop without a battery is never "on battery". NVML is opened once and kept
open (opening it is the costly part, and this runs every few seconds for days).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from app.serving.guest.policy import Observation

log = logging.getLogger(__name__)

__all__ = ["GpuUse", "NvmlProbe", "Probes", "battery_probe"]


@dataclass(frozen=True)
class GpuUse:
    utilisation: int | None
    """Highest utilisation (percent) of a GPU another process uses, else of any GPU."""
    other_processes: int


class NvmlProbe:
    """GPU utilisation and the processes on each NVIDIA GPU, via pynvml (nvidia-ml-py).

    `nvml` is the pynvml module, or a fake with the same functions in tests."""

    def __init__(self, nvml: Any | None = None, pid: int | None = None) -> None:
        self._nvml = nvml
        self._pid = os.getpid() if pid is None else pid
        self._handles: list[Any] | None = None
        self._failed = False

    def _open(self) -> list[Any] | None:
        if self._handles is not None or self._failed:
            return self._handles
        try:
            module = self._nvml if self._nvml is not None else importlib.import_module("pynvml")
            module.nvmlInit()
            self._nvml = module
            count = int(module.nvmlDeviceGetCount())
            self._handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # no library, no driver, no GPU: never pause for the GPU
            log.info("no NVML (%s): the GPU-busy pause is off on this PC", exc)
            self._failed = True
            return None
        return self._handles

    def __call__(self) -> GpuUse:
        handles = self._open()
        if not handles:
            return GpuUse(None, 0)
        nvml = self._nvml
        assert nvml is not None
        others_total, busiest, any_util = 0, None, None
        for handle in handles:
            try:
                util = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                pids = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
                with contextlib.suppress(Exception):  # not every driver lists graphics users
                    pids |= {p.pid for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)}
            except Exception as exc:  # a device that stopped answering says nothing
                log.debug("NVML: %s", exc)
                continue
            others = len(pids - {self._pid})
            any_util = util if any_util is None else max(any_util, util)
            if others:
                others_total += others
                busiest = util if busiest is None else max(busiest, util)
        return GpuUse(busiest if busiest is not None else any_util, others_total)

    def close(self) -> None:
        if self._handles is not None and self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._handles = None


def battery_probe(sensors: Callable[[], Any] = psutil.sensors_battery) -> bool:
    """True only when a battery exists and the charger is known to be unplugged."""
    try:
        battery = sensors()
    except Exception:  # psutil raises on some platforms without the sensor
        return False
    return battery is not None and battery.power_plugged is False


@dataclass
class Probes:
    """Everything `next_state` needs, sampled together; each part replaceable in tests."""

    gpu: Callable[[], GpuUse]
    on_battery: Callable[[], bool] = battery_probe
    local_time: Callable[[], dt.time] = lambda: dt.datetime.now().time()

    @classmethod
    def real(cls) -> Probes:
        return cls(NvmlProbe())

    def observe(self) -> Observation:
        gpu = self.gpu()
        return Observation(
            gpu_utilisation=gpu.utilisation,
            other_gpu_processes=gpu.other_processes,
            on_battery=self.on_battery(),
            local_time=self.local_time(),
        )
