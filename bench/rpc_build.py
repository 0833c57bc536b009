"""Build llama.cpp's `rpc-server` and `llama-bench` once, from the vendored source of the
pinned llama-cpp-python sdist, cached under `~/.cache/sangama/rpc/<recipe digest>/`.

Only bench/rpc_compare.py needs them (the peer users would pick instead of Sangama), so
nothing in `make test` builds this. The build is the machine's own (`GGML_NATIVE=ON`,
static, CPU only, RPC on): on a CPU where Sangama's shipped wheel loads a variant with the
same feature set (here: AVX2 EPYC, `haswell`), both run the same kernels. Two targets on
two cores take ~10 min.

    .venv/bin/python bench/rpc_build.py [--print-dir]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_RPC=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)
TARGETS = ("ggml-rpc-server", "llama-bench")
# Bump when a change here changes the binaries without changing a flag or a target.
REVISION = 1


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    text = json.dumps(
        {"v": LLAMA_CPP_PYTHON, "cmake": CMAKE_ARGS, "targets": TARGETS, "rev": REVISION},
        sort_keys=True,
    ).encode()
    return Path(base) / "sangama" / "rpc" / hashlib.sha256(text).hexdigest()[:16]


def binaries(directory: Path | None = None) -> dict[str, Path] | None:
    """The cached binaries, or None when they are not built yet."""
    d = (directory or cache_dir()) / "bin"
    found = {t: d / t for t in TARGETS}
    return found if all(p.is_file() and os.access(p, os.X_OK) for p in found.values()) else None


def _source(tmp: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
         ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(tmp)],
        check=True,
    )
    sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def build(jobs: int) -> dict[str, Path]:
    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "build.lock", "w") as lock:  # two benches starting together build once
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = binaries(out)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix="sangama-rpc-build-") as tmp_name:
            tmp = Path(tmp_name)
            src = _source(tmp)
            build_dir = tmp / "build"
            subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_ARGS], check=True)
            subprocess.run(
                ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS],
                check=True,
            )
            staging = out / "bin.part"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            for target in TARGETS:
                shutil.copy2(build_dir / "bin" / target, staging / target)
            (staging / "recipe.json").write_text(
                json.dumps({"llama_cpp_python": LLAMA_CPP_PYTHON, "cmake_args": CMAKE_ARGS})
            )
            # Rename last: a half-copied folder is never taken for a build.
            staging.replace(out / "bin")
    found = binaries(out)
    assert found is not None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-dir", action="store_true", help="print the cache folder only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    if args.print_dir:
        print(cache_dir())
        return
    for name, path in build(args.jobs).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
