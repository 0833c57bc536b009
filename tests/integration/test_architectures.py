"""Exact or refused, on the real engine: for each tiny random family, chains of assembled
stages generate the same greedy tokens as the whole model with logits equal to the bit
(max |diff| == 0.0); where the architecture restricts cuts, a disallowed cut is refused
before any stage is built and the allowed ones are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import CutNotAllowedError
from core.gguf_slices import assemble_stage, slice_model
from core.manifest import Manifest
from core.pipeline import LocalPipeline, compare_generations
from core.stage import Stage
from core.types import LayerRange, StageSpec
from tests.support.tiny_families import write_family_model

pytestmark = pytest.mark.integration

N_LAYER = 8
PROMPT = [1, 5, 17, 42, 99, 7, 300, 2]

# family -> cuts that must be exact
EXACT = {
    "qwen2": [[0, 3, 6, 8], [0, 1, 7, 8]],  # q/k/v biases
    "granite": [[0, 3, 6, 8], [0, 5, 8]],  # embedding scale (first stage only), rope_freqs
    "phi3": [[0, 3, 6, 8], [0, 1, 7, 8]],  # fused QKV, rope_factors_long/short
    "starcoder2": [[0, 3, 6, 8], [0, 1, 7, 8]],  # output_norm.bias, tied head
    "starcoder": [[0, 3, 6, 8], [0, 2, 8]],  # position_embd (zeros after the first stage)
    "olmo2": [[0, 3, 6, 8], [0, 1, 7, 8]],  # post-norms, required output.weight
    "cohere2": [[0, 2, 5, 8], [0, 1, 6, 8]],  # sliding-window pattern written per layer
    "smollm3": [[0, 4, 8]],  # no RoPE in every 4th layer by index
    "gemma2": [[0, 8]],  # whole only
}
# family -> cuts that must be refused
REFUSED = {
    "smollm3": [[0, 2, 8], [0, 4, 6, 8]],
    "gemma2": [[0, 4, 8]],
    "cohere2": [[0, 3, 8], [0, 4, 7, 8]],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Manifest]]:
    out = {}
    for fam in EXACT:
        d = tmp_path_factory.mktemp(fam)
        model = write_family_model(d / f"{fam}.gguf", fam)
        out[fam] = model, d / "pieces", slice_model(model, d / "pieces")
    return out


def _spec(layers: LayerRange) -> StageSpec:
    return StageSpec(layers, N_LAYER, n_ctx=256, n_batch=64, n_seq_max=2)


def _chain(pieces: Path, manifest: Manifest, cuts: list[int], tmp: Path) -> list[Stage]:
    stages = []
    for layers in LayerRange.from_cuts(cuts):
        path = assemble_stage(manifest, pieces, layers, tmp / f"stage{layers.start}.gguf")
        stages.append(Stage.from_file(path, _spec(layers)))
    return stages


@pytest.mark.parametrize(
    ("family", "cuts"), [(f, c) for f, cs in EXACT.items() for c in cs], ids=str
)
def test_chain_equals_whole_model_exactly(
    models: dict[str, tuple[Path, Path, Manifest]], tmp_path: Path, family: str, cuts: list[int]
) -> None:
    model, pieces, manifest = models[family]
    chain = LocalPipeline(_chain(pieces, manifest, cuts, tmp_path))
    whole = LocalPipeline([Stage.from_file(model, _spec(LayerRange(0, N_LAYER)))])
    try:
        a = chain.generate(PROMPT, 12, chunk=3, keep_logits=True)
        b = whole.generate(PROMPT, 12, chunk=3, keep_logits=True)
    finally:
        chain.shutdown()
        whole.shutdown()
    cmp = compare_generations(a, b)
    assert cmp.identical and len(a.tokens) == 12, (family, cuts)
    assert cmp.max_abs_logit_diff == 0.0, (family, cuts)


@pytest.mark.parametrize(
    ("family", "cuts"), [(f, c) for f, cs in REFUSED.items() for c in cs], ids=str
)
def test_inexact_cuts_are_refused_before_serving(
    models: dict[str, tuple[Path, Path, Manifest]], tmp_path: Path, family: str, cuts: list[int]
) -> None:
    _, pieces, manifest = models[family]
    with pytest.raises(CutNotAllowedError) as err:
        for layers in LayerRange.from_cuts(cuts):
            assemble_stage(manifest, pieces, layers, tmp_path / f"s{layers.start}.gguf")
    assert err.value.position in cuts and err.value.position not in err.value.allowed
