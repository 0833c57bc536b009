"""`sangama hardware` and `--json`: the memory lines, then what llama.cpp runs on; from
fake reports, so no NVML and no engine library are needed."""

from __future__ import annotations

import json

import pytest

import core.hardware
from app.cli import main as cli
from app.cli.hardware_view import format_hardware, hardware_document, in_use
from core.types import BackendReport, ComputeDevice, GpuInfo, HardwareReport

pytestmark = pytest.mark.unit

GIB = 1024**3
CPU = ComputeDevice("CPU", "AMD EPYC 7B13", "cpu", 64 * GIB, 60 * GIB)
GPU = ComputeDevice("Vulkan0", "NVIDIA GeForce RTX 4090", "gpu", 24 * GIB, 22 * GIB)
CPU_ONLY = BackendReport("zen4", ("AVX2", "F16C"), (CPU,), ("AMX",), dynamic=True)
WITH_GPU = BackendReport("built-in", (), (CPU, GPU), (), dynamic=False)
HARDWARE = HardwareReport(
    gpus=(GpuInfo(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 22 * GIB),),
    system_total_bytes=64 * GIB,
    system_available_bytes=48 * GIB,
    driver="550.54",
    note="1 NVIDIA GPU(s) via NVML, driver 550.54",
)


def test_in_use_is_the_first_gpu_else_the_cpu_variant() -> None:
    assert in_use(CPU_ONLY) == "CPU (zen4)"
    assert in_use(WITH_GPU) == "Vulkan0 (NVIDIA GeForce RTX 4090)"


def test_human_output_keeps_the_memory_lines_and_adds_the_backend() -> None:
    text = format_hardware(HARDWARE, CPU_ONLY)
    assert text.startswith(core.hardware.format_report(HARDWARE) + "\n")
    backend = text.splitlines()[len(core.hardware.format_report(HARDWARE).splitlines()) :]
    assert backend == [
        "compute backend: CPU (zen4)",
        "CPU kernels: zen4 (AVX2 F16C)",
        "device CPU: AMD EPYC 7B13 (cpu): 60.0 GiB free of 64.0 GiB",
        "disabled weight layouts: AMX",
        "engine build: shipped (backends loaded as modules at start-up)",
    ]
    gpu = format_hardware(HARDWARE, WITH_GPU)
    assert "compute backend: Vulkan0 (NVIDIA GeForce RTX 4090)" in gpu
    assert "device Vulkan0: NVIDIA GeForce RTX 4090 (gpu): 22.0 GiB free of 24.0 GiB" in gpu
    assert "CPU kernels: built-in (none reported)" in gpu
    assert "disabled weight layouts: none" in gpu
    assert "engine build: static" in gpu


def test_json_document_holds_both_reports() -> None:
    doc = json.loads(json.dumps(hardware_document(HARDWARE, WITH_GPU)))
    assert doc["usable_bytes"] == 22 * GIB
    assert doc["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA GeForce RTX 4090",
            "total_bytes": 24 * GIB,
            "free_bytes": 22 * GIB,
        }
    ]
    assert doc["driver"] == "550.54" and doc["system_total_bytes"] == 64 * GIB
    backend = doc["backend"]
    assert backend["in_use"] == "Vulkan0 (NVIDIA GeForce RTX 4090)"
    assert backend["dynamic"] is False and backend["cpu_variant"] == "built-in"
    assert [d["name"] for d in backend["devices"]] == ["CPU", "Vulkan0"]
    assert backend["devices"][1]["kind"] == "gpu"
    assert "backend_error" not in doc


def _fake_machine(monkeypatch: pytest.MonkeyPatch, backend: BackendReport | str) -> None:
    monkeypatch.setattr(core.hardware, "detect_hardware", lambda: HARDWARE)
    monkeypatch.setattr(cli, "_backend_report", lambda: backend)


def test_command_prints_lines_or_one_json_object(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_machine(monkeypatch, CPU_ONLY)
    assert cli.main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "usable for layers: 22.0 GiB" in out and "compute backend: CPU (zen4)" in out
    assert cli.main(["hardware", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"]["in_use"] == "CPU (zen4)"
    assert doc["backend"]["disabled_buffer_types"] == ["AMX"]


def test_missing_engine_still_reports_memory_and_fails_the_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_machine(monkeypatch, "ModelLoadError: ggml library not found in /x/lib")
    assert cli.main(["hardware"]) == 1
    out = capsys.readouterr().out
    assert "usable for layers:" in out
    assert out.rstrip().endswith(
        "compute backend: unavailable: ModelLoadError: ggml library not found in /x/lib"
    )
    assert cli.main(["hardware", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] is None and "ggml library not found" in doc["backend_error"]
