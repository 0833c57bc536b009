"""How much memory this node can offer: NVIDIA VRAM through NVML, else system RAM.

NVML comes from the `pynvml` module (PyPI: nvidia-ml-py). It is imported lazily and
can be injected, so unit tests pass a fake and machines without NVIDIA drivers
still get a report instead of an exception.
"""

from __future__ import annotations

import contextlib
import importlib
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
