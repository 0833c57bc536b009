"""What a volunteer's PC reads from others, under atheris (coverage-guided, libFuzzer):
tests/fuzz/untrusted_atheris.py's targets (a coordinator's answers, GGUF headers, chat
templates), each from its seed corpus for a bounded number of inputs and seconds. A crash
is any exception but the target's typed error, or (gguf) memory beyond its cap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

pytest.importorskip("atheris", reason="atheris (a dev dependency, Linux wheels) is not installed")

HARNESS = Path(__file__).resolve().parents[1] / "fuzz" / "untrusted_atheris.py"
RUNS = 20_000
SECONDS = 8


@pytest.mark.parametrize("target", ["answers", "gguf", "template"])
def test_untrusted_input_survives_a_bounded_atheris_run(target: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(HARNESS), target, "--write-seeds", str(corpus)], check=True)
    seeds = len(list(corpus.iterdir()))
    run = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            target,
            f"-runs={RUNS}",
            f"-max_total_time={SECONDS}",
            "-timeout=20",  # one input: the template budgets stop any at 2 s
            f"-artifact_prefix={tmp_path}/",
            "-print_final_stats=1",
            "-rss_limit_mb=0",  # see tests/unit/net/wire/test_atheris.py; gguf caps itself
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
    assert int(done.group(1)) > seeds
