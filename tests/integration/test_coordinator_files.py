"""The coordinator's data folder (CA key, database, operator secrets) is the operator's
alone: the folder 0700, the SQLite database 0600 from its creation, even under umask 022."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from coordinator.server.serve import CoordinatorOptions, build

pytestmark = pytest.mark.integration


def test_the_data_folder_and_database_are_private(tiny_llama: Path, tmp_path: Path) -> None:
    data = tmp_path / "coordinator"
    old = os.umask(0o022)
    try:
        coord, _cert, key = build(
            CoordinatorOptions(data_dir=data, model=str(tiny_llama), admin_password=None)
        )
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE((data / "coordinator.db").stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "admin-password").stat().st_mode) == 0o600
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    finally:
        coord.store.close()
