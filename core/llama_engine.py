"""The one module that imports llama_cpp: a stage's model and context, and vocab-only loads.

A stage engine evaluates one batch of rows in one `llama_decode`. Rows carry tokens
(first stage) or f32 hidden states (later stages, through `llama_batch.embd`). Non-last
stages return the residual after their last block, captured by an eval callback on the
tensor `l_out-<k-1>`; the callback then stops the graph so the output norm and head are
skipped. The last stage returns logits. Recipe and builds: docs/engine.md.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as _ll
import numpy as np
import numpy.typing as npt

from core.backends import device_handle, ensure_backends, lib_path
from core.capture_lib import load_capture_lib
from core.errors import DecodeError, EngineLayoutError, ModelLoadError, TokenizerError
from core.offload import StageSizes, plan_offload
from core.types import BackendReport, ModelFacts, OffloadPlan
from core.ubatch_order import ubatch_order

log = logging.getLogger(__name__)

# ctypes signatures of llama_cpp are precise but noisy for mypy; treat the module as Any.
LL: Any = _ll

F32Array = npt.NDArray[np.float32]

# ---------------------------------------------------------------- ggml tensor layout

_GGML_MAX_DIMS, _GGML_MAX_OP_PARAMS, _GGML_MAX_SRC, _GGML_MAX_NAME = 4, 64, 10, 64
_GGML_TYPE_F32 = 0
_ROPE_MROPE, _ROPE_IMROPE = 8, 40  # GGML_ROPE_TYPE_MROPE / _IMROPE
_GGML_OBJECT_SIZE = 32  # sizeof(struct ggml_object), part of ggml_tensor_overhead()


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor as in the ggml.h vendored by llama-cpp-python 0.3.36."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * _GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * _GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (_GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * _GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * _GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_NAME_OFFSET: int = GgmlTensor.name.offset


def _load_ggml_base() -> Any:
    lib = ctypes.CDLL(str(lib_path("ggml-base")))
    lib.ggml_backend_tensor_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
    ]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_tensor_overhead.argtypes = []
    lib.ggml_tensor_overhead.restype = ctypes.c_size_t
    lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    lib.ggml_is_contiguous.restype = ctypes.c_bool
    return lib


_ggml_base = _load_ggml_base()


def tensor_layout() -> tuple[int, int]:
    """(sizeof(ggml_tensor) as we declare it, as the loaded library has it)."""
    return ctypes.sizeof(GgmlTensor), int(_ggml_base.ggml_tensor_overhead()) - _GGML_OBJECT_SIZE


def check_tensor_layout() -> None:
    ours, theirs = tensor_layout()
    if ours != theirs:
        raise EngineLayoutError(
            f"ggml_tensor is {theirs} bytes in the loaded llama.cpp but {ours} in Sangama's "
            "declaration; this llama-cpp-python build is not the pinned 0.3.36"
        )


# ---------------------------------------------------------------- process-wide set-up

_init_lock = threading.Lock()
_initialised = False


def _init_backend() -> None:
    global _initialised
    with _init_lock:
        if _initialised:
            return
        check_tensor_layout()
        # Quiet logging and backend modules first: placement reads buffer types at load.
        ensure_backends()
        LL.llama_backend_init()
        _initialised = True


# ---------------------------------------------------------------- the C capture callback


class _CaptureState(ctypes.Structure):
    _fields_ = [
        ("target", ctypes.c_char * 64),
        ("name_offset", ctypes.c_size_t),
        ("dst", ctypes.c_void_p),
        ("cap_bytes", ctypes.c_size_t),
        ("written", ctypes.c_size_t),
        ("overflow", ctypes.c_int),
    ]


def c_capture_available() -> bool:
    return load_capture_lib() is not None


# ---------------------------------------------------------------- engine


@functools.lru_cache(maxsize=8)
def _facts_of(path: str, _mtime_ns: int, _size: int) -> ModelFacts:
    """The facts of a GGUF, read once per file version: a worker's start asks twice (the
    offload plan, then admission) and a first stage's file holds the whole vocabulary,
    seconds to parse (core/gguf_reader.py)."""
    from core.gguf_reader import open_gguf
    from core.gguf_slices import read_facts

    return read_facts(open_gguf(path))


def stage_sizes(path: Path, with_head: bool) -> StageSizes:
    """Per-block weights and KV per position of a stage GGUF, for the offload plan."""
    stat = path.stat()
    facts = _facts_of(str(path), stat.st_mtime_ns, stat.st_size)
    head = facts.head_bytes + (facts.embedding_bytes if facts.tied_output else 0)
    return StageSizes(
        block_bytes=facts.bytes_per_layer,
        kv_bytes_per_token=facts.kv_bytes_per_token_per_layer,
        head_bytes=head if with_head else 0,
        n_embd=facts.n_embd,
    )


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 2048
    n_batch: int = 256
    n_seq_max: int = 8
    n_threads: int = 2
    capture_hidden: bool = False
    """True on non-last stages: return the last block's residual instead of logits."""
    embd_input: bool = False
    """True on non-first stages: rows arrive as hidden states, not tokens."""
    c_callback: bool = True
    """Use the compiled capture callback where a C compiler is available."""
    use_gpu: bool = True
    """Offload blocks to a GPU where one is found (SANGAMA_DEVICE=cpu turns it off)."""
    device_cap_bytes: int = 0
    """The most GPU memory this stage may take; 0: all free memory."""
    kv_unified: bool = True
    """One KV stream shared by every sequence, n_ctx positions for all; False (how
    stages run): a stream of n_ctx / n_seq_max positions per sequence, so a sequence's
    cells sit where they would alone and its rows give the same numbers whatever else
    shares the decode (docs/decisions/batch-invariance.md)."""
    n_rs_seq: int = 8
    """Recurrent and hybrid models: per-token snapshots of the recurrent state kept per
    sequence, so `seq_rm` can cut up to this many rejected guesses (0: none)."""
    mtp: bool = False
    """Last stage of a model with an MTP block: load it and keep the trunk's h_nextn
    rows of every decode (`nextn_rows`) for the MTP head (core/llama_mtp.py)."""


class LlamaStageEngine:
    """One model, one context, one reusable batch; not thread-safe (one caller at a time)."""

    def __init__(self, path: Path, config: EngineConfig) -> None:
        _init_backend()
        self.config = config
        self.backend: BackendReport = ensure_backends()
        self.offload: OffloadPlan = self._plan(path, config)
        mp = LL.llama_model_default_params()
        mp.n_gpu_layers = self.offload.n_gpu_layers
        if self.offload.on_gpu:
            # Pin the stage to the chosen device; llama.cpp would otherwise split the
            # blocks over every GPU it sees.
            assert self.offload.device is not None
            self._devices = (ctypes.c_void_p * 2)(device_handle(self.offload.device), None)
            mp.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            mp.split_mode = 0  # LLAMA_SPLIT_MODE_NONE
            mp.main_gpu = 0
        if config.mtp:
            mp.load_mtp = True
        self._model: Any = LL.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {path}")
        self._ctx: Any = None
        self._own_pos: npt.NDArray[np.int32] | None = None
        self._batch_pos: Any = None
        self.mtp_context: Any = None
        """MTP stages: the MTP head's context (core.llama_mtp.LlamaMtpContext)."""
        self.nextn_rows: F32Array | None = None
        """MTP stages: the trunk's h_nextn (output-normed last hidden) of every row of
        the last decode, in batch order."""
        self._batch: Any = None
        self._mem: Any = None
        self._pos_view: npt.NDArray[np.int32] = np.empty(0, dtype=np.int32)
        self._nseq_view: npt.NDArray[np.int32] = np.empty(0, dtype=np.int32)
        self._out_view: npt.NDArray[np.int8] = np.empty(0, dtype=np.int8)
        self._tok_view: npt.NDArray[np.int32] | None = None
        self._embd_view: F32Array | None = None
        self.last_decode_s = 0.0
        self._n_out = 0
        """Seconds the last `llama_decode` took (the model's own work, for bench/)."""
        try:
            self.n_layer = int(LL.llama_model_n_layer(self._model))
            self.n_embd = int(LL.llama_model_n_embd(self._model))
            self.n_vocab = int(LL.llama_vocab_n_tokens(LL.llama_model_get_vocab(self._model)))
            # M-RoPE models (qwen35 and kin) read 4 positions per row for hidden-state
            # input; text tokens get theirs expanded by llama.cpp itself.
            rope = int(LL.llama_model_rope_type(self._model))
            self.pos_per_row = 4 if rope in (_ROPE_MROPE, _ROPE_IMROPE) else 1
            self.recurrent = bool(
                LL.llama_model_is_recurrent(self._model) or LL.llama_model_is_hybrid(self._model)
            )
            self.one_sequence_per_decode = self.recurrent
            """Hybrid memory splits a batch by sequence (split_equal) and runs the pieces
            in another order than the rows; the capture callback would hand rows back in
            that order, so each decode holds one sequence only (core/stage.py)."""
            self._setup_context(config)
        except BaseException:
            self.close()
            raise

    def _plan(self, path: Path, config: EngineConfig) -> OffloadPlan:
        sizes = stage_sizes(path, with_head=not config.capture_hidden)
        return plan_offload(
            self.backend.devices,
            sizes,
            n_ctx=config.n_ctx,
            n_batch=config.n_batch,
            cap_bytes=config.device_cap_bytes,
            use_gpu=config.use_gpu and os.environ.get("SANGAMA_DEVICE", "") != "cpu",
        )

    def _setup_context(self, config: EngineConfig) -> None:
        cp = LL.llama_context_default_params()
        cp.n_ctx = config.n_ctx
        cp.n_batch = cp.n_ubatch = config.n_batch
        cp.n_seq_max = config.n_seq_max
        # llama.cpp keeps an output row for every sequence and asserts that they fit its
        # outputs per step (n_batch unless set): a row budget under the session count
        # (--row-budget 64 with 256 sessions) would abort the process at load.
        cp.n_outputs_max = max(config.n_batch, config.n_seq_max)
        cp.n_threads = cp.n_threads_batch = config.n_threads
        # A stream per sequence: llama.cpp computes a multi-sequence batch sequence by
        # sequence, and decode() puts the captured rows back in order (core.ubatch_order).
        cp.kv_unified = config.kv_unified
        cp.no_perf = True
        if self.recurrent and config.n_rs_seq > 0:
            # The splitter keeps the last n_rs_seq + 1 rows of a sequence in one ubatch.
            cp.n_rs_seq = min(config.n_rs_seq, max(0, config.n_batch - 2))
        self._target = f"l_out-{self.n_layer - 1}".encode()
        self._chunks: list[F32Array] = []
        self._capture_buf: F32Array | None = None
        self._cstate: _CaptureState | None = None
        self.uses_c_callback = False
        if config.capture_hidden:
            lib = load_capture_lib() if config.c_callback else None
            if lib is not None:
                self._capture_buf = np.empty((config.n_batch, self.n_embd), dtype=np.float32)
                self._cstate = _CaptureState(
                    self._target,
                    _NAME_OFFSET,
                    self._capture_buf.ctypes.data,
                    self._capture_buf.nbytes,
                    0,
                    0,
                )
                cp.cb_eval = ctypes.cast(
                    lib.sangama_capture_cb, LL.ggml_backend_sched_eval_callback
                )
                cp.cb_eval_user_data = ctypes.addressof(self._cstate)
                self.uses_c_callback = True
            else:
                self._py_cb = LL.ggml_backend_sched_eval_callback(self._eval_cb)
                cp.cb_eval = self._py_cb
                cp.cb_eval_user_data = None
        self._ctx = LL.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise ModelLoadError("llama.cpp could not create a context (out of memory?)")
        self._mem = LL.llama_get_memory(self._ctx)
        self.n_rs_seq = int(LL.llama_n_rs_seq(self._ctx)) if self.recurrent else 0
        if config.mtp:
            from core.llama_mtp import LlamaMtpContext, enable_nextn_rows

            enable_nextn_rows(self._ctx)
            self.mtp_context = LlamaMtpContext(
                self._model, self._ctx, config.n_ctx, config.n_batch, config.n_seq_max,
                config.n_threads,
            )  # fmt: skip
        n_embd_in = self.n_embd if config.embd_input else 0
        self._batch = LL.llama_batch_init(config.n_batch, n_embd_in, config.n_seq_max)
        b = self._batch
        n = config.n_batch
        if config.embd_input and self.pos_per_row > 1:
            # llama_batch_init allocates one position per row; M-RoPE reads pos_per_row
            # (section-major). Our buffer, put back before llama_batch_free.
            self._own_pos = np.zeros(n * self.pos_per_row, dtype=np.int32)
            self._batch_pos = ctypes.cast(b.pos, ctypes.c_void_p).value  # an address, not a view
            b.pos = self._own_pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self._pos_view = np.ctypeslib.as_array(b.pos, shape=(n * self.pos_per_row,))
        self._nseq_view = np.ctypeslib.as_array(b.n_seq_id, shape=(n,))
        self._out_view = np.ctypeslib.as_array(b.logits, shape=(n,))
        self._tok_view = None if config.embd_input else np.ctypeslib.as_array(b.token, shape=(n,))
        self._embd_view = (
            np.ctypeslib.as_array(b.embd, shape=(n, self.n_embd)) if config.embd_input else None
        )

    def _eval_cb(self, tensor: int, ask: bool, _ud: Any) -> bool:
        name = ctypes.string_at(tensor + _NAME_OFFSET, len(self._target) + 1)
        if ask:
            return name == self._target + b"\0"
        t = GgmlTensor.from_address(tensor)
        if t.type != _GGML_TYPE_F32 or not _ggml_base.ggml_is_contiguous(tensor):
            # Exceptions cannot cross the C boundary; decode() notices the missing rows.
            return False
        out = np.empty((int(t.ne[1]), int(t.ne[0])), dtype=np.float32)
        _ggml_base.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
        self._chunks.append(out)
        return False  # skip the rest of the graph: output norm and lm_head

    # ------------------------------------------------------------ evaluation

    def decode(
        self,
        positions: npt.NDArray[np.int32],
        seq_ids: npt.NDArray[np.int32],
        outputs: npt.NDArray[np.bool_],
        tokens: npt.NDArray[np.int32] | None = None,
        hidden: F32Array | None = None,
    ) -> F32Array:
        """Evaluate rows; hidden states of every row, or logits of rows marked in `outputs`."""
        n = len(positions)
        if n == 0 or n > self.config.n_batch:
            raise ValueError(f"batch of {n} rows; must be 1..{self.config.n_batch}")
        b = self._batch
        b.n_tokens = n
        if self.config.embd_input:
            assert hidden is not None and self._embd_view is not None
            self._embd_view[:n] = hidden
        else:
            assert tokens is not None and self._tok_view is not None
            self._tok_view[:n] = tokens
        if self._own_pos is not None:
            # Section-major [p..., p..., p..., 0...], as llama.cpp builds it for text rows.
            self._pos_view[: 3 * n] = np.tile(positions, 3)
            self._pos_view[3 * n : 4 * n] = 0
        else:
            self._pos_view[:n] = positions
        self._nseq_view[:n] = 1
        for i in range(n):
            b.seq_id[i][0] = int(seq_ids[i])
        # Non-last stages need every row of l_out; llama.cpp prunes non-output rows before it.
        self._out_view[:n] = 1 if self.config.capture_hidden else outputs
        self._chunks = []
        if self._cstate is not None:
            self._cstate.written = 0
            self._cstate.overflow = 0
        t0 = time.perf_counter()
        rc = int(LL.llama_decode(self._ctx, b))
        self.last_decode_s = time.perf_counter() - t0
        if rc != 0:
            raise DecodeError(rc)
        if self.config.mtp:
            from core.llama_mtp import read_nextn_rows

            self.nextn_rows = read_nextn_rows(self._ctx, n, self.n_embd)
        if not self.config.capture_hidden:
            self._n_out = int(np.count_nonzero(outputs))
            return self.logits_view().copy()  # one copy, owned by the caller
        if self._cstate is not None and self._capture_buf is not None:
            if self._cstate.overflow or self._cstate.written != n * self.n_embd * 4:
                raise DecodeError(-101)
            computed = self._capture_buf[:n].copy()
        else:
            joined = np.concatenate(self._chunks, axis=0) if self._chunks else None
            if joined is None or joined.shape != (n, self.n_embd):
                raise DecodeError(-101)
            computed = joined
        if self.config.kv_unified:
            return computed
        # A stream per sequence: llama.cpp computed the rows sequence by sequence.
        hidden_out = np.empty_like(computed)
        hidden_out[ubatch_order(seq_ids.tolist(), self.config.n_batch)] = computed
        return hidden_out

    def logits_view(self) -> F32Array:
        """The last decode's logits, one row per output row in batch order, without a copy.

        A read-only view of llama.cpp's own buffer: valid until the next `decode` on this
        engine, so read it (argmax, top-k of each row) on the engine's thread first.
        """
        if self.config.capture_hidden or self._n_out == 0:
            raise ValueError("no logits: this stage returns hidden states, or nothing decoded")
        ptr = LL.llama_get_logits(self._ctx)
        view = np.ctypeslib.as_array(ptr, shape=(self._n_out, self.n_vocab))
        view.flags.writeable = False
        return view

    def argmax_rows(self) -> list[int]:
        """Greedy token of every output row of the last decode (lowest id wins ties)."""
        return [int(i) for i in np.argmax(self.logits_view(), axis=1)]

    def top_k_rows(self, k: int) -> tuple[npt.NDArray[np.int64], F32Array]:
        """The k largest logits of every output row: (ids, values), each (rows, k), by id."""
        view = self.logits_view()
        k = min(k, self.n_vocab)
        ids = np.sort(np.argpartition(view, self.n_vocab - k, axis=1)[:, self.n_vocab - k :])
        return ids, np.take_along_axis(view, ids, axis=1)

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        """Forget positions [p0, p1) of a sequence (p1 = -1: to the end)."""
        return bool(LL.llama_memory_seq_rm(self._mem, seq_id, p0, p1))

    def clear(self) -> None:
        LL.llama_memory_clear(self._mem, True)

    def set_threads(self, n_threads: int) -> None:
        LL.llama_set_n_threads(self._ctx, n_threads, n_threads)

    @property
    def n_threads(self) -> int:
        """Threads a one-row decode runs on (set_threads, or the config's)."""
        return int(LL.llama_n_threads(self._ctx))

    def close(self) -> None:
        """Free the batch, context and model; safe to call twice."""
        if self.mtp_context is not None:
            self.mtp_context.close()
            self.mtp_context = None
        if self._batch is not None:
            if self._batch_pos is not None:
                self._batch.pos = ctypes.cast(self._batch_pos, ctypes.POINTER(ctypes.c_int32))
                self._batch_pos = None
            LL.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            LL.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            LL.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LlamaStageEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- vocabulary only


# Some GGUFs (the default Gemma among them) ship without tokenizer.chat_template;
# llama.cpp's built-in templates are selected by these names.
_BUILTIN_TEMPLATES = (("gemma", "gemma"), ("qwen", "chatml"), ("llama", "llama3"))


class LlamaVocab:
    """Tokenizer and chat template of a GGUF, loaded without its weights."""

    def __init__(self, path: Path) -> None:
        _init_backend()
        mp = LL.llama_model_default_params()
        mp.vocab_only = True
        self._model: Any = LL.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not read the vocabulary of {path}")
        self._vocab = LL.llama_model_get_vocab(self._model)
        self.n_vocab = int(LL.llama_vocab_n_tokens(self._vocab))
        self.bos = int(LL.llama_vocab_bos(self._vocab))
        self.eos = int(LL.llama_vocab_eos(self._vocab))
        # tokenizer.ggml.model "none": llama.cpp makes n_vocab placeholder tokens and
        # aborts the process if asked to tokenize or print one.
        self.has_text = int(LL.llama_vocab_type(self._vocab)) != LL.LLAMA_VOCAB_TYPE_NONE
        self._lock = threading.Lock()

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        if not self.has_text:
            raise TokenizerError(
                "this model has no tokenizer (tokenizer.ggml.model is 'none'): give the "
                "prompt as token ids"
            )
        data = text.encode()
        cap = len(data) + 16
        for _ in range(2):
            buf = (LL.llama_token * cap)()
            with self._lock:
                n = int(
                    LL.llama_tokenize(
                        self._vocab, data, len(data), buf, cap, add_special, parse_special
                    )
                )
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise TokenizerError("tokenization did not converge")

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        self._check(token)
        if not self.has_text:
            return f"<{token}>".encode()  # a placeholder token has no text of its own
        buf = ctypes.create_string_buffer(64)
        with self._lock:
            n = int(LL.llama_token_to_piece(self._vocab, token, buf, 64, 0, special))
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = int(LL.llama_token_to_piece(self._vocab, token, buf, -n, 0, special))
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode(errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(LL.llama_vocab_is_eog(self._vocab, token))

    def architecture(self) -> str:
        return self.metadata("general.architecture") or ""

    def metadata(self, key: str) -> str | None:
        """A scalar GGUF metadata value as llama.cpp prints it (numbers as text), or None."""
        buf = ctypes.create_string_buffer(256)
        n = int(LL.llama_model_meta_val_str(self._model, key.encode(), buf, 256))
        return buf.value.decode(errors="replace") if n >= 0 else None

    def chat_template(self) -> str | None:
        """The GGUF's template, else llama.cpp's built-in one named for the architecture."""
        raw = LL.llama_model_chat_template(self._model, None)
        if raw:
            return str(raw.decode())
        arch = self.architecture()
        for prefix, name in _BUILTIN_TEMPLATES:
            if arch.startswith(prefix):
                return name
        return None

    def apply_chat_template(
        self, messages: list[tuple[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render (role, content) messages with the model's template (llama.cpp built-ins)."""
        template = self.chat_template()
        if template is None:
            raise TokenizerError("the model has no chat template")
        tmpl = template.encode()
        keep = [(r.encode(), c.encode()) for r, c in messages]
        chat = (LL.llama_chat_message * len(keep))()
        for i, (r, c) in enumerate(keep):
            chat[i].role = r
            chat[i].content = c
        cap = 2 * sum(len(c) for _, c in keep) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = int(
                LL.llama_chat_apply_template(tmpl, chat, len(keep), add_generation_prompt, buf, cap)
            )
            if n < 0:
                raise TokenizerError("llama.cpp does not support this model's chat template")
            if n <= cap:
                return buf.raw[:n].decode(errors="replace")
            cap = n
        raise TokenizerError("chat template output did not fit")

    def _check(self, token: int) -> None:
        if not (0 <= token < self.n_vocab):
            raise TokenizerError(f"token {token} outside the vocabulary (0..{self.n_vocab - 1})")

    def close(self) -> None:
        if self._model:
            LL.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
