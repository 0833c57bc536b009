"""A stage whose row budget (llama.cpp's n_batch) is under its session count loads and
answers exactly as the whole model does: llama.cpp keeps an output row per sequence, and
without room for them it aborted the process at load (`sangama worker --row-budget 64`
with 256 sessions). Run in a child process, since the failure is an abort."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CHILD = """
import sys
from pathlib import Path
from core.gguf_slices import assemble_stage, slice_model
from core.pipeline import LocalPipeline, compare_generations
from core.stage import Stage
from core.types import LayerRange, StageSpec

model, tmp = Path(sys.argv[1]), Path(sys.argv[2])
manifest = slice_model(model, tmp / "pieces")
stages = []
for layers in LayerRange.from_cuts([0, 4, 8]):
    path = assemble_stage(manifest, tmp / "pieces", layers, tmp / f"stage{layers.start}.gguf")
    spec = StageSpec(layers, 8, n_ctx=512, n_batch=4, n_seq_max=16)
    stages.append(Stage.from_file(path, spec))
whole = Stage.from_file(model, StageSpec(LayerRange(0, 8), 8, n_ctx=512, n_batch=64, n_seq_max=4))
chain, alone = LocalPipeline(stages), LocalPipeline([whole])
a = chain.generate([1, 5, 17, 42, 99, 7], 8, chunk=3)
b = alone.generate([1, 5, 17, 42, 99, 7], 8, chunk=3)
chain.shutdown()
alone.shutdown()
assert compare_generations(a, b).identical and len(a.tokens) == 8
print("SAME", len(a.tokens))
"""


def test_a_row_budget_under_the_session_count_loads_and_answers(
    tiny_llama: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_llama), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SAME 8" in done.stdout
