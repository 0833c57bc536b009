"""`sangama slice`: the progress line's text, when the bar is drawn, and one-line errors
(no traceback) for what a person may give it by mistake."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from app.cli.main import main
from app.cli.progress import ProgressBar, format_progress
from tests.support.gguf_fixtures import split_gguf
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit

GB = 10**9


def test_progress_line_says_bytes_done_speed_and_time_left() -> None:
    line = format_progress(int(2.52 * GB), 6 * GB, elapsed_s=12.0, width=10)
    assert line.startswith("[####------]  42%")
    assert "2.52/6.00 GB" in line
    assert "210 MB/s" in line
    assert "0:17 left" in line  # 3.48 GB at 210 MB/s


def test_progress_line_edges() -> None:
    assert format_progress(0, 6 * GB, 0.0, width=4) == "[----]   0%  0.00/6.00 GB"
    done = format_progress(6 * GB, 6 * GB, 3725.0, width=4)
    assert done.startswith("[####] 100%") and done.endswith("1:02:05")  # elapsed, not left
    assert "500 kB/s" in format_progress(500_000, 2 * GB, 1.0)
    assert "MB" in format_progress(10, 5_000_000, 1.0)  # unit from the total
    assert format_progress(7, 0, 1.0, width=2).startswith("[##] 100%")  # nothing to read


def test_bar_redraws_at_most_every_interval_and_always_at_the_end() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = ProgressBar(out, min_interval_s=1.0, clock=lambda: now[0])
    for t, done in ((0.1, 1), (0.5, 2), (1.2, 3), (1.3, 10)):
        now[0] = t
        bar(done, 10)
    bar.close()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 3  # 0.1, 1.2 and the last; 0.5 was too soon
    assert " 100%" in frames[-1] and frames[-1].endswith("\n")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["slice", *argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("sangama slice: error: ")
    return lines[0]


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert "nope.gguf" in _one_line_error(err)


def test_not_a_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    rc, _, err = _run(capsys, str(bad), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert "is not a GGUF file" in _one_line_error(err)


def test_a_lone_shard_and_a_later_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    shards = split_gguf(model, tmp_path, "m", 20)
    shards[1].unlink()
    rc, _, err = _run(capsys, str(shards[0]), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert f"missing: {shards[1]}" in _one_line_error(err)
    rc, _, err = _run(capsys, str(shards[2]), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert f"pass the first shard ({shards[0].name})" in _one_line_error(err)


def test_an_unknown_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    model.write_bytes(model.read_bytes().replace(b"llama", b"xlama"))
    rc, _, err = _run(capsys, str(model), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert "'xlama'" in _one_line_error(err)


def test_slices_with_a_progress_bar_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    shards = split_gguf(model, tmp_path, "m", 20)
    rc, out, err = _run(capsys, str(shards[0]), "--out", str(tmp_path / "o"), "--progress")
    assert rc == 0
    assert "wrote 10 pieces" in out
    assert err.startswith("\r[") and " 100%" in err and err.endswith("\n")
    rc, out, err = _run(capsys, str(model), "--out", str(tmp_path / "o2"))
    assert rc == 0 and err == ""  # not a terminal, not asked: no bar
