"""The frame decoder under atheris (coverage-guided, libFuzzer): tests/fuzz/frames_atheris.py
run from a seed corpus of valid frames for a bounded number of inputs and seconds
(~15 s in CI). A crash is any exception but a typed FrameError, a frame that does not
encode back to itself, or a failed stream that accepts bytes again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

pytest.importorskip("atheris", reason="atheris (a dev dependency, Linux wheels) is not installed")

HARNESS = Path(__file__).resolve().parents[3] / "fuzz" / "frames_atheris.py"
RUNS = 40_000
SECONDS = 15


def test_the_frame_decoder_survives_a_bounded_atheris_run(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(HARNESS), "--write-seeds", str(corpus)], check=True)
    seeds = len(list(corpus.iterdir()))
    run = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            f"-runs={RUNS}",
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={tmp_path}/",
            "-print_final_stats=1",
            # Off: Linux keeps ru_maxrss across fork+exec, so the harness starts with
            # pytest's own peak (3 GB late in a full run) and libFuzzer calls it an OOM.
            "-rss_limit_mb=0",
            str(corpus),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    out = run.stdout + run.stderr
    crashes = sorted(p.name for p in tmp_path.glob("crash-*"))
    assert run.returncode == 0 and not crashes, f"{crashes}\n{out[-4000:]}"
    done = re.search(r"Done (\d+) runs", out)
    assert done is not None, out[-2000:]
    assert int(done.group(1)) > seeds  # it mutated beyond the seeds, not just replayed them
    # The corpus grew: coverage guidance found inputs reaching new decoder code.
    assert len(list(corpus.iterdir())) > seeds
