"""Text <-> tokens and the chat template, read from a GGUF without loading its weights."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from pathlib import Path

from core.chat_template import is_jinja_template, render_chat_template
from core.llama_engine import LlamaVocab
from core.sampling_defaults import RecommendedSampling, recommended_sampling

Message = tuple[str, str]
"""(role, content): role is "system", "user" or "assistant"."""


class Tokenizer:
    def __init__(self, vocab: LlamaVocab) -> None:
        self._vocab = vocab

    @classmethod
    def from_gguf(cls, path: Path) -> Tokenizer:
        """Any GGUF that carries the tokenizer: the whole model, its embedding piece, stage 0."""
        return cls(LlamaVocab(Path(path)))

    @property
    def n_vocab(self) -> int:
        return self._vocab.n_vocab

    @property
    def bos(self) -> int:
        return self._vocab.bos

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return self._vocab.tokenize(text, add_special=add_special, parse_special=True)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._vocab.detokenize(list(tokens))

    def token_bytes(self, token: int) -> bytes:
        return self._vocab.token_to_piece(token)

    def is_end(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, end of turn)."""
        return self._vocab.is_end_of_generation(token)

    def chat_template(self) -> str | None:
        return self._vocab.chat_template()

    def recommended_sampling(self) -> RecommendedSampling:
        """How the model is meant to be sampled (core.sampling_defaults): its GGUF's
        `general.sampling.*` keys, the model card's for a known model, else a default."""
        return recommended_sampling(self._vocab.metadata)

    def has_own_chat_template(self) -> bool:
        """The GGUF carries a Jinja chat template (instruction-tuned models do), as
        opposed to none or only llama.cpp's built-in guess for its family."""
        template = self.chat_template()
        return template is not None and is_jinja_template(template)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The GGUF's own Jinja template, run in a sandbox (core.chat_template); a model
        without one (Gemma 3 270M) gets llama.cpp's built-in format for its family."""
        template = self.chat_template()
        if template is not None and is_jinja_template(template):
            return render_chat_template(
                template,
                messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._special_text(self._vocab.bos),
                eos_token=self._special_text(self._vocab.eos),
            )
        return self._vocab.apply_chat_template(list(messages), add_generation_prompt)

    def _special_text(self, token: int) -> str:
        if not (0 <= token < self.n_vocab):
            return ""
        return self._vocab.token_to_piece(token, special=True).decode(errors="replace")

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        tokens = self.encode(self.render_chat(messages), add_special=True)
        # Some templates write BOS themselves; never feed the model two.
        if len(tokens) > 1 and tokens[0] == tokens[1] == self.bos:
            tokens = tokens[1:]
        return tokens

    def streamer(self) -> TextStreamer:
        return TextStreamer(self)

    def close(self) -> None:
        self._vocab.close()


class TextStreamer:
    """Turns tokens into text as they arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._tok.token_bytes(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
