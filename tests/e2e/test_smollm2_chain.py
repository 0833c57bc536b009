"""The default model, SmolLM2 135M Instruct (llama architecture, 30 layers, tied output),
cut into three stages equals the whole model exactly, on a chat-templated question; and
it answers the question instead of echoing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.lab.local_run import build_pipeline
from core.models import sliced_model, stage_files
from core.pipeline import compare_generations
from core.tokenizer import Tokenizer
from core.types import LayerRange

pytestmark = pytest.mark.e2e

N_LAYER = 30


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_path)


def test_the_slicer_allows_any_cut_of_the_llama_family(smollm2_path: Path) -> None:
    _, manifest = sliced_model(smollm2_path)
    f = manifest.facts
    assert (f.architecture, f.n_layer) == ("llama", N_LAYER)
    assert f.tied_output  # no output.weight: the last stage keeps token_embd as its head
    assert all(f.cut_allowed(k) for k in range(N_LAYER + 1))


def test_three_stages_equal_the_whole_model_and_answer(
    smollm2_path: Path, tokenizer: Tokenizer
) -> None:
    cuts = [0, 7, 19, 30]
    ranges = LayerRange.from_cuts(cuts)
    _, paths = stage_files(smollm2_path, ranges)
    prompt = tokenizer.encode_chat([("user", "What is 2 + 2?")])
    chain = build_pipeline(paths, ranges, N_LAYER, 512, 64, 2, True)
    whole = build_pipeline([smollm2_path], [LayerRange(0, N_LAYER)], N_LAYER, 512, 64, 2, True)
    try:
        a = chain.generate(prompt, 24, keep_logits=True, is_end=tokenizer.is_end)
        b = whole.generate(prompt, 24, keep_logits=True, is_end=tokenizer.is_end)
    finally:
        chain.shutdown()
        whole.shutdown()
    cmp = compare_generations(a, b)
    assert cmp.identical, (a.tokens, b.tokens)
    assert cmp.max_abs_logit_diff == 0.0
    answer = tokenizer.decode([t for t in a.tokens if not tokenizer.is_end(t)])
    # An answer, not the question continued or echoed; it stops on its end-of-turn token.
    assert "4" in answer and "What is 2 + 2" not in answer, answer
    assert a.stopped_by_end_token and tokenizer.is_end(a.tokens[-1]), answer
