"""Stage the project for `briefcase ... windows` (run by installers/windows/build.ps1).

    python installers/windows/stage.py --engine-wheel PATH --out DIR

Briefcase 0.4 reads its settings only from pyproject.toml, and the engine the MSI must
carry is the wheel built by installers/engine/build_wheel.py, not the PyPI sdist. So the
staged copy holds the four source packages, LICENSE, and a pyproject.toml that is
briefcase.toml with the engine pin in `requires` replaced by the wheel's path. The
project's own `[project]` table stays out: Briefcase reads PEP 621 metadata when it is
there, and its dependency list names the engine by its PyPI pin. Plain text work on
purpose: only the one pin line changes, so what the MSI is built from reads the same as
the file reviewers read.

Standard library only; runs the same on Windows and here (tests/unit/test_windows_installer.py).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("core", "net", "coordinator", "app")
# Modules of the sources that only tests use, never shipped: the worker that lies on
# purpose (app/serving/chaos_lies.py, imported only where a test sets SANGAMA_TEST_LIE).
TEST_ONLY = ("chaos_lies.py",)
ENGINE_PIN = re.compile(r'^(\s*)"llama-cpp-python==[^"]*",\s*$', re.MULTILINE)


class StageError(RuntimeError):
    """The staged project cannot be written (a missing wheel, a moved pin, ...)."""


def merged_pyproject(pyproject: str, briefcase: str, engine_wheel: Path) -> str:
    """The staged pyproject.toml: briefcase.toml with the engine pin replaced. `pyproject`
    (the project's own) must not hold Briefcase settings of its own."""
    if "[tool.briefcase" in pyproject:
        raise StageError(
            "pyproject.toml has its own [tool.briefcase] tables: keep them in one place"
        )
    pins = ENGINE_PIN.findall(briefcase)
    if len(pins) != 1:
        raise StageError(f"briefcase.toml names the engine {len(pins)} times, not once")
    # pip takes a wheel's path as a requirement; forward slashes are valid on Windows too
    # and need no escaping in a TOML string.
    wheel = engine_wheel.resolve().as_posix()
    replaced = ENGINE_PIN.sub(lambda m: f'{m.group(1)}"{wheel}",', briefcase, count=1)
    text = replaced
    doc = tomllib.loads(text)  # still one valid TOML document
    requires = doc["tool"]["briefcase"]["app"]["sangama"]["requires"]
    if wheel not in requires:
        raise StageError("the engine wheel did not make it into requires")
    return text


def stage(out: Path, engine_wheel: Path, root: Path = ROOT) -> Path:
    """Write the staged project into `out` (emptied first); return its pyproject.toml."""
    if not engine_wheel.is_file() or engine_wheel.suffix != ".whl":
        raise StageError(f"{engine_wheel} is not a wheel file: build it first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.dll", *TEST_ONLY)
    for name in SOURCES:
        shutil.copytree(root / name, out / name, ignore=ignore)
    shutil.copy2(root / "LICENSE", out / "LICENSE")
    shutil.copy2(root / "README.md", out / "README.md")
    text = merged_pyproject(
        (root / "pyproject.toml").read_text(encoding="utf-8"),
        (root / "briefcase.toml").read_text(encoding="utf-8"),
        engine_wheel,
    )
    target = out / "pyproject.toml"
    target.write_text(text, encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-wheel", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        print(stage(args.out, args.engine_wheel))
    except StageError as exc:
        print(f"stage.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
