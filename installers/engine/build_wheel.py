"""Build the engine wheel once: llama-cpp-python with run-time CPU dispatch, cached per recipe.

One wheel serves every x86-64 CPU: llama.cpp is built with `GGML_BACKEND_DL` and
`GGML_CPU_ALL_VARIANTS` (`GGML_NATIVE` off), so `libggml-cpu-<variant>` modules ship side
by side and the engine loads the best one the CPU supports (core/backends.py). Variants
that differ from a kept neighbour by one rarely used feature are dropped to halve the
build time, and the AMX variant (sapphirerapids) is never built: its AMX matrix kernels
crash on some Xeons (docs/engine.md), and AMX CPUs run the zen4 variant instead
(AVX-512 with VBMI, VNNI and BF16) with weight repacking intact. The patches in
`patches/` (each says why at its top) are applied to the sources first.

The wheel lands in `<cache>/wheelhouse/<recipe digest>/`; the digest covers everything
that changes the binary (version, CMake flags, variant list, this file), so a changed
recipe builds a new wheel and an unchanged one is reused by the tests, the demo and the
installers. Usage: `python installers/engine/build_wheel.py [--print-dir] [--gpu vulkan]`.
"""

from __future__ import annotations

import argparse
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
# Bump when a change here changes the binary without changing a flag or a variant.
RECIPE_REVISION = 1
KEPT_VARIANTS = (
    "x64",
    "sse42",
    "sandybridge",
    "haswell",
    "skylakex",
    "icelake",
    "zen4",
    "alderlake",
)
DROPPED_VARIANTS = (
    "ivybridge",
    "piledriver",
    "cannonlake",
    "cascadelake",
    "cooperlake",
    "sapphirerapids",
)
BASE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    "-DLLAVA_BUILD=OFF",
    # llamafile's matmul takes 2 rows or more, one row goes through ggml's own dot
    # products: the two sum in other orders, so a row's numbers would depend on how many
    # rows share its step (docs/decisions/batch-invariance.md).
    "-DGGML_LLAMAFILE=OFF",
    # The dynamically loaded modules go beside libllama.so, where the engine looks.
    "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib",
)
NATIVE_CMAKE_ARGS = ("-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF", "-DGGML_LLAMAFILE=OFF")
PATCHES_DIR = Path(__file__).resolve().parent / "patches"
GPU_CMAKE_ARGS = {"vulkan": ("-DGGML_VULKAN=ON",), "cuda": ("-DGGML_CUDA=ON",)}


def cache_root() -> Path:
    env = os.environ.get("SANGAMA_WHEELHOUSE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sangama" / "wheelhouse"


def patches() -> list[Path]:
    """The source patches, in the order they are applied."""
    return sorted(PATCHES_DIR.glob("*.patch"))


def patches_digest() -> str:
    h = hashlib.sha256()
    for path in patches():
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def apply_patches(src: Path) -> None:
    """Apply every patch with -p1 in the sdist's root; fail loudly if one does not apply."""
    for path in patches():
        with open(path, "rb") as f:
            done = subprocess.run(
                ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch"],
                cwd=src,
                stdin=f,
                capture_output=True,
                text=True,
            )
        if done.returncode != 0:
            raise SystemExit(f"{path.name} does not apply; update it:\n{done.stdout}{done.stderr}")


def recipe(gpu: tuple[str, ...], native: bool = False) -> dict[str, object]:
    if native:
        # Only for bench/engine.py: the machine's own build, as llama.cpp builds by default.
        return {
            "llama_cpp_python": LLAMA_CPP_PYTHON,
            "cmake_args": NATIVE_CMAKE_ARGS,
            "patches": patches_digest(),
        }
    cmake = list(BASE_CMAKE_ARGS)
    for name in gpu:
        cmake += GPU_CMAKE_ARGS[name]
    if "cuda" in gpu:
        cmake.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures()}")
    return {
        "llama_cpp_python": LLAMA_CPP_PYTHON,
        "cmake_args": cmake,
        "cpu_variants": list(KEPT_VARIANTS),
        "gpu": list(gpu),
        "revision": RECIPE_REVISION,
        "patches": patches_digest(),
    }


def cuda_architectures() -> str:
    # Turing, Ampere (consumer), Ada, Blackwell (consumer): the cards volunteers own.
    return os.environ.get("SANGAMA_CUDA_ARCHS", "75-real;86-real;89-real;120")


def wheel_dir(gpu: tuple[str, ...], native: bool = False) -> Path:
    text = json.dumps(recipe(gpu, native), sort_keys=True).encode()
    digest = hashlib.sha256(text).hexdigest()[:16]
    # A native build fits only the CPU that made it: keep it apart, named as such.
    return cache_root() / (f"native-{digest}" if native else digest)


def find_wheel(directory: Path) -> Path | None:
    wheels = sorted(directory.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}-*.whl"))
    return wheels[-1] if wheels else None


def patch_variants(cmake_lists: Path) -> None:
    """Drop the unwanted CPU variants from ggml's list; fail loudly if the list moved."""
    text = cmake_lists.read_text()
    for name in DROPPED_VARIANTS:
        marker = f"ggml_add_cpu_backend_variant({name} "
        lines = [ln for ln in text.splitlines() if marker in ln]
        if len(lines) != 1:
            raise SystemExit(f"variant {name!r} not found once in {cmake_lists}; update the recipe")
        text = text.replace(lines[0], f"        # dropped by Sangama's recipe: {name}")
    for name in KEPT_VARIANTS:
        if f"ggml_add_cpu_backend_variant({name}" not in text:
            raise SystemExit(f"variant {name!r} missing from {cmake_lists}; update the recipe")
    cmake_lists.write_text(text)


# Debian 12 ships Vulkan headers 1.3.239; ggml-vulkan asks VK_EXT_layer_settings (1.3.261)
# only to tune the validation layer, so older headers build without that request.
_LAYER_SETTINGS_OLD = (
    "    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);\n"
    "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info,"
    " layers, extensions, &layer_setting_info);\n"
)
_LAYER_SETTINGS_START = "    VkBool32 enable_best_practice = layer_settings;\n"


def patch_vulkan_headers(vulkan_cpp: Path) -> None:
    """Guard ggml-vulkan's one use of VK_EXT_layer_settings by the header version."""
    text = vulkan_cpp.read_text()
    if text.count(_LAYER_SETTINGS_START) != 1 or text.count(_LAYER_SETTINGS_OLD) != 1:
        raise SystemExit(f"VK_EXT_layer_settings block moved in {vulkan_cpp}; update the recipe")
    start = text.index(_LAYER_SETTINGS_START)
    end = text.index(_LAYER_SETTINGS_OLD) + len(_LAYER_SETTINGS_OLD)
    guarded = (
        "#if VK_HEADER_VERSION >= 261\n"
        + text[start:end]
        + "#else\n"
        + "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info,"
        + " layers, extensions);\n"
        + "#endif\n"
    )
    vulkan_cpp.write_text(text[:start] + guarded + text[end:])


def build(gpu: tuple[str, ...], jobs: int, native: bool = False) -> Path:
    out = wheel_dir(gpu, native)
    existing = find_wheel(out)
    if existing is not None:
        return existing
    with tempfile.TemporaryDirectory(prefix="sangama-engine-") as tmp_name:
        tmp = Path(tmp_name)
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
        src = tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
        apply_patches(src)
        if not native:
            patch_variants(src / "vendor/llama.cpp/ggml/src/CMakeLists.txt")
        if "vulkan" in gpu:
            patch_vulkan_headers(src / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp")
        env = dict(os.environ)
        env["CMAKE_ARGS"] = " ".join(recipe(gpu, native)["cmake_args"])  # type: ignore[arg-type]
        env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs)
        staging = tmp / "wheels"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-cache-dir",
                "--no-deps",
                str(src),
                "-w",
                str(staging),
            ],
            check=True,
            env=env,
        )
        wheel = next(staging.glob("llama_cpp_python-*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "recipe.json").write_text(json.dumps(recipe(gpu, native), indent=2, sort_keys=True))
        # Copy then rename: a half-written wheel is never visible under its final name.
        part = out / (wheel.name + ".part")
        shutil.copyfile(wheel, part)
        part.replace(out / wheel.name)
    found = find_wheel(out)
    assert found is not None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="append", choices=sorted(GPU_CMAKE_ARGS), default=[])
    parser.add_argument("--native", action="store_true", help="a -march=native build (bench)")
    parser.add_argument("--print-dir", action="store_true", help="print the wheel folder only")
    parser.add_argument(
        "--print-wheel", action="store_true", help="print the built wheel's path; fail if none"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    gpu = tuple(sorted(set(args.gpu)))
    if args.print_dir:
        print(wheel_dir(gpu, args.native))
        return
    if args.print_wheel:
        wheel = find_wheel(wheel_dir(gpu, args.native))
        if wheel is None:
            raise SystemExit(f"no engine wheel in {wheel_dir(gpu, args.native)}: build it first")
        print(wheel)
        return
    print(build(gpu, args.jobs, args.native))


if __name__ == "__main__":
    main()
