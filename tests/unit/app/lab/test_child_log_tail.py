"""A child that exits before it is ready: the error quotes the end of its log, since a
LocalSwarm's temporary work folder (and the log in it) is gone once the error is read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.errors import AppError
from app.lab.processes import log_tail, spawn_sangama


def test_log_tail_keeps_the_last_non_empty_lines(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("".join(f"line {i}\n\n" for i in range(30)), encoding="utf-8")
    tail = log_tail(log, lines=3)
    assert tail.endswith("line 27\nline 28\nline 29")
    assert "line 26" not in tail
    assert log_tail(tmp_path / "missing.log") == ""
    (tmp_path / "empty.log").write_text("\n\n", encoding="utf-8")
    assert log_tail(tmp_path / "empty.log") == ""


def test_a_child_that_fails_at_start_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    log = tmp_path / "worker.log"

    async def main() -> None:
        await spawn_sangama("worker w0", ["worker", "--config", str(missing)], log, timeout=60)

    with pytest.raises(AppError) as err:
        asyncio.run(main())
    message = str(err.value)
    assert "exited before it was ready" in message
    assert f"cannot read {missing}" in message  # the child's own words, from its log
