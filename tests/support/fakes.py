"""Fakes for unit tests of logic; never used outside tests."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from core.errors import DecodeError


class FakeEngine:
    """Deterministic stand-in for LlamaStageEngine: output row = f(position, input)."""

    def __init__(self, n_embd: int = 4, n_vocab: int = 16, capture_hidden: bool = True) -> None:
        self.n_embd = n_embd
        self.n_vocab = n_vocab
        self.capture_hidden = capture_hidden
        self.fail_next_with: int | None = None
        self.removed: list[tuple[int, int, int]] = []
        self.decoded_rows: list[int] = []
        self.can_cut = True
        """False: partial seq_rm fails, as on a recurrent cache without snapshots."""

    def decode(
        self,
        positions: npt.NDArray[np.int32],
        seq_ids: npt.NDArray[np.int32],
        outputs: npt.NDArray[np.bool_],
        tokens: npt.NDArray[np.int32] | None = None,
        hidden: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.float32]:
        if self.fail_next_with is not None:
            code, self.fail_next_with = self.fail_next_with, None
            raise DecodeError(code)
        self.decoded_rows.append(len(positions))
        base = hidden[:, 0] if hidden is not None else np.asarray(tokens, dtype=np.float32)
        value = base + positions
        if self.capture_hidden:
            return np.repeat(value[:, None], self.n_embd, axis=1).astype(np.float32)
        rows = value[outputs]
        return np.repeat(rows[:, None], self.n_vocab, axis=1).astype(np.float32)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        self.removed.append((seq_id, p0, p1))
        return self.can_cut or p0 == 0

    def close(self) -> None:
        pass
