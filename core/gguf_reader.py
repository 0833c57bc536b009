"""Open a GGUF file for reading: gguf-py's reader, three times faster on large vocabularies.

gguf-py's `GGUFReader` reads every field through `np.memmap` slices, and slicing a memmap
builds a memmap subclass object each time (Python-level `__array_finalize__`). A GGUF's
tokenizer is an array of strings read four slices each, so Gemma 3's 262 144-token
vocabulary costs about a million of them: 25 s at load 2.5, over 60 s on a busy machine,
paid by every worker's start (stage sizes, admission) and every cut of the model.
`open_gguf` gives the same reader with its slices taken from a plain ndarray view of the
same mapping: the same fields, tensors and bytes (tests/unit/core/test_gguf_reader.py),
about a third of the time (8 s against 25 s, side by side).

The override touches one private method of gguf-py (`_get`); if a later gguf-py changes
it, `open_gguf` falls back to the stock reader rather than fail.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader

log = logging.getLogger(__name__)

__all__ = ["open_gguf"]


class _PlainViewReader(GGUFReader):
    """GGUFReader whose reads slice a plain ndarray view of the memmap."""

    def _get(
        self,
        offset: int,
        dtype: npt.DTypeLike,
        count: int = 1,
        override_order: Literal["I", "S", "<"] | None = None,
    ) -> npt.NDArray[Any]:
        plain = self.__dict__.get("_plain_view")
        if plain is None:
            # A view, not a copy: it shares the mapping (and keeps the memmap alive).
            plain = self.__dict__["_plain_view"] = self.data.view(np.ndarray)
        count = int(count)
        dt = np.dtype(dtype)
        arr = plain[offset : offset + dt.itemsize * count].view(dtype=dt)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))


def open_gguf(path: Path | str) -> GGUFReader:
    """A reader of the GGUF file at `path` (read-only), as `GGUFReader(path)` gives."""
    try:
        return _PlainViewReader(str(path))
    except (TypeError, AttributeError) as exc:  # gguf-py's internals moved: the stock way
        log.debug("fast GGUF reader unavailable (%s); using gguf-py's own", exc)
        return GGUFReader(str(path))
