"""Every layer boundary of a hybrid model chains exactly, stages of one kind of layer
included: tiny qwen35moe models (irregular explicit recurrent layers, routed experts and
a gated shared expert in every layer, IMROPE, with and without an MTP block) and a dense
qwen35, cut at each boundary in turn and into one-layer stages (each then holds
recurrent layers only or attention layers only), give the whole model's tokens and
logits to the bit; so does the seeds' fleet shape, twenty 3-layer stages of a 60-layer
qwen35moe, most of which hold no attention layer at all.

What makes single-kind stages run is the engine's llama.cpp patch
(installers/engine/patches/hybrid-memory-single-kind.patch): a graph that reads only one
of the hybrid memory's two halves leaves the other's inputs unset instead of aborting.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from app.cli.main import main
from core.gguf_slices import assemble_stage, slice_model
from core.manifest import Manifest
from core.pipeline import LocalPipeline, PipelineGeneration, compare_generations
from core.stage import Stage
from core.types import LayerRange, StageSpec
from tests.support.tiny_qwen35 import Qwen35Dims, write_qwen35_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7, 30, 2, 9, 11]
N_TOKENS = 12
# Irregular, as a converter writes it from a config: runs of 1 to 3 recurrent layers.
PATTERN = (True, True, False, True, False, False, True, True, True, False)
MOE = Qwen35Dims(n_layer=len(PATTERN), moe=True, pattern=PATTERN)
DENSE = Qwen35Dims(n_layer=len(PATTERN), pattern=PATTERN)


def _spec(layers: LayerRange, n_layer: int) -> StageSpec:
    return StageSpec(layers, n_layer, n_ctx=256, n_batch=64, n_seq_max=2)


def _generate(stages: list[Stage]) -> PipelineGeneration:
    pipeline = LocalPipeline(stages)
    try:
        return pipeline.generate(PROMPT, N_TOKENS, chunk=3, keep_logits=True)
    finally:
        pipeline.shutdown()


def _chain(manifest: Manifest, pieces: Path, cuts: list[int], tmp: Path) -> PipelineGeneration:
    n = manifest.facts.n_layer
    stages = []
    for layers in LayerRange.from_cuts(cuts):
        path = assemble_stage(manifest, pieces, layers, tmp / f"s{layers.start}.gguf")
        stages.append(Stage.from_file(path, _spec(layers, n)))
    return _generate(stages)


def _whole(model: Path, n: int) -> PipelineGeneration:
    return _generate([Stage.from_file(model, _spec(LayerRange(0, n), n))])


def _assert_exact(chain: PipelineGeneration, whole: PipelineGeneration) -> None:
    cmp = compare_generations(chain, whole)
    assert len(chain.tokens) == N_TOKENS
    assert cmp.identical, (chain.tokens, whole.tokens)
    assert cmp.max_abs_logit_diff == 0.0


@pytest.fixture(
    scope="module",
    params=[(MOE, False), (MOE, True), (DENSE, True)],
    ids=["qwen35moe", "qwen35moe-mtp", "qwen35-mtp"],
)
def sliced(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Manifest, Path, PipelineGeneration]:
    dims, mtp = request.param
    d = tmp_path_factory.mktemp(dims.arch)
    model = write_qwen35_model(d / "m.gguf", dims, mtp=mtp, seed=3)
    manifest = slice_model(model, d / "pieces")
    assert manifest.facts.architecture == dims.arch
    assert manifest.facts.allowed_cuts is None  # placement may cut anywhere
    return manifest, d / "pieces", _whole(model, dims.n_layer)


def test_one_layer_stages_of_either_kind_chain_exactly(
    sliced: tuple[Manifest, Path, PipelineGeneration], tmp_path: Path
) -> None:
    manifest, pieces, whole = sliced
    n = manifest.facts.n_layer
    kinds = manifest.facts.layer_kinds
    assert {kinds[i] for i in range(n)} == {"recurrent", "full"}
    _assert_exact(_chain(manifest, pieces, list(range(n + 1)), tmp_path), whole)


@pytest.mark.parametrize("cut", range(1, len(PATTERN)))
def test_every_boundary_chains_exactly(
    sliced: tuple[Manifest, Path, PipelineGeneration], tmp_path: Path, cut: int
) -> None:
    manifest, pieces, whole = sliced
    _assert_exact(_chain(manifest, pieces, [0, cut, manifest.facts.n_layer], tmp_path), whole)


def test_twenty_stages_of_three_layers_equal_the_whole_60_layer_model(tmp_path: Path) -> None:
    dims = Qwen35Dims(n_layer=60, moe=True, full_every=4, n_embd=32, n_head=2, n_head_kv=1)
    model = write_qwen35_model(tmp_path / "m.gguf", dims, mtp=True, seed=5)
    manifest = slice_model(model, tmp_path / "pieces")
    cuts = list(range(0, 61, 3))
    kinds = manifest.facts.layer_kinds
    stage_kinds = [set(kinds[a:b]) for a, b in pairwise(cuts)]
    # Most stages of the seeds' fleet hold no attention layer at all.
    assert sum(k == {"recurrent"} for k in stage_kinds) >= 5
    _assert_exact(_chain(manifest, tmp_path / "pieces", cuts, tmp_path), _whole(model, 60))


def test_sangama_generate_compares_a_qwen35moe_chain_with_single_kind_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_qwen35_model(tmp_path / "m.gguf", MOE, mtp=True, seed=3)
    ids = ",".join(str(t) for t in PROMPT)
    # [0,2): recurrent only; [4,6): attention only; [6,9): recurrent only.
    argv = ["generate", "--model", str(model), "--cuts", "0,2,4,6,9,10"]
    code = main([*argv, "--prompt-tokens", ids, "--max-tokens", "8", "--compare", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["identical"] is True and report["max_abs_logit_diff"] == 0.0
    # A model without a tokenizer cannot take a text prompt: one line says what to do.
    assert main([*argv, "--prompt", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no tokenizer" in err and "token ids" in err and len(err.splitlines()) == 1
