"""What the app keeps about its user is private to that user: chat history files 0600 in a
0700 folder, the identity folder 0700; secrets for commands come from files or the
environment, and the old flags warn that `ps` shows them."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from app.cli.secret_args import read_secret
from app.errors import ConfigError
from app.identity import Identity
from app.private_files import private_dir, write_private
from app.ui.history import Conversation, History

pytestmark = pytest.mark.unit


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask() -> object:
    old = os.umask(0o022)  # the usual default: new files 0644, folders 0755
    yield None
    os.umask(old)


def test_chat_history_is_private(tmp_path: Path) -> None:
    history = History(tmp_path / "data" / "chats")
    conversation = Conversation()
    conversation.add("user", "my medical question")
    path = history.save(conversation)
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    history.save(conversation)  # saved again: still private, nothing left behind
    assert _mode(path) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert [c.id for c in history.list()] == [conversation.id]


def test_a_folder_made_open_by_an_older_version_is_narrowed(tmp_path: Path) -> None:
    old = tmp_path / "identity"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    with pytest.raises(ConfigError):
        Identity.load(old)  # nothing joined here yet; the folder is narrowed all the same
    assert _mode(old) == 0o700
    chats = tmp_path / "chats"
    chats.mkdir()
    chats.chmod(0o755)
    write_private(chats / "a.json", "{}")
    assert _mode(chats) == 0o700 and _mode(chats / "a.json") == 0o600
    assert private_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert _mode(tmp_path / "new" / "deeper") == 0o700


def test_secrets_come_from_a_file_or_the_environment(tmp_path: Path) -> None:
    secret_file = tmp_path / "pw"
    secret_file.write_text("s3cret pass\n")
    env = {"SANGAMA_X": "from-env"}
    assert read_secret(None, secret_file, "SANGAMA_X", "--pw", environ=env) == "s3cret pass"
    assert read_secret(None, None, "SANGAMA_X", "--pw", environ=env) == "from-env"
    assert read_secret(None, None, "SANGAMA_X", "--pw", environ={}) is None
    warned = io.StringIO()
    assert read_secret("given", None, "SANGAMA_X", "--pw", environ=env, warn=warned) == "given"
    assert "ps" in warned.getvalue() and "--pw-file" in warned.getvalue()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError):
        read_secret(None, tmp_path / "empty", "SANGAMA_X", "--pw", environ={})
    with pytest.raises(ConfigError):
        read_secret(None, tmp_path / "missing", "SANGAMA_X", "--pw", environ={})
