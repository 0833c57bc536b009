"""Where downloaded pieces go: the user cache dir for the default identity (what `apt purge`
with the marker removes), the identity's own folder for an explicit one."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.identity import default_identity_dir
from app.pieces_cache import pieces_dir


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_the_default_identity_keeps_pieces_in_the_user_cache(xdg: Path) -> None:
    got = pieces_dir(default_identity_dir(), "SmolLM2-135M-Instruct.Q4_1")
    assert got == xdg / "cache" / "sangama" / "pieces" / "SmolLM2-135M-Instruct.Q4_1"
    assert not got.is_relative_to(xdg / "config")  # purge keeps config, removes this


def test_the_default_identity_is_recognised_through_another_spelling(xdg: Path) -> None:
    spelled = xdg / "config" / "x" / ".." / "sangama" / "identity"
    assert pieces_dir(spelled, "m") == xdg / "cache" / "sangama" / "pieces" / "m"


def test_an_explicit_identity_keeps_its_pieces_to_itself(xdg: Path) -> None:
    own = xdg / "node-b"
    assert pieces_dir(own, "m") == own / "pieces" / "m"
