"""What differs on Windows, run here with the platform faked: start-on-login through the
HKCU Run key, secrets in the OS keyring (or a 0600 file), every path through platformdirs,
and an engine that needs no C compiler on the volunteer's PC.

The MSI itself cannot be built or run on this Linux machine (installers/README.md says
what was and was not verified); these tests hold the code paths the MSI relies on."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import keyring
import platformdirs
import platformdirs.windows
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from app import identity
from app.ui import history, settings
from core import capture_lib, models

ROAMING = "C:\\Users\\vol\\AppData\\Roaming"
LOCAL = "C:\\Users\\vol\\AppData\\Local"


class FakeWinreg(ModuleType):
    """The part of `winreg` settings.py calls, over a dict of HKCU values."""

    HKEY_CURRENT_USER = "HKCU"
    KEY_SET_VALUE = 2
    REG_SZ = 1

    def __init__(self) -> None:
        super().__init__("winreg")
        self.values: dict[tuple[str, str], tuple[int, str]] = {}
        self.opened: list[tuple[str, str]] = []

    class _Key:
        def __init__(self, path: str) -> None:
            self.path = path

        def __enter__(self) -> FakeWinreg._Key:
            return self

        def __exit__(self, *_: object) -> None:
            pass

    def OpenKey(self, root: str, path: str, *_: Any) -> _Key:
        self.opened.append((root, path))
        return self._Key(path)

    def SetValueEx(self, key: _Key, name: str, _reserved: int, kind: int, value: str) -> None:
        self.values[(key.path, name)] = (kind, value)

    def DeleteValue(self, key: _Key, name: str) -> None:
        if (key.path, name) not in self.values:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        del self.values[(key.path, name)]

    def QueryValueEx(self, key: _Key, name: str) -> tuple[str, int]:
        if (key.path, name) not in self.values:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        kind, value = self.values[(key.path, name)]
        return value, kind


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> FakeWinreg:
    reg = FakeWinreg()
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setitem(sys.modules, "winreg", reg)
    return reg


def test_start_on_login_is_a_run_value_under_hkcu_and_removing_it_twice_is_fine(
    windows: FakeWinreg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # must stay untouched on Windows
    command = '"C:\\Program Files\\Sangama\\Sangama.exe"'
    assert not settings.starts_on_login()
    where = settings.set_start_on_login(True, command)
    assert where == f"HKCU\\{settings.RUN_KEY}\\Sangama"
    assert windows.values == {(settings.RUN_KEY, "Sangama"): (FakeWinreg.REG_SZ, command)}
    assert all(root == "HKCU" for root, _ in windows.opened)  # never HKLM: no admin rights
    assert settings.starts_on_login()
    settings.set_start_on_login(False)
    settings.set_start_on_login(False)  # already gone: no error
    assert windows.values == {} and not settings.starts_on_login()
    assert not (tmp_path / "autostart").exists()


def test_every_path_goes_through_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WIN_PD_OVERRIDE_APPDATA", ROAMING)
    monkeypatch.setenv("WIN_PD_OVERRIDE_LOCAL_APPDATA", LOCAL)
    monkeypatch.setattr(sys, "platform", "win32")
    for kind in ("user_config_dir", "user_log_dir", "user_cache_dir", "user_data_dir"):

        def on_windows(appname: str | None = None, *_a: Any, _k: str = kind, **_kw: Any) -> str:
            dirs = platformdirs.windows.Windows(appname, appauthor=False)
            return str(getattr(dirs, _k))

        monkeypatch.setattr(platformdirs, kind, on_windows)
    paths = {
        "settings": settings.config_dir(),
        "logs": settings.default_log_dir(),
        "identity": identity.default_identity_dir(),
        "chats": history.default_history_dir(),
        "models": models.cache_dir(),
        "capture": capture_lib.capture_lib_path(),
    }
    for name, path in paths.items():
        assert str(path).startswith(LOCAL + "/sangama"), (name, path)
    assert paths["capture"].suffix == ".dll"


class MemoryKeyring(KeyringBackend):
    """Stands in for Windows Credential Manager (keyring's WinVaultKeyring)."""

    priority = 1

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.items: dict[tuple[str, str], str] = {}
        self.refuse = refuse

    def set_password(self, service: str, username: str, password: str) -> None:
        if self.refuse:
            raise keyring.errors.PasswordSetError("the vault is locked")
        self.items[(service, username)] = password

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def delete_password(self, service: str, username: str) -> None:
        self.items.pop((service, username), None)


@pytest.fixture
def restore_keyring() -> Any:
    before = keyring.get_keyring()
    yield
    keyring.set_keyring(before)


def test_secrets_go_to_the_os_keyring_when_there_is_one(
    tmp_path: Path, restore_keyring: None
) -> None:
    vault = MemoryKeyring()
    keyring.set_keyring(vault)
    assert identity._store_secret(tmp_path, "token", "s3cret") == "keyring"
    assert not list(tmp_path.iterdir())  # nothing on disk
    assert identity._load_secret(tmp_path, "token") == "s3cret"
    assert list(vault.items) == [(identity.KEYRING_SERVICE, f"{tmp_path.resolve()}:token")]


@pytest.mark.parametrize("backend", [fail.Keyring(), MemoryKeyring(refuse=True)])  # type: ignore[no-untyped-call]
def test_without_a_usable_keyring_secrets_go_to_a_private_file(
    tmp_path: Path, restore_keyring: None, backend: KeyringBackend
) -> None:
    keyring.set_keyring(backend)
    where = identity._store_secret(tmp_path, "token", "s3cret")
    path = tmp_path / "token.secret"
    assert where == str(path)
    if os.name == "posix":  # on Windows the profile's ACLs guard it; st_mode says little
        assert path.stat().st_mode & 0o777 == 0o600
    assert identity._load_secret(tmp_path, "token") == "s3cret"


def test_no_c_compiler_on_windows_means_the_python_callback(
    windows: FakeWinreg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks: list[tuple[int, int, int]] = []
    msvcrt = ModuleType("msvcrt")
    msvcrt.LK_LOCK = 1  # type: ignore[attr-defined]
    msvcrt.locking = lambda fd, mode, n: locks.append((fd, mode, n))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "msvcrt", msvcrt)
    monkeypatch.setattr("core.capture_lib.shutil.which", lambda _name: None)  # no cc, no gcc
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda _n: str(tmp_path))
    monkeypatch.setattr(capture_lib, "_lib", None)
    monkeypatch.setattr(capture_lib, "_error", None)
    assert capture_lib.load_capture_lib() is None
    assert capture_lib._error is not None and "no C compiler" in capture_lib._error
    assert len(locks) == 1 and locks[0][1:] == (1, 1)  # the machine lock, the Windows way
    assert not list((tmp_path / "native").glob("*.dll"))
    from core.llama_engine import c_capture_available

    assert c_capture_available() is False  # the engine runs with its Python callback
