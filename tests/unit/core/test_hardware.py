"""core.hardware: NVML faked in-process, plus one real run on whatever this machine has."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest

from core.hardware import MemoryUse, detect_hardware, format_report, memory_in_use
from core.types import GpuInfo, HardwareReport

pytestmark = pytest.mark.unit

GIB = 1024**3


class FakeNvmlError(Exception):
    """Stands in for pynvml.NVMLError, which the code must not need to import."""


@dataclass(frozen=True)
class FakeMemory:
    total: int
    free: int


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # pynvml's name


@dataclass
class FakeNvml:
    """Just enough of pynvml; records init/shutdown so tests can check the pairing."""

    gpus: list[tuple[str | bytes, int, int]] = field(default_factory=list)
    driver: str | bytes = "550.54.15"
    init_error: Exception | None = None
    memory_error: Exception | None = None
    inits: int = 0
    shutdowns: int = 0
    processes: list[tuple[int, int, int | None]] = field(default_factory=list)
    """(gpu index, pid, bytes used) as NVML lists compute processes."""

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object:
        return index

    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes:
        assert isinstance(handle, int)
        return self.gpus[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> FakeMemory:
        assert isinstance(handle, int)
        if self.memory_error is not None:
            raise self.memory_error
        _, total, free = self.gpus[handle]
        return FakeMemory(total=total, free=free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> list[FakeProcess]:
        assert isinstance(handle, int)
        return [FakeProcess(pid, used) for gpu, pid, used in self.processes if gpu == handle]


def assert_system_memory_only(report: HardwareReport) -> None:
    assert report.gpus == ()
    assert not report.has_gpu
    assert report.driver is None
    assert report.system_total_bytes >= report.system_available_bytes > 0
    assert report.usable_bytes == report.system_available_bytes
    assert report.note.startswith("no NVIDIA GPU found (NVML: ")
    assert report.note.endswith("; reporting system memory")


def test_two_gpus_are_reported_with_their_memory_and_the_driver() -> None:
    nvml = FakeNvml(
        gpus=[
            ("NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB),
            (b"NVIDIA RTX A4000", 16 * GIB, GIB),
        ],
        driver=b"550.54.15",
    )
    report = detect_hardware(nvml)

    assert report.gpus == (
        GpuInfo(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB),
        GpuInfo(1, "NVIDIA RTX A4000", 16 * GIB, GIB),  # bytes from older pynvml decoded
    )
    assert report.driver == "550.54.15"
    assert report.usable_bytes == 21 * GIB
    assert report.system_total_bytes > 0
    assert "2 NVIDIA GPU" in report.note
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_failing_init_falls_back_to_system_memory_without_shutdown() -> None:
    nvml = FakeNvml(init_error=FakeNvmlError("Driver Not Loaded"))
    report = detect_hardware(nvml)

    assert_system_memory_only(report)
    assert "Driver Not Loaded" in report.note
    assert nvml.shutdowns == 0  # shutting down an uninitialised NVML is itself an error


def test_error_after_init_still_shuts_nvml_down() -> None:
    nvml = FakeNvml(gpus=[("GPU", GIB, GIB)], memory_error=FakeNvmlError("GPU is lost"))
    report = detect_hardware(nvml)

    assert_system_memory_only(report)
    assert "GPU is lost" in report.note
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_zero_devices_is_reported_as_no_gpu() -> None:
    nvml = FakeNvml(gpus=[])
    report = detect_hardware(nvml)

    assert_system_memory_only(report)
    assert "0 devices" in report.note
    assert nvml.shutdowns == 1


def test_missing_pynvml_module_falls_back_to_system_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    report = detect_hardware()

    assert_system_memory_only(report)
    assert "pynvml is not importable" in report.note


def test_real_machine_reports_something_usable() -> None:
    report = detect_hardware()

    assert report.system_total_bytes >= report.system_available_bytes > 0
    if report.has_gpu:  # a GPU runner: NVML's numbers must be sane
        assert report.driver
        assert all(g.total_bytes >= g.free_bytes > 0 for g in report.gpus)
    else:  # the development machine has no NVIDIA GPU
        assert_system_memory_only(report)


def test_format_report_shows_gib_with_one_decimal() -> None:
    report = HardwareReport(
        gpus=(GpuInfo(0, "RTX 4090", 24 * GIB, int(20.54 * GIB)),),
        system_total_bytes=64 * GIB,
        system_available_bytes=int(31.27 * GIB),
        driver="550.54.15",
        note="1 NVIDIA GPU(s) via NVML, driver 550.54.15",
    )
    text = format_report(report)

    assert "GPU 0: RTX 4090: 20.5 GiB free of 24.0 GiB" in text
    assert "driver 550.54.15" in text
    assert "31.3 GiB available of 64.0 GiB" in text
    assert "usable for layers: 20.5 GiB" in text


def test_format_report_without_gpu_shows_the_note() -> None:
    report = HardwareReport((), 8 * GIB, 3 * GIB, None, "no NVIDIA GPU found (NVML: x)")
    text = format_report(report)

    assert "GPU" not in text.replace("no NVIDIA GPU found", "")
    assert "usable for layers: 3.0 GiB (no NVIDIA GPU found (NVML: x))" in text


def test_memory_in_use_sums_this_process_over_gpus_via_nvml() -> None:
    nvml = FakeNvml(
        gpus=[("A", 16 * GIB, 8 * GIB), ("B", 16 * GIB, 8 * GIB)],
        processes=[(0, 4242, 3 * GIB), (1, 4242, 2 * GIB), (1, 99, 7 * GIB), (0, 4242, None)],
    )
    use = memory_in_use(4242, nvml)
    assert use == MemoryUse("VRAM", 5 * GIB)
    assert use.describe() == "5.0 GiB of VRAM"
    assert nvml.inits == nvml.shutdowns == 1


def test_memory_in_use_falls_back_to_this_process_rss() -> None:
    for nvml in (FakeNvml(init_error=FakeNvmlError("no driver")), FakeNvml(gpus=[])):
        use = memory_in_use(None, nvml)
        assert use.kind == "RAM"
        assert use.bytes > 10 * 1024**2  # this Python process, numpy and all
