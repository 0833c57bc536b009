"""The Windows installer's inputs, checked here where the MSI itself cannot be built:
briefcase.toml's Windows settings, and the staging step build.ps1 runs before Briefcase
(briefcase.toml as pyproject.toml, the engine pin replaced by the built wheel)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
import uuid
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stage_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("win_stage", ROOT / "installers/windows/stage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["win_stage"] = module
    spec.loader.exec_module(module)
    return module


stage = _stage_module()


def test_the_windows_settings_make_a_per_user_gui_msi_with_a_fixed_upgrade_code() -> None:
    doc = tomllib.loads((ROOT / "briefcase.toml").read_text())
    win = doc["tool"]["briefcase"]["app"]["sangama"]["windows"]
    assert win["console_app"] is False
    assert win["system_installer"] is False  # no administrator rights, HKCU autostart
    assert win["use_full_install_path"] is False
    assert uuid.UUID(win["guid"]).version == 5
    assert win["requires"] == []  # the shared list (and its engine pin) applies as is


def test_staging_appends_the_briefcase_tables_and_swaps_the_engine_pin(tmp_path: Path) -> None:
    wheel = tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-win_amd64.whl"
    wheel.write_bytes(b"PK")
    pyproject = stage.stage(tmp_path / "project", wheel)
    doc = tomllib.loads(pyproject.read_text())
    assert "project" not in doc  # its PyPI engine pin must not reach Briefcase
    assert doc["tool"]["briefcase"]["version"] == "0.1.0"
    app = doc["tool"]["briefcase"]["app"]["sangama"]
    assert wheel.resolve().as_posix() in app["requires"]
    assert not any(r.startswith("llama-cpp-python==") for r in app["requires"])
    assert "windows" in app
    staged = {p.name for p in (tmp_path / "project").iterdir()}
    assert {"core", "net", "coordinator", "app", "LICENSE", "pyproject.toml"} <= staged
    assert not list((tmp_path / "project").rglob("__pycache__"))


def test_staging_leaves_the_test_only_liar_out(tmp_path: Path) -> None:
    wheel = tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-win_amd64.whl"
    wheel.write_bytes(b"PK")
    stage.stage(tmp_path / "project", wheel)
    serving = tmp_path / "project" / "app" / "serving"
    assert (ROOT / "app" / "serving" / "chaos_lies.py").is_file()
    assert (serving / "worker.py").is_file() and not (serving / "chaos_lies.py").exists()
    assert not list((tmp_path / "project").rglob("chaos_lies*"))


def test_staging_refuses_what_would_build_a_wrong_msi(tmp_path: Path) -> None:
    with pytest.raises(stage.StageError, match="not a wheel"):
        stage.stage(tmp_path / "p", tmp_path / "missing.whl")
    wheel = tmp_path / "e.whl"
    wheel.write_bytes(b"PK")
    two_pins = (
        '[tool.briefcase.app.x]\nrequires = [\n    "llama-cpp-python==1",\n'
        '    "llama-cpp-python==2",\n]\n'
    )
    with pytest.raises(stage.StageError, match="2 times"):
        stage.merged_pyproject("[project]\nname='x'\n", two_pins, wheel)
    with pytest.raises(stage.StageError, match="one place"):
        stage.merged_pyproject("[tool.briefcase]\n", two_pins, wheel)
