"""Build llama.cpp's `rpc-server` and its client module once, from the vendored source of the
pinned llama-cpp-python sdist, cached under `~/.cache/sangama/rpc/<recipe digest>/`.

Only bench/rpc_compare.py needs them (the peer users would pick instead of Sangama), so
nothing in `make test` builds this. The server is the machine's own build (`GGML_NATIVE=ON`,
static, CPU only): on a CPU where Sangama's shipped wheel loads a variant with the same
feature set (here: AVX2 EPYC, `haswell`) both run the same kernels. The client is the
engine wheel's llama.cpp with ggml's RPC backend module (`libggml-rpc.so`) loaded into it.
Both take ~10 min on two cores.

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
COMMON = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)
# (artifact, CMake flags, target, where CMake puts it)
RECIPES = (
    # The server: static, the machine's own kernels (GGML_NATIVE, as llama.cpp builds).
    (
        "ggml-rpc-server",
        (*COMMON, "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF"),
        "ggml-rpc-server",
        "bin/ggml-rpc-server",
    ),
    # The client side: ggml's RPC backend as a loadable module, for the engine wheel's own
    # llama.cpp (GGML_BACKEND_DL, same source): the RPC client is then the same llama.cpp
    # build Sangama runs, and nothing but the module is compiled.
    (
        "libggml-rpc.so",
        (
            *COMMON,
            "-DGGML_BACKEND_DL=ON",
            "-DGGML_CPU=OFF",
            "-DGGML_NATIVE=OFF",
            "-DBUILD_SHARED_LIBS=ON",
        ),
        "ggml-rpc",
        "bin/libggml-rpc.so",
    ),
)
# Bump when a change here changes the binaries without changing a flag or a target.
REVISION = 2


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    text = json.dumps(
        {"v": LLAMA_CPP_PYTHON, "recipes": RECIPES, "rev": REVISION}, sort_keys=True
    ).encode()
    return Path(base) / "sangama" / "rpc" / hashlib.sha256(text).hexdigest()[:16]


def _artifact(directory: Path, name: str) -> Path | None:
    path = directory / "bin" / name
    return path if path.is_file() else None


def binaries(directory: Path | None = None) -> dict[str, Path] | None:
    """The cached artifacts by name, or None when one is not built yet."""
    d = directory or cache_dir()
    found = {name: _artifact(d, name) for name, *_ in RECIPES}
    if any(p is None for p in found.values()):
        return None
    return {k: v for k, v in found.items() if v is not None}


def _source(tmp: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            "-d",
            str(tmp),
        ],
        check=True,
    )
    sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def build(jobs: int) -> dict[str, Path]:
    out = cache_dir()
    (out / "bin").mkdir(parents=True, exist_ok=True)
    with open(out / "build.lock", "w") as lock:  # two benches starting together build once
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [r for r in RECIPES if _artifact(out, r[0]) is None]
        if missing:
            with tempfile.TemporaryDirectory(prefix="sangama-rpc-build-") as tmp_name:
                tmp = Path(tmp_name)
                src = _source(tmp)
                for name, flags, target, built in missing:
                    build_dir = tmp / f"build-{target}"
                    subprocess.run(
                        ["cmake", "-S", str(src), "-B", str(build_dir), *flags], check=True
                    )
                    subprocess.run(
                        ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", target],
                        check=True,
                    )
                    # Copy then rename: a half-copied file is never taken for a build.
                    part = out / "bin" / (name + ".part")
                    shutil.copy2(build_dir / built, part)
                    part.replace(out / "bin" / name)
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
