"""How much memory this node can offer: NVIDIA VRAM through NVML, else system RAM.

NVML comes from the `pynvml` module (PyPI: nvidia-ml-py). It is imported lazily and
can be injected, so unit tests pass a fake and machines without NVIDIA drivers
still get a report instead of an exception.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

from core.types import GpuInfo, HardwareReport

__all__ = ["Nvml", "detect_hardware", "format_report"]

_GIB = 1024**3


class NvmlMemory(Protocol):
    """The part of pynvml's `c_nvmlMemory_t` we read."""

    @property
    def total(self) -> int: ...

    @property
    def free(self) -> int: ...


class Nvml(Protocol):
    """The slice of the pynvml module `detect_hardware` uses."""

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...

    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...

    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> NvmlMemory: ...

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> Sequence[NvmlProcess]: ...


class NvmlProcess(Protocol):
    """The part of pynvml's process info we read."""

    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...  # pynvml's name


@dataclass(frozen=True)
class MemoryUse:
    """What this process holds: GPU memory where NVML sees it on a GPU, else RAM."""

    kind: str
    """"VRAM" or "RAM"."""
    bytes: int

    def describe(self) -> str:
        return f"{_gib(self.bytes)} of {self.kind}"


def memory_in_use(pid: int | None = None, nvml: Nvml | None = None) -> MemoryUse:
    """This process's memory for the status window and heartbeats; never raises."""
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(Exception):  # no NVML, no GPU, a broken driver: RAM below
        module = nvml if nvml is not None else _import_pynvml()
        module.nvmlInit()
        try:
            used = 0
            for index in range(module.nvmlDeviceGetCount()):
                handle = module.nvmlDeviceGetHandleByIndex(index)
                for proc in module.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == pid and proc.usedGpuMemory:
                        used += int(proc.usedGpuMemory)
        finally:
            _shutdown_quietly(module)
        if used:
            return MemoryUse("VRAM", used)
    try:
        return MemoryUse("RAM", int(psutil.Process(pid).memory_info().rss))
    except psutil.Error:
        return MemoryUse("RAM", 0)


def detect_hardware(nvml: Nvml | None = None) -> HardwareReport:
    """Report GPUs via NVML (imported lazily when `nvml` is None); never raises."""
    memory = psutil.virtual_memory()
    # Deliberately broad: pynvml raises NVMLError subclasses, but a broken driver can
    # surface as OSError or AttributeError from ctypes, and a capacity report must not
    # take the worker down with it.
    try:
        module = nvml if nvml is not None else _import_pynvml()
        driver, gpus = _query(module)
    except Exception as exc:
        return _system_only(memory.total, memory.available, f"NVML: {_reason(exc)}")
    if not gpus:
        return _system_only(memory.total, memory.available, "NVML: 0 devices")
    return HardwareReport(
        gpus=gpus,
        system_total_bytes=memory.total,
        system_available_bytes=memory.available,
        driver=driver,
        note=f"{len(gpus)} NVIDIA GPU(s) via NVML, driver {driver}",
    )


def format_report(report: HardwareReport) -> str:
    """A few human lines: one per GPU, then system memory, then the note."""
    lines = [
        f"GPU {g.index}: {g.name}: {_gib(g.free_bytes)} free of {_gib(g.total_bytes)}"
        for g in report.gpus
    ]
    if report.driver is not None:
        lines.append(f"NVIDIA driver {report.driver}")
    lines.append(
        f"system memory: {_gib(report.system_available_bytes)} available"
        f" of {_gib(report.system_total_bytes)}"
    )
    lines.append(f"usable for layers: {_gib(report.usable_bytes)} ({report.note})")
    return "\n".join(lines)


def _import_pynvml() -> Nvml:
    # Imported here, not at module top, so `core.hardware` loads without NVIDIA bits.
    return importlib.import_module("pynvml")


def _query(nvml: Nvml) -> tuple[str, tuple[GpuInfo, ...]]:
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = _text(nvml.nvmlDeviceGetName(handle))
            gpus.append(GpuInfo(index, name, int(memory.total), int(memory.free)))
        return driver, tuple(gpus)
    finally:
        _shutdown_quietly(nvml)


def _shutdown_quietly(nvml: Nvml) -> None:
    # A failing shutdown must not hide the result (or the error) we already have.
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _system_only(total: int, available: int, reason: str) -> HardwareReport:
    return HardwareReport(
        gpus=(),
        system_total_bytes=total,
        system_available_bytes=available,
        driver=None,
        note=f"no NVIDIA GPU found ({reason}); reporting system memory",
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, ImportError):
        return f"pynvml is not importable, install nvidia-ml-py ({exc})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / _GIB:.1f} GiB"
