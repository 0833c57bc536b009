"""llama.cpp's compute backends in this process: load them once, list them, and keep AMX out.

The shipped engine wheel is built with `GGML_BACKEND_DL`: the CPU kernels come as one
module per CPU generation (`libggml-cpu-haswell.so`, `-zen4`, ...) and the GPU backend as
another (`libggml-vulkan.so`); nothing is registered until someone loads them. We load
them from the wheel's own lib folder (llama.cpp would otherwise look beside the Python
executable), and ggml picks the best CPU variant this CPU supports.

AMX: the AMX weight layout of ggml-cpu crashes on some Xeons (docs/engine.md). The
shipped wheel does not build the variant that contains it; for any other build (a
developer's native one) we remove the AMX buffer type from the list llama.cpp places
weights from, before the first model loads, so the repacked AVX2/AVX-512 layouts stay in
use and no weight is ever packed for AMX.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import llama_cpp as _llama_cpp_pkg

from core.errors import ModelLoadError
from core.types import BackendReport, ComputeDevice

log = logging.getLogger(__name__)

__all__ = [
    "LIB_DIR",
    "backend_report",
    "batch_variant",
    "ensure_backends",
    "lib_path",
    "refused_buffer_types",
]

LIB_DIR = Path(_llama_cpp_pkg.__file__).parent / "lib"

# Weight layouts Sangama never lets llama.cpp use, by ggml buffer-type name. The
# variable replaces the list (comma-separated; empty allows AMX): for measuring an
# upstream fix and for testing the mechanism on CPUs without AMX. See docs/engine.md.
_REFUSED_BUFFER_TYPES = ("AMX",)
_REFUSE_ENV = "SANGAMA_REFUSE_BUFFER_TYPES"

_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}

# Batching may change a session's numbers three ways: in one KV cache shared by all
# sessions its cells sit at other indices, and two CPU paths sum a row's products in an
# order that depends on how many rows share the step (the repacked layouts' 4-row gemm,
# the tiled K-quant matmul at 8 rows or more); and the machine's thread count changes a
# long row's attention (the KV-chunked flash attention). Stages avoid all four by default
# (docs/decisions/batch-invariance.md; the engine wheel's patches sum every row alone);
# "1" brings them back, for measuring what exact numbers cost.
_BATCH_VARIANT_ENV = "SANGAMA_BATCH_VARIANT"


def batch_variant() -> bool:
    """One shared KV cache, the repacked layouts' 4-row gemm, the tiled matmul and the
    KV-chunked attention: steps whose numbers depend on what else shares them and on the
    thread count. For measurements."""
    return os.environ.get(_BATCH_VARIANT_ENV) == "1"


def lib_path(stem: str) -> Path:
    """A llama.cpp shared library inside the installed llama_cpp package.

    On Linux the wheel holds `libggml.so`, `libggml.so.0` and `libggml.so.0.x.y` as three
    copies, not links. libllama loads the one named by its SONAME (`libggml.so.0`); we
    must open that same file, or the loader maps a second copy with its own (empty)
    backend registry.
    """
    versioned = sorted(LIB_DIR.glob(f"lib{stem}.so.*"), key=lambda p: len(p.name))
    if versioned:
        return versioned[0]
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        if (LIB_DIR / name).exists():
            return LIB_DIR / name
    raise ModelLoadError(f"{stem} library not found in {LIB_DIR}")


def refused_buffer_types() -> tuple[str, ...]:
    env = os.environ.get(_REFUSE_ENV)
    if env is None:
        return _REFUSED_BUFFER_TYPES
    return tuple(name.strip() for name in env.split(",") if name.strip())


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def _declare(lib: Any, name: str, restype: Any, *argtypes: Any) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def _load_ggml() -> Any:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    ggml = ctypes.CDLL(str(lib_path("ggml")))
    _declare(ggml, "ggml_backend_load_all_from_path", None, ctypes.c_char_p)
    _declare(ggml, "ggml_backend_dev_count", sz)
    _declare(ggml, "ggml_backend_dev_get", vp, sz)
    _declare(ggml, "ggml_backend_dev_name", ctypes.c_char_p, vp)
    _declare(ggml, "ggml_backend_dev_description", ctypes.c_char_p, vp)
    _declare(ggml, "ggml_backend_dev_type", ctypes.c_int, vp)
    _declare(ggml, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
    _declare(ggml, "ggml_backend_dev_backend_reg", vp, vp)
    _declare(ggml, "ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)
    return ggml


def _load_ggml_base() -> Any:
    base = ctypes.CDLL(str(lib_path("ggml-base")))
    _declare(base, "ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    return base


_lock = threading.Lock()
_report: BackendReport | None = None


def ensure_backends() -> BackendReport:
    """Load the backend modules (once per process), refuse AMX, and say what was found.

    Call before the first model load: weight placement reads the buffer-type list then.
    """
    global _report
    with _lock:
        if _report is None:
            _report = _initialise()
        return _report


def backend_report() -> BackendReport:
    """What runs where; loads the backends if nobody did yet. Raises ModelLoadError."""
    return ensure_backends()


_log_callback: Any = None


def _quiet_logging() -> None:
    """Route llama.cpp's and ggml's log lines to `logging`: DEBUG, errors as errors."""
    global _log_callback
    import llama_cpp.llama_cpp as ll

    def to_logging(level: int, text: bytes, _ud: Any) -> None:
        # Loading is chatty (every backend module, every tensor); keep it at DEBUG.
        if text and level == 4:  # GGML_LOG_LEVEL_ERROR (5 is a continuation line)
            log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())
        elif text and log.isEnabledFor(logging.DEBUG):
            log.debug("llama.cpp: %s", text.decode(errors="replace").rstrip())

    _log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
        to_logging
    )
    ll.llama_log_set(_log_callback, None)


def _initialise() -> BackendReport:
    _quiet_logging()
    # ggml-cpu reads these at its first matmul; an explicit setting wins.
    if batch_variant():
        os.environ.setdefault("GGML_CPU_REPACK_GEMM", "1")
        os.environ.setdefault("GGML_CPU_FA_SPLIT", "1")
    else:
        os.environ.setdefault("GGML_CPU_TILED_MM", "0")
    ggml, base = _load_ggml(), _load_ggml_base()
    dynamic = not _has_cpu_device(ggml)
    if dynamic:
        # Shipped build: nothing is registered until the modules are loaded.
        ggml.ggml_backend_load_all_from_path(str(LIB_DIR).encode())
        if not _has_cpu_device(ggml):
            raise ModelLoadError(
                f"no CPU backend could be loaded from {LIB_DIR}: the engine wheel is incomplete"
            )
    cpu = _cpu_device(ggml)
    disabled = _drop_buffer_types(ggml, base, cpu, refused_buffer_types())
    return BackendReport(
        cpu_variant=_cpu_variant() if dynamic else "built-in",
        cpu_features=_cpu_features(ggml, cpu),
        devices=tuple(_devices(ggml)),
        disabled_buffer_types=disabled,
        dynamic=dynamic,
    )


def _has_cpu_device(ggml: Any) -> bool:
    return any(
        ggml.ggml_backend_dev_type(ggml.ggml_backend_dev_get(i)) == 0
        for i in range(ggml.ggml_backend_dev_count())
    )


def _cpu_device(ggml: Any) -> int:
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) == 0:
            return int(dev)
    raise ModelLoadError("llama.cpp has no CPU device")


def _devices(ggml: Any) -> list[ComputeDevice]:
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            ComputeDevice(
                name=(ggml.ggml_backend_dev_name(dev) or b"?").decode(errors="replace"),
                description=(ggml.ggml_backend_dev_description(dev) or b"")
                .decode(errors="replace")
                .strip(),
                kind=_DEVICE_KINDS.get(int(ggml.ggml_backend_dev_type(dev)), "other"),
                total_bytes=int(total.value),
                free_bytes=int(free.value),
            )
        )
    return out


def _cpu_features(ggml: Any, cpu: int) -> tuple[str, ...]:
    reg = ggml.ggml_backend_dev_backend_reg(cpu)
    addr = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if not addr:
        return ()
    fn = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(addr)
    feats, i, names = fn(reg), 0, []
    while feats[i].name:
        value = (feats[i].value or b"").decode()
        # Flags report "1"; a few entries carry a value (e.g. the variant's own name).
        names.append(feats[i].name.decode() + ("" if value == "1" else f"={value}"))
        i += 1
    return tuple(names)


def _drop_buffer_types(ggml: Any, base: Any, cpu: int, refused: tuple[str, ...]) -> tuple[str, ...]:
    """Remove refused extra buffer types from the CPU device's list, in place.

    llama.cpp reads this null-terminated array (ggml_backend_dev_get_extra_bufts) when it
    places weights; the array is the CPU backend's own static storage, so compacting it
    before the first load keeps every later load off the refused layouts.
    """
    reg = ggml.ggml_backend_dev_backend_reg(cpu)
    addr = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not addr or not refused:
        return ()
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)
    array = get(cpu)
    if not array:
        return ()
    entries: list[int] = []
    while array[len(entries)]:
        entries.append(int(array[len(entries)]))
    kept = [b for b in entries if base.ggml_backend_buft_name(b).decode() not in refused]
    dropped = tuple(base.ggml_backend_buft_name(b).decode() for b in entries if b not in kept)
    for i, buft in enumerate(kept):
        array[i] = buft
    for i in range(len(kept), len(entries)):
        array[i] = None
    return dropped


def _cpu_variant() -> str:
    """The libggml-cpu-<variant> module ggml chose, from the libraries mapped in."""
    prefix = "libggml-cpu-" if sys.platform != "win32" else "ggml-cpu-"
    try:
        import psutil

        paths = [m.path for m in psutil.Process().memory_maps(grouped=True)]
    except Exception:  # a restricted /proc: the variant is a nicety, not a requirement
        return "unknown"
    for path in paths:
        name = Path(path).name
        if name.startswith(prefix):
            return name[len(prefix) :].split(".")[0]
    return "unknown"


def device_handle(name: str) -> int:
    """The ggml_backend_dev_t of a device by its ggml name, for llama_model_params.devices."""
    ensure_backends()
    ggml = _load_ggml()
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if (ggml.ggml_backend_dev_name(dev) or b"").decode(errors="replace") == name:
            return int(dev)
    raise ModelLoadError(f"llama.cpp has no device named {name!r}")


def current_devices() -> list[ComputeDevice]:
    """The devices with their free memory as of now (the report keeps start-up values)."""
    ensure_backends()
    return _devices(_load_ggml())
