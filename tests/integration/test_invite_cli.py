"""`sangama invite` goes through the coordinator's invite rules (invite_book), the same
ones the HTTP API uses: what one end creates or revokes, the other sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main
from coordinator.server.invite_book import list_invites
from coordinator.server.service import CA_CERT
from coordinator.server.store import Store, migrate
from net import auth

pytestmark = pytest.mark.integration


def test_invite_create_list_and_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    migrate(url)
    store = Store(url)
    store.set_setting(CA_CERT, auth.certificate_pem(auth.create_ca("t").certificate).decode())
    db = ["--db", url]
    public = ["--coordinator", "https://127.0.0.1:8443"]
    assert main(["invite", "create", *db, *public, "--role", "worker", "--note", "first"]) == 0
    assert main(["invite", "create", *db, *public, "--role", "client", "--uses", "3"]) == 0
    assert main(["invite", "revoke", *db, "1"]) == 0
    assert main(["invite", "revoke", *db, "9"]) == 2
    capsys.readouterr()
    assert main(["invite", "list", *db]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[:3] for line in lines]
    assert rows == [["1", "worker", "revoked"], ["2", "client", "3/3"]]
    assert [(i.id, i.revoked) for i in list_invites(store)] == [(2, False), (1, True)]
    store.close()
