"""Plain logic behind the desktop app: settings, autostart, history, invite-code form."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ConfigError
from app.identity import coordinator_url
from app.node_status import NodeStatus, ServeState, shown_while_pausing
from app.ui.controllers import validate_code, validate_coordinator
from app.ui.history import Conversation, History
from app.ui.settings import (
    Settings,
    default_cap_bytes,
    set_start_on_login,
    starts_on_login,
    xdg_autostart_path,
)
from coordinator.invites import InviteCode

pytestmark = [pytest.mark.unit, pytest.mark.ui]
GIB = 1024**3


def test_settings_round_trip_and_bad_files(tmp_path: Path) -> None:
    s = Settings(
        vram_cap_bytes=6 * GIB, coordinator="https://x:1", log_level="DEBUG", api_port=8123
    )
    path = s.save(tmp_path)
    assert Settings.load(tmp_path) == s
    assert "token" not in path.read_text()  # secrets stay in the keyring
    path.write_text("{not json")
    assert Settings.load(tmp_path) == Settings()
    path.write_text('{"vram_cap_bytes": "lots", "log_level": "LOUD", "unknown": 1}')
    assert Settings.load(tmp_path) == Settings()


def test_default_cap_leaves_headroom() -> None:
    assert default_cap_bytes(24 * GIB) < 24 * GIB - GIB
    assert default_cap_bytes(2 * GIB) == GIB
    assert default_cap_bytes(100 * GIB) == int(85 * GIB)


def test_start_on_login_writes_and_removes_an_xdg_desktop_file(isolated_dirs: Path) -> None:
    assert not starts_on_login()
    where = set_start_on_login(True, "/opt/sangama/sangama-app")
    path = xdg_autostart_path()
    assert where == str(path) and path.is_relative_to(isolated_dirs)
    text = path.read_text()
    assert "[Desktop Entry]" in text and "Exec=/opt/sangama/sangama-app" in text
    assert starts_on_login()
    set_start_on_login(False)
    assert not path.exists() and not starts_on_login()


def test_history_keeps_conversations_newest_first(tmp_path: Path) -> None:
    h = History(tmp_path / "chats")
    old = Conversation(created=1.0)
    old.add("user", "first question")
    new = Conversation(created=2.0)
    new.add("user", "second " * 20)
    new.add("assistant", "an answer")
    h.save(old)
    h.save(new)
    (tmp_path / "chats" / "junk.json").write_text("[")
    listed = h.list()
    assert [c.id for c in listed] == [new.id, old.id]
    assert h.load(new.id).messages == new.messages
    assert listed[0].title.endswith("…") and len(listed[0].title) == 41
    with pytest.raises(ValueError):
        h.load("../etc")


def test_invite_code_form_is_checked_offline() -> None:
    good = InviteCode("https://127.0.0.1:8443", "a" * 64, "s3cret").encode()
    assert validate_code(good) is None
    assert validate_code("  " + good[:20] + "\n" + good[20:]) is None  # pasted with breaks
    assert "sangama1-" in (validate_code("hello") or "")
    assert "damaged" in (validate_code(good[:-2] + "xx") or "")
    assert validate_code("") is not None


def test_status_summary_words() -> None:
    assert NodeStatus().summary == "Sangama: not joined"
    s = NodeStatus(state=ServeState.DOWNLOADING, progress=0.42)
    assert s.summary == "Sangama: downloading (42%)"
    s = NodeStatus(state=ServeState.SERVING, layers=(4, 9), sessions=9, running=1)
    assert s.summary == "Sangama: serving layers 4-8 (1 running now, 9 since start)"
    s = NodeStatus(state=ServeState.ERROR, error="Disk full")
    assert s.summary == "Sangama: error: Disk full"
    s = NodeStatus(state=ServeState.PAUSING, finishing=2)
    assert s.summary == "Sangama: pausing, finishing 2 sessions"
    s = NodeStatus(state=ServeState.MOVING, finishing=1)
    assert s.summary == "Sangama: changing stage, finishing 1 session"
    assert NodeStatus(state=ServeState.PAUSING).summary == "Sangama: pausing"


def test_after_pause_is_asked_a_running_report_shows_as_pausing() -> None:
    shown = NodeStatus(state=ServeState.PAUSING, finishing=1)
    serving = NodeStatus(state=ServeState.SERVING, layers=(0, 6), sessions=2)
    now = shown_while_pausing(serving, shown)
    # Still pausing, finishing what the UI said (not the report's count, which holds
    # sessions kept only for a resume); the rest of the report is kept.
    assert now.state is ServeState.PAUSING and now.finishing == 1
    assert now.summary == "Sangama: pausing, finishing 1 session"
    assert now.layers == (0, 6)
    for state in (ServeState.WAITING, ServeState.DOWNLOADING, ServeState.LOADING):
        assert shown_while_pausing(NodeStatus(state=state), shown).state is ServeState.PAUSING
    for state in (ServeState.PAUSING, ServeState.PAUSED, ServeState.ERROR, ServeState.MOVING):
        status = NodeStatus(state=state, finishing=3)
        assert shown_while_pausing(status, shown) is status


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("coordinator.example.org:8443", "must start with https://"),
        ("http://10.0.0.5:8443", "must start with https://"),
        ("https://", "names no valid host"),
        ("https://user@10.0.0.5:8443", "names no valid host"),
        ("https://10.0.0.5:99999", "not valid"),
        ("https://10.0.0.5:84x3", "not valid"),
        ("https://10.0.0.5:8443/api", "has a path"),
    ],
)
def test_a_malformed_coordinator_address_is_refused_in_words(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        coordinator_url(text)
    assert why in (validate_coordinator(text) or "")


def test_coordinator_addresses_that_work() -> None:
    assert coordinator_url(" https://10.0.0.5:8443/ ") == "https://10.0.0.5:8443"
    assert coordinator_url("https://[2001:db8::1]:8443") == "https://[2001:db8::1]:8443"
    assert coordinator_url("https://swarm.example.org") == "https://swarm.example.org"
    assert validate_coordinator("") is None  # empty: the coordinator the invite named
