"""A stage: sessions mapped to sequence slots, and batched evaluation of their rows.

`Stage.step` takes requests from many sessions, checks each one on its own (unknown
session, wrong kind or width of rows, positions not continuing the cache, context
full), evaluates all valid rows together in as few `llama_decode` calls as the batch
size allows, and returns one result or one typed failure per request. A bad request
never disturbs the others.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from core.errors import (
    ContextFullError,
    CoreError,
    DecodeError,
    DuplicateSessionError,
    InputShapeError,
    PositionError,
    StageFullError,
    UnknownSessionError,
)
from core.mtp_head import MtpGuesser
from core.types import StageSpec

F32Array = npt.NDArray[np.float32]
I32Array = npt.NDArray[np.int32]


class Engine(Protocol):
    """What a stage needs from llama.cpp; `LlamaStageEngine` is the real one."""

    n_embd: int
    n_vocab: int

    def decode(
        self,
        positions: I32Array,
        seq_ids: I32Array,
        outputs: npt.NDArray[np.bool_],
        tokens: I32Array | None = None,
        hidden: F32Array | None = None,
    ) -> F32Array: ...

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class StepRequest:
    """Rows of one session: tokens (first stage) or hidden states, from position `start`."""

    session: str
    start: int
    tokens: I32Array | None = None
    hidden: F32Array | None = None
    all_logits: bool = False
    """Last stage: logits for every row (guess verification) instead of the last one only."""
    keep_until: int | None = None
    """Before evaluating, forget every cached position >= keep_until (rejected guesses)."""

    @property
    def n_rows(self) -> int:
        rows = self.tokens if self.tokens is not None else self.hidden
        return 0 if rows is None else len(rows)


@dataclass(frozen=True)
class StepResult:
    session: str
    start: int
    hidden: F32Array | None = None
    """Non-last stages: one row per input row."""
    logits: F32Array | None = None
    """Last stage: one row per requested output (the last row, or all with all_logits)."""
    nextn: F32Array | None = None
    """Last stage with an MTP head: the trunk's h_nextn, one row per input row."""


@dataclass(frozen=True)
class StepFailure:
    session: str
    error: CoreError


@dataclass
class _SessionSlot:
    slot: int
    n_past: int = 0


@dataclass
class StageStats:
    decodes: int = 0
    rows: int = 0
    failures: int = 0
    per_decode_rows: list[int] = field(default_factory=list)
    undos: int = 0
    """Rollbacks that cut the cache (rejected guesses: keep_until below its end)."""
    undo_ms: float = 0.0
    """Time spent in those rollbacks, in total."""


class Stage:
    """One stage of the pipeline; not thread-safe: one caller (the worker's engine thread)."""

    def __init__(self, engine: Engine, spec: StageSpec) -> None:
        self.engine = engine
        self.spec = spec
        self._sessions: dict[str, _SessionSlot] = {}
        # The lowest free slot first: live sessions keep to the lowest slots, so the ones
        # stepping together tend to be consecutive, which llama.cpp computes in one
        # micro-batch (core.ubatch_order).
        self._free_slots = list(range(spec.n_seq_max))
        self.stats = StageStats()
        self.mtp: MtpGuesser | None = None
        """The model's MTP head, on a last stage whose file carries one."""
        context = getattr(engine, "mtp_context", None)
        if context is not None:
            self.mtp = MtpGuesser(context, spec.n_seq_max, spec.n_batch)

    @classmethod
    def from_file(cls, path: Path, spec: StageSpec, c_callback: bool = True) -> Stage:
        from core.backends import batch_variant
        from core.gguf_slices import has_mtp_block
        from core.llama_engine import EngineConfig, LlamaStageEngine

        config = EngineConfig(
            n_ctx=spec.n_ctx,
            n_batch=spec.n_batch,
            n_seq_max=spec.n_seq_max,
            n_threads=spec.n_threads,
            capture_hidden=not spec.is_last,
            embd_input=not spec.is_first,
            c_callback=c_callback,
            use_gpu=spec.use_gpu,
            device_cap_bytes=spec.device_cap_bytes,
            # a stream per session: its cells where they would be alone
            kv_unified=batch_variant(),
            mtp=spec.is_last and has_mtp_block(path),
        )
        return cls(LlamaStageEngine(path, config), spec)

    # ------------------------------------------------------------ sessions

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    def open(self, session: str) -> None:
        if session in self._sessions:
            raise DuplicateSessionError(session, "already open on this stage")
        if not self._free_slots:
            raise StageFullError(session, f"all {self.spec.n_seq_max} sequence slots are in use")
        slot = heapq.heappop(self._free_slots)
        self.engine.seq_rm(slot, 0, -1)
        self._sessions[session] = _SessionSlot(slot)
        if self.mtp is not None:
            self.mtp.open(session)

    def close(self, session: str) -> None:
        s = self._get(session)
        self.engine.seq_rm(s.slot, 0, -1)
        if self.mtp is not None:
            self.mtp.close(session)
        del self._sessions[session]
        heapq.heappush(self._free_slots, s.slot)

    def n_past(self, session: str) -> int:
        return self._get(session).n_past

    def rollback(self, session: str, keep_until: int) -> None:
        """Forget positions >= keep_until; the continuation equals never having seen them."""
        s = self._get(session)
        if not (0 <= keep_until <= s.n_past):
            raise PositionError(session, f"keep_until {keep_until} outside 0..{s.n_past}")
        if keep_until < s.n_past:
            started = time.perf_counter()
            cut = self.engine.seq_rm(s.slot, keep_until, -1)
            self.stats.undo_ms += (time.perf_counter() - started) * 1e3
            self.stats.undos += 1
            if not cut:  # a recurrent cache without enough snapshots cannot step back
                raise PositionError(session, f"this stage cannot cut its cache at {keep_until}")
            s.n_past = keep_until

    def adopt(self, old: str, new: str, keep_until: int) -> None:
        """Rename session `old` to `new`, keeping its first `keep_until` positions (a
        replay after a reroute continues it: app.serving.rules.resume). Raises, leaving
        `old` as it was, when `new` is open or the cache cannot be cut there."""
        if new in self._sessions:
            raise DuplicateSessionError(new, "already open on this stage")
        if self.mtp is not None:  # the head's own cache is keyed by the session too
            raise PositionError(old, "a stage with an MTP head does not hand its cache over")
        self.rollback(old, keep_until)
        self._sessions[new] = self._sessions.pop(old)

    def _get(self, session: str) -> _SessionSlot:
        try:
            return self._sessions[session]
        except KeyError:
            raise UnknownSessionError(session, "not open on this stage") from None

    # ------------------------------------------------------------ evaluation

    def _validate(self, req: StepRequest, expected: dict[str, int]) -> None:
        s = self._get(req.session)
        n = req.n_rows
        if n == 0:
            raise InputShapeError(req.session, "no rows")
        if self.spec.is_first:
            if req.tokens is None or req.hidden is not None:
                raise InputShapeError(req.session, "the first stage takes tokens only")
            tok = req.tokens
            if tok.ndim != 1 or tok.min() < 0 or tok.max() >= self.engine.n_vocab:
                raise InputShapeError(
                    req.session, f"token ids must lie in 0..{self.engine.n_vocab - 1}"
                )
        else:
            if req.hidden is None or req.tokens is not None:
                raise InputShapeError(req.session, "this stage takes hidden states only")
            if req.hidden.ndim != 2 or req.hidden.shape[1] != self.engine.n_embd:
                raise InputShapeError(
                    req.session,
                    f"hidden rows have shape {req.hidden.shape}, need (n, {self.engine.n_embd})",
                )
            if not np.isfinite(req.hidden).all():
                raise InputShapeError(req.session, "hidden states contain NaN or infinity")
        n_past = expected.get(req.session, s.n_past)
        if req.keep_until is not None:
            if not (0 <= req.keep_until <= n_past):
                raise PositionError(req.session, f"keep_until {req.keep_until} outside 0..{n_past}")
            n_past = req.keep_until
        if req.start != n_past:
            raise PositionError(
                req.session, f"rows start at {req.start}, the cache ends at {n_past}"
            )
        if req.start + n > self.spec.session_ctx:
            raise ContextFullError(
                req.session,
                f"positions up to {req.start + n} exceed the context of {self.spec.session_ctx}",
            )
        expected[req.session] = req.start + n

    def step(self, requests: list[StepRequest]) -> list[StepResult | StepFailure]:
        """Evaluate many sessions' rows together; one result or failure per request."""
        results: list[StepResult | StepFailure | None] = [None] * len(requests)
        valid: list[int] = []
        expected: dict[str, int] = {}
        for i, req in enumerate(requests):
            try:
                self._validate(req, expected)
            except CoreError as exc:
                results[i] = StepFailure(req.session, exc)
                self.stats.failures += 1
                continue
            valid.append(i)
        for i in list(valid):  # apply rollbacks only once every request is known to be valid
            req = requests[i]
            if req.keep_until is not None:
                try:
                    self.rollback(req.session, req.keep_until)
                except CoreError as exc:
                    results[i] = StepFailure(req.session, exc)
                    self.stats.failures += 1
                    valid.remove(i)
        for chunk in self._chunks([requests[i] for i in valid], valid):
            for i, out in zip(chunk, self._evaluate([requests[i] for i in chunk]), strict=True):
                results[i] = out
        return [r for r in results if r is not None]

    def _chunks(self, reqs: list[StepRequest], idx: list[int]) -> list[list[int]]:
        """Group requests into decodes of at most n_batch rows, keeping request order."""
        chunks: list[list[int]] = []
        rows = 0
        seen: set[str] = set()
        for req, i in zip(reqs, idx, strict=True):
            # Reproducible: one session per decode, so its rows meet nobody else's. Hybrid
            # recurrent models too: their memory reorders a multi-sequence batch's rows.
            alone = self.spec.reproducible or getattr(self.engine, "one_sequence_per_decode", False)
            # A session's prompt chunks each in a decode of their own, however many came
            # at once: its rows' shapes are its chunks, which a replay can repeat exactly
            # (app.session.replay_shapes).
            again = req.session in seen
            if not chunks or rows + req.n_rows > self.spec.n_batch or alone or again:
                chunks.append([])
                rows = 0
                seen = set()
            chunks[-1].append(i)
            seen.add(req.session)
            rows += req.n_rows
        # By sequence slot: llama.cpp computes a run of consecutive slots in one
        # micro-batch (core.ubatch_order), so sorted rows batch as far as slots allow.
        slot_of = {i: self._sessions[req.session].slot for req, i in zip(reqs, idx, strict=True)}
        return [sorted(chunk, key=slot_of.__getitem__) for chunk in chunks]

    def _evaluate(self, reqs: list[StepRequest]) -> list[StepResult | StepFailure]:
        total = sum(r.n_rows for r in reqs)
        if total > self.spec.n_batch:  # a single oversized request: split its rows
            return [self._evaluate_long(reqs[0])]
        positions = np.concatenate(
            [np.arange(r.start, r.start + r.n_rows, dtype=np.int32) for r in reqs]
        )
        seq_ids = np.concatenate(
            [np.full(r.n_rows, self._sessions[r.session].slot, dtype=np.int32) for r in reqs]
        )
        outputs = np.zeros(total, dtype=np.bool_)
        offsets = np.cumsum([0] + [r.n_rows for r in reqs])
        for r, a, b in zip(reqs, offsets[:-1], offsets[1:], strict=True):
            outputs[a:b] = r.all_logits
            outputs[b - 1] = True
        tokens = hidden = None
        if self.spec.is_first:
            tokens = np.concatenate([r.tokens for r in reqs if r.tokens is not None]).astype(
                np.int32
            )
        else:
            hidden = np.concatenate([r.hidden for r in reqs if r.hidden is not None]).astype(
                np.float32, copy=False
            )
        try:
            out = self.engine.decode(positions, seq_ids, outputs, tokens=tokens, hidden=hidden)
        except DecodeError as exc:
            for r in reqs:  # leave every session exactly as it was before this decode
                self.engine.seq_rm(self._sessions[r.session].slot, r.start, -1)
            self.stats.failures += len(reqs)
            return [StepFailure(r.session, exc) for r in reqs]
        self.stats.decodes += 1
        self.stats.rows += total
        self.stats.per_decode_rows.append(total)
        results: list[StepResult | StepFailure] = []
        out_offsets = np.cumsum([0] + [int(outputs[a:b].sum()) for a, b in pairwise(offsets)])
        nextn = getattr(self.engine, "nextn_rows", None) if self.mtp is not None else None
        for k, r in enumerate(reqs):
            self._sessions[r.session].n_past = r.start + r.n_rows
            if self.spec.is_last:
                results.append(
                    StepResult(
                        r.session,
                        r.start,
                        logits=out[out_offsets[k] : out_offsets[k + 1]],
                        nextn=None if nextn is None else nextn[offsets[k] : offsets[k + 1]],
                    )
                )
            else:
                results.append(
                    StepResult(r.session, r.start, hidden=out[offsets[k] : offsets[k + 1]])
                )
        return results

    def _evaluate_long(self, req: StepRequest) -> StepResult | StepFailure:
        """A request with more rows than one batch: evaluate it in consecutive slices."""
        parts: list[F32Array] = []
        nextn_parts: list[F32Array] = []
        start = req.start
        nb = self.spec.n_batch
        for a in range(0, req.n_rows, nb):
            piece = StepRequest(
                req.session,
                start + a,
                tokens=None if req.tokens is None else req.tokens[a : a + nb],
                hidden=None if req.hidden is None else req.hidden[a : a + nb],
                all_logits=req.all_logits,
            )
            (res,) = self._evaluate([piece])
            if isinstance(res, StepFailure):
                self.engine.seq_rm(self._sessions[req.session].slot, start, -1)
                self._sessions[req.session].n_past = start
                return res
            arr = res.logits if self.spec.is_last else res.hidden
            assert arr is not None
            if res.nextn is not None:
                nextn_parts.append(res.nextn)
            if self.spec.is_last and not req.all_logits and a + nb < req.n_rows:
                continue  # only the final slice's last row is wanted
            parts.append(arr)
        joined = np.concatenate(parts)
        if self.spec.is_last:
            nextn = np.concatenate(nextn_parts) if nextn_parts else None
            return StepResult(req.session, start, logits=joined, nextn=nextn)
        return StepResult(req.session, start, hidden=joined)

    def shutdown(self) -> None:
        """Free native memory (model, context, batch)."""
        self.engine.close()
        self._sessions.clear()
