"""`sangama hardware`: the memory this machine offers and what llama.cpp would run on,
as lines for a person or one JSON object for scripts and bug reports."""

from __future__ import annotations

import dataclasses
from typing import Any

from core.hardware import format_report
from core.types import BackendReport, HardwareReport

__all__ = ["backend_dict", "format_backend", "format_hardware", "hardware_document", "in_use"]

_GIB = 1024**3


def in_use(report: BackendReport) -> str:
    """The backend a stage would run on: the first GPU llama.cpp lists, else the CPU."""
    gpus = report.gpus
    if gpus:
        return f"{gpus[0].name} ({gpus[0].description})"
    return report.describe()


def format_backend(report: BackendReport) -> str:
    """The backend section: what is in use, the CPU kernels, each device, the build."""
    features = " ".join(report.cpu_features) or "none reported"
    lines = [
        f"compute backend: {in_use(report)}",
        f"CPU kernels: {report.cpu_variant} ({features})",
    ]
    lines += [
        f"device {d.name}: {d.description or '?'} ({d.kind}):"
        f" {d.free_bytes / _GIB:.1f} GiB free of {d.total_bytes / _GIB:.1f} GiB"
        for d in report.devices
    ]
    disabled = ", ".join(report.disabled_buffer_types) or "none"
    lines.append(f"disabled weight layouts: {disabled}")
    lines.append(
        "engine build: shipped (backends loaded as modules at start-up)"
        if report.dynamic
        else "engine build: static (not the shipped wheel; backends compiled in)"
    )
    return "\n".join(lines)


def format_hardware(hardware: HardwareReport, backend: BackendReport | str) -> str:
    """The memory lines `sangama hardware` always printed, then the backend section;
    `backend` is the report, or why llama.cpp could not be loaded."""
    tail = (
        format_backend(backend)
        if isinstance(backend, BackendReport)
        else f"compute backend: unavailable: {backend}"
    )
    return f"{format_report(hardware)}\n{tail}"


def backend_dict(report: BackendReport) -> dict[str, Any]:
    return {**dataclasses.asdict(report), "in_use": in_use(report)}


def hardware_document(hardware: HardwareReport, backend: BackendReport | str) -> dict[str, Any]:
    """One JSON-ready object: the hardware report's fields and `backend` (null when
    llama.cpp could not be loaded, with the reason in `backend_error`)."""
    doc: dict[str, Any] = {**dataclasses.asdict(hardware), "usable_bytes": hardware.usable_bytes}
    if isinstance(backend, BackendReport):
        doc["backend"] = backend_dict(backend)
    else:
        doc["backend"] = None
        doc["backend_error"] = backend
    return doc
