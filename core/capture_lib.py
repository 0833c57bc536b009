"""The compiled capture callback (csrc/capture_cb.c): built once per machine, loaded once.

The library is named after a SHA-256 of its source and of the engine library it links
against, so every process on the machine finds the same file (Python's `hash()` is salted
per process and gave each process its own copy). Two processes starting together take
a file lock; the loser waits and then loads what the winner built. The compiler writes
to a unique temporary name that is renamed into place, so a half-written library is
never visible under the final name.

Installers compile it at packaging time instead (installers/linux/build.py) and ship it
in `core/prebuilt/`, named after the source's digest; a shipped library for this very
source is used first, so the volunteer's PC needs no C compiler.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs

from core.backends import lib_path

log = logging.getLogger(__name__)

__all__ = ["capture_lib_path", "load_capture_lib", "prebuilt_capture_lib", "prebuilt_name"]

_SOURCE = "csrc/capture_cb.c"
_lock = threading.Lock()
_lib: Any = None
_error: str | None = None


def _source() -> bytes:
    return resources.files("core").joinpath(_SOURCE).read_bytes()


def prebuilt_name() -> str:
    """The file name an installer gives the library it compiled from this source."""
    suffix = ".dll" if sys.platform == "win32" else ".so"
    return f"capture_cb-{hashlib.sha256(_source()).hexdigest()[:16]}{suffix}"


def prebuilt_capture_lib() -> Path | None:
    """The library an installer shipped for this source, if there is one."""
    path = Path(str(resources.files("core").joinpath("prebuilt", prebuilt_name())))
    return path if path.is_file() else None


def capture_lib_path(cache_dir: Path | None = None) -> Path:
    """Where this source, built against this engine library, lives in the cache."""
    digest = hashlib.sha256(_source())
    digest.update(str(lib_path("ggml-base")).encode())
    cache = cache_dir or Path(platformdirs.user_cache_dir("sangama")) / "native"
    suffix = ".dll" if sys.platform == "win32" else ".so"
    return cache / f"capture_cb-{digest.hexdigest()[:16]}{suffix}"


@contextlib.contextmanager
def _machine_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` held by one process of the machine at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        if sys.platform == "win32":
            import msvcrt

            msvcrt.locking(fh.fileno(), msvcrt.LK_LOCK, 1)
        else:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield  # the lock is released when the file closes


def _compile(out: Path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler on PATH")
    base = lib_path("ggml-base")
    c_file = out.with_suffix(".c")
    c_file.write_bytes(_source())
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        subprocess.run(
            [
                cc,
                "-O2",
                "-shared",
                "-fPIC",
                str(c_file),
                "-o",
                str(tmp),
                f"-L{base.parent}",
                "-lggml-base",
                f"-Wl,-rpath,{base.parent}",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def build_capture_lib(cache_dir: Path | None = None) -> Path:
    """Compile the library unless it is already there; returns its path. Raises OSError."""
    out = capture_lib_path(cache_dir)
    if out.exists():
        return out
    with _machine_lock(out.with_suffix(".lock")):
        if not out.exists():  # another process may have built it while we waited
            try:
                _compile(out)
            except subprocess.CalledProcessError as exc:
                raise OSError(f"compiling {_SOURCE} failed: {exc.stderr!r}") from exc
            except subprocess.SubprocessError as exc:
                raise OSError(f"compiling {_SOURCE} failed: {exc}") from exc
    return out


def load_capture_lib() -> Any:
    """The loaded library, or None where it cannot be built (the engine then uses Python)."""
    global _lib, _error
    with _lock:
        if _lib is None and _error is None:
            try:
                ctypes.CDLL(str(lib_path("ggml-base")))  # the callback links against it
                _lib = ctypes.CDLL(str(prebuilt_capture_lib() or build_capture_lib()))
            except OSError as exc:
                _error = str(exc)
                log.info("C capture callback unavailable (%s); using the Python callback", exc)
        return _lib
