"""A checker's side of a spot check: another stage's record of a session's prefix,
recomputed on this stage's own engine (same layers) in a sequence of its own, each step
as the checked stage computed it (app.serving.steps.batch.StageSteps), and the digest of
each step's output rows. Runs on the engine thread.
"""

from __future__ import annotations

import numpy as np

from app.serving.session_records import PendingStep
from app.serving.steps.batch import StageSteps, step_request
from coordinator.spot_checks import TOKENS, CheckDigests, CheckRecord, CheckStep, digest
from core.errors import CoreError
from core.stage import StepFailure
from net import wire
from net.errors import FrameError
from net.wire.tensors import WireDtype, encode_rows


def _frame(session: str, s: CheckStep) -> wire.Step:
    """The step the checked stage took, rebuilt from its record."""
    tokens: tuple[int, ...] = ()
    if s.kind == TOKENS:
        tokens = tuple(int(t) for t in np.frombuffer(s.rows, dtype="<i4"))
    return wire.Step(
        session=session,
        step_id=s.step_id,
        start=s.start,
        tokens=tokens,
        hidden=None if s.kind == TOKENS else s.rows,
        n_rows=s.n_rows,
        width=s.width,
        wire_dtype=WireDtype(s.wire_dtype),
        # Only their count matters before the last stage: each guessed row alone.
        guesses=tokens[len(tokens) - s.guesses :] if s.guesses and tokens else (0,) * s.guesses,
        keep_until=None if s.keep_until < 0 else s.keep_until,
        one_by_one=s.one_by_one,
    )


def recompute(steps: StageSteps, record: CheckRecord, session: str) -> CheckDigests:
    """Each step of `record` on a fresh `session` of this stage, the output digests in
    order; `refused` says why not (a step this stage cannot take, no free slot)."""
    stage = steps.stage
    if stage.spec.is_last:
        return CheckDigests(refused="the last stage's answer is not checked")
    try:
        stage.open(session)
    except CoreError as exc:
        return CheckDigests(refused=f"no room to recompute: {exc}")
    found: list[str] = []
    try:
        for s in record.steps:
            try:
                frame = _frame(session, s)
                request = step_request(frame, stage.spec.is_first, stage.engine.n_embd)
            except (FrameError, ValueError) as exc:
                return CheckDigests(tuple(found), f"step {s.step_id} does not fit: {exc}")
            results, _ = steps.run([PendingStep(frame, request, 0.0)], {})
            result = results[0]
            if isinstance(result, StepFailure) or result.hidden is None:
                why = result.error if isinstance(result, StepFailure) else "no rows"
                return CheckDigests(tuple(found), f"step {s.step_id} failed: {why}")
            found.append(digest(encode_rows(result.hidden, WireDtype(s.out_dtype))))
    finally:
        stage.close(session)
    return CheckDigests(tuple(found))
