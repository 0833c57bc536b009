"""Guesses from the model's own MTP head on the last stage: which rows feed the head's
cache, and how many tokens it guesses ahead (pure logic over a small context protocol;
llama.cpp's side is `core.llama_mtp.LlamaMtpContext`).

qwen35's MTP block reads a row (token x_p, trunk hidden h_{p-1}, position p) and its
logits guess x_{p+1}. Its attention needs a cached row for every earlier position, so
after each trunk decode of rows [start, start+n) with their tokens, `observe` feeds
(t_start, h_{start-1}), (t_start+1, h_start), ... into the head's own KV cache, first
dropping what it held from `start` on (rejected guesses of the previous trip).

After the last stage chose its token c at position pos (the accepted guesses before it),
`guess` runs the head from (c, h_{pos-1}, pos): its argmax is guess 1; guess j+1 comes
from (guess j, the head's own hidden state, pos+j). It stops after `k` guesses, or
earlier when the head's probability for its guess falls below `p_min` (prose, where
guesses rarely stand, stops early and costs little). Its guess rows are then dropped
again: the next trip's verified rows are fed by `observe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from core.errors import CoreError

F32Array = npt.NDArray[np.float32]


class MtpContext(Protocol):
    n_embd: int

    def decode(
        self, seq: int, start: int, tokens: npt.ArrayLike, h_prev: F32Array, want_last: bool
    ) -> tuple[F32Array, F32Array] | None: ...

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool: ...


class MtpError(CoreError):
    """The MTP head was asked something its state cannot answer."""


@dataclass
class _Seq:
    seq: int
    start: int = 0
    """Position of the first row of `h`."""
    h: F32Array | None = None
    """The trunk's h_nextn rows of the latest observed decode."""


def top_probability(logits: F32Array) -> tuple[int, float]:
    """(argmax, its softmax probability); lowest id wins ties, as greedy sampling does."""
    x = np.asarray(logits, dtype=np.float64)
    best = int(np.argmax(x))
    p = 1.0 / float(np.exp(x - x[best]).sum())
    return best, p


class MtpGuesser:
    """One per last stage; not thread-safe (the engine thread)."""

    def __init__(self, context: MtpContext, n_seq_max: int, n_batch: int) -> None:
        self.context = context
        self.n_batch = n_batch
        self._free = list(range(n_seq_max - 1, -1, -1))
        self._sessions: dict[str, _Seq] = {}
        self.head_decodes = 0
        """Decodes of the head for guesses (not counting the cache feeding)."""

    def open(self, session: str) -> None:
        if session in self._sessions:
            self.close(session)
        if not self._free:
            raise MtpError(f"{session}: no free MTP sequence slot")
        seq = self._free.pop()
        self.context.seq_rm(seq, 0, -1)
        self._sessions[session] = _Seq(seq)

    def close(self, session: str) -> None:
        s = self._sessions.pop(session, None)
        if s is not None:
            self.context.seq_rm(s.seq, 0, -1)
            self._free.append(s.seq)

    def observe(self, session: str, start: int, tokens: Sequence[int], h_rows: F32Array) -> None:
        """The trunk decoded rows [start, start + len(tokens)) with these tokens and
        these h_nextn rows: feed the head's cache."""
        s = self._sessions.get(session)
        if s is None or len(tokens) != h_rows.shape[0] or not len(tokens):
            return
        prev = self._h_at(s, start - 1)
        if prev is None:  # position 0 has no predecessor; a gap must not happen
            prev = np.zeros(self.context.n_embd, dtype=np.float32)
        h_prev = np.concatenate([prev[None, :], h_rows[:-1]], axis=0)
        self.context.seq_rm(s.seq, start, -1)
        for a in range(0, len(tokens), self.n_batch):
            b = min(a + self.n_batch, len(tokens))
            self.context.decode(s.seq, start + a, tokens[a:b], h_prev[a:b], want_last=False)
        s.start, s.h = start, h_rows.copy()

    def _h_at(self, s: _Seq, pos: int) -> F32Array | None:
        if s.h is None or not s.start <= pos < s.start + len(s.h):
            return None
        row: F32Array = s.h[pos - s.start]
        return row

    def guess(self, session: str, pos: int, token: int, k: int, p_min: float) -> tuple[int, ...]:
        """Up to `k` guesses of what follows `token`, the last stage's choice at `pos`."""
        s = self._sessions.get(session)
        if s is None or k <= 0:
            return ()
        h = self._h_at(s, pos - 1)
        if h is None:
            return ()
        guesses: list[int] = []
        row = token
        try:
            self.context.seq_rm(s.seq, pos, -1)  # rejected guesses of this trip
            for j in range(k):
                out = self.context.decode(s.seq, pos + j, [row], h[None, :], want_last=True)
                self.head_decodes += 1
                assert out is not None
                logits, h = out
                guess, p = top_probability(logits)
                if p < p_min:
                    break
                guesses.append(guess)
                row = guess
        finally:
            self.context.seq_rm(s.seq, pos, -1)  # the next trip's observe feeds them
        return tuple(guesses)
