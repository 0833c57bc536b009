"""The probes with NVML and the battery faked: what they report and that they never raise."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from app.serving.guest.policy import GPU_BUSY, GuestSettings, GuestState, next_state
from app.serving.guest.probes import GpuUse, NvmlProbe, Probes, battery_probe

ME = 4242


class FakeNvml:
    """pynvml's functions the probe calls, over a table of devices."""

    def __init__(self, devices: list[dict[str, Any]], fail_init: bool = False) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.fail_init:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self.devices[h]["util"], memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.devices[h]["compute"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        if "graphics" not in self.devices[h]:
            raise RuntimeError("NVMLError_NotSupported")
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.devices[h]["graphics"]]


def test_a_game_on_the_gpu_is_another_process_and_our_stage_is_not() -> None:
    nvml = FakeNvml([{"util": 97, "compute": [ME], "graphics": [777]}])
    probe = NvmlProbe(nvml, pid=ME)
    assert probe() == GpuUse(97, 1)
    nvml.devices[0]["graphics"] = []
    assert probe() == GpuUse(97, 0)  # only our own work: not busy
    assert nvml.inits == 1  # opened once, kept open


def test_the_busiest_gpu_with_another_user_counts_and_graphics_lists_are_optional() -> None:
    nvml = FakeNvml([{"util": 90, "compute": [ME]}, {"util": 30, "compute": [99, 98]}])
    assert NvmlProbe(nvml, pid=ME)() == GpuUse(30, 2)


def test_no_nvml_means_no_figures_and_so_never_a_gpu_pause() -> None:
    probe = NvmlProbe(FakeNvml([], fail_init=True), pid=ME)
    assert probe() == GpuUse(None, 0)
    assert probe() == GpuUse(None, 0)
    probes = Probes(probe, on_battery=lambda: False, local_time=lambda: dt.time(12))
    assert next_state(GuestState(), probes.observe(), GuestSettings(), 0).serving


def test_battery_probe_reads_psutil_and_survives_its_failures() -> None:
    assert battery_probe(lambda: SimpleNamespace(percent=80, power_plugged=False)) is True
    assert battery_probe(lambda: SimpleNamespace(percent=80, power_plugged=True)) is False
    assert battery_probe(lambda: SimpleNamespace(percent=80, power_plugged=None)) is False
    assert battery_probe(lambda: None) is False  # a desktop

    def broken() -> None:
        raise NotImplementedError("no sensors here")

    assert battery_probe(broken) is False


def test_observe_puts_the_probes_together_for_the_policy() -> None:
    nvml = FakeNvml([{"util": 80, "compute": [ME, 555]}])
    probes = Probes(NvmlProbe(nvml, pid=ME), lambda: True, lambda: dt.time(3, 30))
    seen = probes.observe()
    assert (seen.gpu_utilisation, seen.other_gpu_processes, seen.on_battery) == (80, 1, True)
    assert seen.local_time == dt.time(3, 30)
    no_battery_rule = GuestSettings(pause_on_battery=False)
    assert next_state(GuestState(), seen, no_battery_rule, 0).reason == GPU_BUSY
