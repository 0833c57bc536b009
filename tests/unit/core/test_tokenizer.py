"""Tokenizer and chat template read from a GGUF without its weights (Gemma's vocabulary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ModelLoadError, TokenizerError
from core.gguf_slices import slice_model
from core.tokenizer import Tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tok(gemma_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gemma_path)


def test_round_trip_and_bos(tok: Tokenizer) -> None:
    text = "Sangama joins many small machines — ஒன்று கூடு!"
    ids = tok.encode(text)
    assert ids[0] == tok.bos and len(ids) > 5
    assert tok.decode(ids[1:]) == text
    assert tok.encode(text, add_special=False) == ids[1:]
    assert tok.n_vocab == 262144


def test_chat_template_wraps_turns(tok: Tokenizer) -> None:
    text = tok.render_chat([("user", "Hello there")])
    assert "<start_of_turn>user" in text and text.rstrip().endswith("<start_of_turn>model")
    ids = tok.encode_chat([("user", "Hello there")])
    assert ids[0] == tok.bos and ids[1] != tok.bos
    assert tok.chat_template() is not None


def test_end_tokens(tok: Tokenizer) -> None:
    end_of_turn = tok.encode("<end_of_turn>", add_special=False)
    assert len(end_of_turn) == 1 and tok.is_end(end_of_turn[0])
    assert not tok.is_end(tok.encode("hello", add_special=False)[0])


def test_streamer_holds_back_partial_utf8(tok: Tokenizer) -> None:
    text = "naïve café ஒன்று 🚀 done"
    ids = tok.encode(text, add_special=False)
    s = tok.streamer()
    pieces = [s.push(t) for t in ids] + [s.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_invalid_token_is_a_typed_error(tok: Tokenizer) -> None:
    with pytest.raises(TokenizerError):
        tok.token_bytes(tok.n_vocab + 5)


def test_tokenizer_loads_from_the_embedding_piece_alone(
    gemma_path: Path, tmp_path: Path, tok: Tokenizer
) -> None:
    # The client only needs the embedding piece, which carries the tokenizer metadata.
    from core.models import sliced_model

    pieces, manifest = sliced_model(gemma_path)
    emb = Tokenizer.from_gguf(pieces / manifest.piece("embedding").file)
    assert emb.encode("hello world") == tok.encode("hello world")
    emb.close()


def test_a_file_without_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")


def test_tiny_model_tokenizer_has_dummy_vocab(tiny_llama: Path, tmp_path: Path) -> None:
    slice_model(tiny_llama, tmp_path)
    t = Tokenizer.from_gguf(tiny_llama)
    assert t.n_vocab == 512
    t.close()
