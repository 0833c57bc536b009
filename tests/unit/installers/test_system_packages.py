"""installers/system_packages.py: the Debian packages `make demo`, `make test` and .ci/run
need, named in one line with the command to run, or installed as root; never apt-get
from a test (every query, root check and install is a fake here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _module() -> ModuleType:
    path = ROOT / "installers/system_packages.py"
    spec = importlib.util.spec_from_file_location("system_packages", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["system_packages"] = module
    spec.loader.exec_module(module)
    return module


sp = _module()

LIST = """
# a comment
engine  g++        cmd:g++
engine  cmake      cmd:cmake
vulkan  glslc
vulkan  libvulkan-dev
vulkan  spirv-headers
ci      postgresql path:/nonexistent/*/bin/initdb
"""


def fake_dpkg(installed: set[str]) -> tuple[list[list[str]], object]:
    """What `dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' NAMES` prints: known
    packages only (unknown names go to stderr), "ii" when installed."""
    calls: list[list[str]] = []

    def query(names: Sequence[str]) -> str:
        calls.append(list(names))
        lines = [f"{n} ii " for n in names if n in installed]
        lines.append("cmake rc ")  # removed, configuration left: not installed
        return "\n".join(lines) + "\n"

    return calls, query


def run(
    argv: list[str],
    installed: set[str],
    *,
    root: bool = False,
    commands: frozenset[str] = frozenset(),
) -> tuple[int, list[Sequence[str]]]:
    installs: list[Sequence[str]] = []

    def install(names: Sequence[str]) -> int:
        installs.append(tuple(names))
        return 0

    _calls, query = fake_dpkg(installed)
    code = sp.main(
        argv,
        query=query,
        is_root=lambda: root,
        install=install,
        has_command=lambda name: name in commands,
        list_text=LIST,
    )
    return code, installs


def test_missing_packages_named_with_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, installs = run(["ensure", "engine", "vulkan"], {"g++", "glslc"})
    err = capsys.readouterr().err
    assert code == 1 and installs == []
    # cmake is "rc" in dpkg (removed) and not on PATH: missing too.
    assert err == (
        "missing Debian packages: cmake libvulkan-dev spirv-headers — run: "
        "sudo apt-get install cmake libvulkan-dev spirv-headers\n"
    )


def test_an_alternative_on_path_counts_as_installed(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(["ensure", "engine"], set(), commands=frozenset({"g++", "cmake"}))
    assert code == 0 and capsys.readouterr().err == ""


def test_root_installs_only_the_missing_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, installs = run(["ensure", "vulkan", "ci"], {"glslc"}, root=True)
    assert code == 0
    assert installs == [("libvulkan-dev", "spirv-headers", "postgresql")]
    assert "installing Debian packages: libvulkan-dev" in capsys.readouterr().err


def test_nothing_missing_nothing_said(capsys: pytest.CaptureFixture[str]) -> None:
    names = {"g++", "cmake", "glslc", "libvulkan-dev", "spirv-headers"}
    code, installs = run(["ensure", "engine", "vulkan"], names, root=True)
    assert (code, installs, capsys.readouterr().err) == (0, [], "")


def test_without_dpkg_it_steps_aside() -> None:
    code = sp.main(["ensure", "vulkan"], query=lambda names: None, list_text=LIST)
    assert code == 0


def test_unknown_group_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(["ensure", "engin"], set())
    assert code == 2
    assert "no group engin (groups: ci, engine, vulkan)" in capsys.readouterr().err


def test_multiarch_names_and_bad_lines() -> None:
    assert sp.installed_from_dpkg("libfoo:amd64 ii \nbar rc \nbaz un \n") == {"libfoo"}
    with pytest.raises(sp.ListError, match="line 1"):
        sp.parse_list("engine cmake which:cmake")
    with pytest.raises(sp.ListError, match="GROUP PACKAGE"):
        sp.parse_list("lonely")


def test_the_shipped_list_has_every_group_the_makefile_and_ci_use() -> None:
    reqs = sp.parse_list((ROOT / "installers/system-packages.txt").read_text())
    assert {"engine", "vulkan", "ci"} <= {r.group for r in reqs}
    vulkan = {r.package for r in sp.select(reqs, ["vulkan"])}
    assert vulkan == {"glslc", "libvulkan-dev", "spirv-headers"}
    make = (ROOT / "Makefile").read_text()
    assert "installers/system_packages.py ensure engine" in make
    assert "installers/system_packages.py ensure engine vulkan ci" in (ROOT / ".ci/run").read_text()


def test_make_checks_packages_before_building() -> None:
    """`make -n demo` runs the check before the engine build and the venv."""
    done = subprocess.run(
        ["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"make -n failed here: {done.stderr.strip()[:200]}")
    lines = done.stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "system_packages.py ensure" in line)
    build = next(i for i, line in enumerate(lines) if "build_wheel.py" in line)
    assert check < build
