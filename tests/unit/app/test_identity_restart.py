"""The command that joined a node restarts it: `join_or_resume` reuses the identity an
invite made (kept as a hash of the code, never the code) instead of using the invite
again, refuses to overwrite another invite's node, and says what to run when it cannot."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import app.identity as identity_mod
from app.cli.main import main
from app.errors import IdentityTaken, NotJoined
from app.identity import IDENTITY_FILE, INVITE_KEY, Identity, join_or_resume
from coordinator.contract import JoinAnswer
from coordinator.invites import USED_UP, InviteCode, InviteUsedUp
from net import auth

pytestmark = pytest.mark.unit


class FakeCoordinator:
    """Answers joins as the real one does: each invite code once, then "used up"."""

    def __init__(self) -> None:
        self.ca = auth.create_ca("test-swarm")
        self.fingerprint = auth.fingerprint(self.ca.certificate)
        self.used: set[str] = set()
        self.joins = 0

    def code(self, secret: str) -> str:
        return InviteCode("https://127.0.0.1:8443", self.fingerprint, secret).encode()

    def join(self, invite: InviteCode, key: Ed25519PrivateKey) -> JoinAnswer:
        if invite.secret in self.used:
            raise InviteUsedUp(USED_UP)
        self.used.add(invite.secret)
        self.joins += 1
        node_id = f"worker-{self.joins}"
        cert = auth.issue_node_certificate(self.ca, node_id, key.public_key(), "worker")
        return JoinAnswer(
            node_id,
            "worker",
            auth.certificate_pem(cert).decode(),
            auth.certificate_pem(self.ca.certificate).decode(),
            f"token-{self.joins}",
            dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
        )


@pytest.fixture
def coord(monkeypatch: pytest.MonkeyPatch) -> FakeCoordinator:
    fake = FakeCoordinator()
    monkeypatch.setattr(identity_mod, "join", fake.join)
    monkeypatch.setattr(identity_mod, "_keyring_usable", lambda: False)  # 0600 files
    return fake


def test_the_same_code_again_restarts_the_node_without_using_the_invite(
    coord: FakeCoordinator, tmp_path: Path
) -> None:
    code = coord.code("secret-one")
    first, resumed = join_or_resume(code, tmp_path / "id")
    assert not resumed and coord.joins == 1
    # Pasted again with a line break in it: the same invite.
    again, resumed = join_or_resume(code[:20] + "\n" + code[20:], tmp_path / "id")
    assert resumed and coord.joins == 1
    assert again.node_id == first.node_id and again.token == first.token
    # Which code made it is remembered as a hash; the code itself is nowhere on disk.
    doc = json.loads((tmp_path / "id" / IDENTITY_FILE).read_text())
    assert len(doc[INVITE_KEY]) == 64
    for f in (tmp_path / "id").iterdir():
        text = f.read_text()
        assert code not in text and "secret-one" not in text, f


def test_another_invite_never_overwrites_a_node_and_says_what_to_run(
    coord: FakeCoordinator, tmp_path: Path
) -> None:
    join_or_resume(coord.code("secret-one"), tmp_path / "id")
    with pytest.raises(IdentityTaken) as taken:
        join_or_resume(coord.code("secret-two"), tmp_path / "id")
    text = str(taken.value)
    assert f"sangama worker --identity {tmp_path / 'id'}" in text and "--identity-dir" in text
    assert "\n" not in text and coord.joins == 1
    assert Identity.load(tmp_path / "id").node_id == "worker-1"


def test_an_identity_from_before_the_hash_is_kept_and_named(
    coord: FakeCoordinator, tmp_path: Path
) -> None:
    code = coord.code("secret-one")
    join_or_resume(code, tmp_path / "id")
    path = tmp_path / "id" / IDENTITY_FILE
    doc = json.loads(path.read_text())
    del doc[INVITE_KEY]
    path.write_text(json.dumps(doc))
    with pytest.raises(IdentityTaken, match="sangama worker --identity"):
        join_or_resume(code, tmp_path / "id")


def test_a_used_up_invite_in_a_new_folder_says_how_its_node_restarts(
    coord: FakeCoordinator, tmp_path: Path
) -> None:
    code = coord.code("secret-one")
    join_or_resume(code, tmp_path / "first")
    with pytest.raises(InviteUsedUp) as used:
        join_or_resume(code, tmp_path / "elsewhere")
    text = str(used.value)
    assert text.startswith(USED_UP) and "sangama worker --identity" in text and "\n" not in text


def test_status_before_joining_is_one_line_not_a_python_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(NotJoined):
        Identity.load(tmp_path / "nothing")
    assert main(["status", "--identity", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sangama status: error: not joined yet") and "\n" not in err
    assert "sangama worker --join CODE" in err
    assert "FileNotFoundError" not in err and "Errno" not in err


def test_version_names_sangama_and_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("sangama ") and "(engine: llama-cpp-python " in out, out
