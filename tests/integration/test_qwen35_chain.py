"""A hybrid qwen35 model (gated delta-net recurrent layers, full-attention layers, M-RoPE),
with and without an MTP block, sliced into stages: the chain equals the whole model to
the bit, every stage has its true trunk layer count, and only the last stage carries the
MTP block. Exercises the fixes for qwen35-family stages: four positions per hidden-state
row (IMROPE), one sequence per decode under hybrid memory, rollback of rejected rows
through the recurrent state's snapshots (n_rs_seq). ~6 s."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from core.gguf_slices import assemble_stage, slice_model
from core.manifest import Manifest
from core.pipeline import LocalPipeline, compare_generations
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec
from tests.support.tiny_qwen35 import Qwen35Dims, write_qwen35_model

pytestmark = pytest.mark.integration

DIMS = Qwen35Dims()
N = DIMS.n_layer
PROMPT = [1, 5, 17, 42, 99, 7, 30, 2, 9, 11]


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "mtp"])
def sliced(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Manifest]:
    d = tmp_path_factory.mktemp("qwen35")
    model = write_qwen35_model(d / "q.gguf", DIMS, mtp=request.param)
    return model, d / "pieces", slice_model(model, d / "pieces")


def _spec(layers: LayerRange) -> StageSpec:
    return StageSpec(layers, N, n_ctx=256, n_batch=64, n_seq_max=2)


def _chain(pieces: Path, manifest: Manifest, cuts: list[int], tmp: Path) -> list[Stage]:
    return [
        Stage.from_file(
            assemble_stage(manifest, pieces, layers, tmp / f"s{layers.start}.gguf"), _spec(layers)
        )
        for layers in LayerRange.from_cuts(cuts)
    ]


@pytest.mark.parametrize("cuts", [[0, 2, 4, 6], [0, 4, 6]], ids=str)
def test_qwen35_chain_equals_whole_model(
    sliced: tuple[Path, Path, Manifest], tmp_path: Path, cuts: list[int]
) -> None:
    model, pieces, manifest = sliced
    assert manifest.facts.n_layer == N
    stages = _chain(pieces, manifest, cuts, tmp_path)
    chain = LocalPipeline(stages)
    whole = LocalPipeline([Stage.from_file(model, _spec(LayerRange(0, N)))])
    try:
        n_layers = [s.engine.n_layer for s in stages]  # type: ignore[attr-defined]
        assert n_layers == [b - a for a, b in pairwise(cuts)]
        a = chain.generate(PROMPT, 16, chunk=3, keep_logits=True)
        b = whole.generate(PROMPT, 16, chunk=3, keep_logits=True)
    finally:
        chain.shutdown()
        whole.shutdown()
    cmp = compare_generations(a, b)
    assert cmp.identical and len(a.tokens) == 16
    assert cmp.max_abs_logit_diff == 0.0


def test_mtp_block_goes_to_the_last_stage_only(tmp_path: Path) -> None:
    model = write_qwen35_model(tmp_path / "q.gguf", DIMS, mtp=True)
    manifest = slice_model(model, tmp_path / "pieces")
    assert (manifest.facts.n_layer, manifest.facts.n_mtp_layers) == (N, 1)
    # The MTP block's weights count toward the last stage (the head), not a trunk layer.
    plain = slice_model(write_qwen35_model(tmp_path / "p.gguf", DIMS, mtp=False), tmp_path / "pp")
    assert manifest.facts.bytes_per_layer == plain.facts.bytes_per_layer
    assert manifest.facts.head_bytes > plain.facts.head_bytes
    for layers in LayerRange.from_cuts([0, 2, 4, 6]):
        path = assemble_stage(manifest, tmp_path / "pieces", layers, tmp_path / "s.gguf")
        r = GGUFReader(str(path))
        last = layers.stop == N
        blocks = {int(t.name.split(".")[1]) for t in r.tensors if t.name.startswith("blk.")}
        nextn = [t.name for t in r.tensors if ".nextn." in t.name]
        assert int(r.fields["qwen35.block_count"].contents()) == len(layers) + last
        assert ("qwen35.nextn_predict_layers" in r.fields) == last
        assert blocks == set(range(len(layers) + last))
        assert bool(nextn) == last and all(n.startswith(f"blk.{len(layers)}.") for n in nextn)
        recurrent = r.fields["qwen35.attention.recurrent_layers"].contents()
        assert recurrent == DIMS.recurrent()[layers.start : layers.stop] + [False] * last


def test_rejected_rows_are_undone_through_the_recurrent_snapshots(
    sliced: tuple[Path, Path, Manifest], tmp_path: Path
) -> None:
    """k+1 rows evaluated, the last r cut by keep_until, then the true continuation: the
    logits equal those of never having seen the cut rows (r up to n_rs_seq), up to the
    last bits that other batch shapes change."""
    _, pieces, manifest = sliced
    stages = _chain(pieces, manifest, [0, 4, 6], tmp_path)
    chain = LocalPipeline(stages)
    try:
        assert all(s.engine.n_rs_seq >= 6 for s in stages)  # type: ignore[attr-defined]
        chain.open("a")
        chain.open("b")
        chain.forward("a", 0, PROMPT)
        chain.forward("b", 0, PROMPT)
        n = len(PROMPT)
        for r in (1, 3, 6):
            guess = [3, 4, 5, 6, 7, 8, 9][: r + 1]
            chain.forward("a", n, guess, all_logits=True)  # 1 kept + r to undo
            for s in stages:
                s.rollback("a", n + 1)
            a = _forward_from(chain, "a", n + 1, [200, 201])
            chain.forward("b", n, guess[:1])
            b = chain.forward("b", n + 1, [200, 201])
            # Same tokens, other row counts per decode (k+1 then 2, against 1 then 2):
            # the matrix kernels differ in the last bits only; a wrong state is O(1) off.
            assert np.abs(a - b).max() < 1e-4, r
            assert np.array_equal(a.argmax(axis=1), b.argmax(axis=1))
            n += 3
        assert all(s.stats.undos == 3 for s in stages)
    finally:
        chain.close("a")
        chain.close("b")
        chain.shutdown()


def _forward_from(chain: LocalPipeline, session: str, start: int, tokens: list[int]) -> np.ndarray:
    req = StepRequest(session, start, tokens=np.asarray(tokens, dtype=np.int32))
    out = None
    for stage in chain.stages:
        (res,) = stage.step([req])
        assert isinstance(res, StepResult)
        out = res
        if res.hidden is not None:
            req = StepRequest(session, start, hidden=res.hidden)
    assert out is not None and out.logits is not None
    return out.logits
