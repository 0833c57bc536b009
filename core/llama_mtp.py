"""llama.cpp's MTP ("nextn") head of qwen35-family models, on the last stage.

The trunk context publishes h_nextn (its output-normed last hidden state) for every row
(`enable_nextn_rows`, `read_nextn_rows`). A second context of the same model, of type
LLAMA_CONTEXT_TYPE_MTP, runs only the MTP block: a row is (token x_p, h_{p-1}, position
p) and its logits guess x_{p+1}; it keeps its own KV cache of that one attention block,
which must hold a row for every trunk position the guesses attend to.

The staging functions live in llama.cpp's src/llama-ext.h and are exported under C++
mangled names; llama-cpp-python binds them in `llama_cpp.llama_cpp_ext`.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp.llama_cpp as _ll
import llama_cpp.llama_cpp_ext as _ext
import numpy as np
import numpy.typing as npt

from core.errors import DecodeError, ModelLoadError

LL: Any = _ll
EXT: Any = _ext

F32Array = npt.NDArray[np.float32]


def enable_nextn_rows(ctx: Any) -> None:
    """Make the trunk context keep h_nextn for every row (not only output rows)."""
    EXT.llama_set_embeddings_nextn(ctx, True, False)


def read_nextn_rows(ctx: Any, n: int, n_embd: int) -> F32Array:
    ptr = EXT.llama_get_embeddings_nextn(ctx)
    if not ptr:
        raise DecodeError(-102)
    return np.ctypeslib.as_array(ptr, shape=(n, n_embd)).copy()


class LlamaMtpContext:
    """The MTP context beside a trunk context; not thread-safe (the engine thread)."""

    def __init__(
        self, model: Any, trunk_ctx: Any, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int
    ) -> None:
        if int(LL.llama_model_n_layer_nextn(model)) != 1:
            raise ModelLoadError("the stage has no single MTP block (nextn_predict_layers != 1)")
        cp = LL.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq_max
        # An output row per sequence must fit (see llama_engine: an abort at load else).
        cp.n_outputs_max = max(n_batch, n_seq_max)
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.kv_unified = True
        cp.no_perf = True
        cp.n_rs_seq = 0
        cp.ctx_type = LL.LLAMA_CONTEXT_TYPE_MTP
        cp.ctx_other = trunk_ctx
        self._ctx: Any = LL.llama_init_from_model(model, cp)
        if not self._ctx:
            raise ModelLoadError("llama.cpp could not create the MTP context")
        # The head's own output hidden state feeds its next guess.
        EXT.llama_set_embeddings_nextn(self._ctx, True, True)
        self._mem = LL.llama_get_memory(self._ctx)
        self.n_embd = int(LL.llama_model_n_embd(model))
        self.n_vocab = int(LL.llama_vocab_n_tokens(LL.llama_model_get_vocab(model)))
        self.n_batch = n_batch
        self._batch: Any = LL.llama_batch_init(n_batch, self.n_embd, n_seq_max)
        # A batch with both a token and an embedding (h) per row: llama_batch_init gives
        # one or the other, so the token array is ours (put back before freeing).
        self._tokens = np.zeros(n_batch, dtype=np.int32)
        self._batch_token: int = ctypes.cast(self._batch.token, ctypes.c_void_p).value or 0
        self._batch.token = self._tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b = self._batch
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        self._embd = np.ctypeslib.as_array(b.embd, shape=(n_batch, self.n_embd))

    def decode(
        self, seq: int, start: int, tokens: npt.ArrayLike, h_prev: F32Array, want_last: bool
    ) -> tuple[F32Array, F32Array] | None:
        """Rows (tokens[i], h_prev[i], start + i) of one sequence; with `want_last` the
        last row's (logits, head hidden state) copied out, else None."""
        tok = np.asarray(tokens, dtype=np.int32)
        n = len(tok)
        if n == 0 or n > self.n_batch:
            raise ValueError(f"MTP batch of {n} rows; must be 1..{self.n_batch}")
        b = self._batch
        b.n_tokens = n
        self._tokens[:n] = tok
        self._embd[:n] = h_prev
        self._pos[:n] = np.arange(start, start + n, dtype=np.int32)
        self._nseq[:n] = 1
        for i in range(n):
            b.seq_id[i][0] = seq
        self._out[:n] = 0
        self._out[n - 1] = 1 if want_last else 0
        rc = int(LL.llama_decode(self._ctx, b))
        if rc != 0:
            raise DecodeError(rc)
        if not want_last:
            return None
        ptr = LL.llama_get_logits_ith(self._ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        h = EXT.llama_get_embeddings_nextn_ith(self._ctx, -1)
        if not h:
            raise DecodeError(-103)
        return logits.copy(), np.ctypeslib.as_array(h, shape=(self.n_embd,)).copy()

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(LL.llama_memory_seq_rm(self._mem, seq, p0, p1))

    def close(self) -> None:
        if self._batch is not None:
            self._batch.token = ctypes.cast(self._batch_token, ctypes.POINTER(ctypes.c_int32))
            LL.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            LL.llama_free(self._ctx)
            self._ctx = None
