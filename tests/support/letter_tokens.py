"""A tokenizer for API tests without a model: token i is the letter chr(ord('a') + i % 26),
no end token."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from core.sampling_defaults import FALLBACK, RecommendedSampling


class LetterTokenizer:
    n_vocab = 64

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return [ord(c) % 26 for c in text]

    def encode_chat(self, messages: Sequence[Any]) -> list[int]:
        return self.encode("".join(str(m[-1]) for m in messages))

    def is_end(self, token: int) -> bool:
        return False

    def recommended_sampling(self) -> RecommendedSampling:
        return RecommendedSampling(FALLBACK, "test")

    def streamer(self) -> Any:
        decoder = codecs.getincrementaldecoder("utf-8")()

        class _Streamer:
            def push(self, token: int) -> str:
                return decoder.decode(bytes([ord("a") + token % 26]))

            def flush(self) -> str:
                return decoder.decode(b"", final=True)

        return _Streamer()
