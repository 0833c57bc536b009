"""A worker's engine steps: the request a STEP frame makes, and the batch evaluated.

`step_request` checks a frame's rows against the stage and turns them into the engine's
request (on the event loop, no IO). `StageSteps.run` evaluates a batch on the engine
thread, choosing how: a replay's rows one at a time (app.serving.steps.replay_rows), the last
stage's guesses row by row (app.serving.steps.verify_rows), a non-last stage's guessed rows
each as plain decoding computes them, or everything in one `Stage.step`; then it feeds
the MTP head where the last stage has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from app.serving.session_records import PendingStep, ServedSession
from app.serving.steps.mtp_guesses import observe_results
from app.serving.steps.replay_rows import rows_one_by_one, step_apart
from app.serving.steps.verify_rows import step_guesses_alone, step_verifying
from core.guess_acceptance import RowByRow, Verdict
from core.stage import Stage, StepFailure, StepRequest, StepResult
from net import wire
from net.errors import ErrorCode, FrameError
from net.wire.tensors import WireDtype, decode_rows

Checks = dict[int, tuple[int, RowByRow]]
"""Per index in a batch: how many guesses its step carries, and their verifier."""


def step_request(frame: wire.Step, is_first: bool, n_embd: int) -> StepRequest:
    """The engine request for a STEP's rows; FrameError when they do not fit the stage
    (tokens to a later stage, hidden rows to the first or of another width)."""
    if is_first:
        if frame.hidden is not None:
            raise FrameError(ErrorCode.BAD_SHAPE, "the first stage takes tokens")
        return StepRequest(
            frame.session,
            frame.start,
            tokens=np.asarray(frame.tokens, dtype=np.int32),
            all_logits=bool(frame.guesses),
            keep_until=frame.keep_until,
        )
    if frame.hidden is None or frame.width != n_embd:
        raise FrameError(ErrorCode.BAD_SHAPE, f"this stage takes hidden rows of width {n_embd}")
    rows = decode_rows(frame.hidden, WireDtype(frame.wire_dtype), frame.n_rows, frame.width)
    return StepRequest(
        frame.session,
        frame.start,
        hidden=rows,
        all_logits=bool(frame.guesses),
        keep_until=frame.keep_until,
    )


def guess_checks(batch: list[PendingStep], sessions: Mapping[str, ServedSession]) -> Checks:
    """Last stage: row-by-row verifiers for the batch's steps that carry guesses."""
    checks: Checks = {}
    for i, p in enumerate(batch):
        session = sessions.get(p.step.session)
        guesses = p.step.guesses
        if not guesses or session is None or session.rng is None or session.params is None:
            continue
        # The penalty's history as the reply will hold it, without the guesses.
        history = [*session.history[: p.step.keep_until], *p.step.tokens[: -len(guesses)]]
        checks[i] = (len(guesses), RowByRow(guesses, session.params, session.rng, history))
    return checks


@dataclass(frozen=True)
class StageSteps:
    """How one stage evaluates batches; `run` and what it calls run on the engine thread."""

    stage: Stage
    exact_guesses: bool
    """Non-last stages: evaluate guessed rows one at a time (WorkerConfig.exact_guesses)."""
    recurrent: bool
    """Recurrent layers undo a cut from per-token snapshots of one decode only, so their
    guessed rows stay in one decode (exact_guesses does not apply)."""

    def run(
        self, batch: list[PendingStep], checks: Checks
    ) -> tuple[list[StepResult | StepFailure], dict[int, Verdict]]:
        if any(p.step.one_by_one for p in batch):  # a replay's rows, each alone (replay_rows)
            return step_apart(batch, lambda p: p.step.one_by_one, checks, self.run, self._alone)
        requests = [p.request for p in batch]
        verdicts: dict[int, Verdict] = {}
        is_last = self.stage.spec.is_last
        guessed = (
            {i: len(p.step.guesses) for i, p in enumerate(batch) if p.step.guesses}
            if self.exact_guesses and not is_last and not self.recurrent
            else {}
        )
        if checks:  # guesses: the head only for rows that can still matter
            results, verdicts = step_verifying(self.stage, requests, checks)
        elif guessed:  # each guessed row as plain decoding computes it
            results = step_guesses_alone(self.stage, requests, guessed)
        else:
            results = self.stage.step(requests)
        if self.stage.mtp is not None:
            observe_results(self.stage.mtp, [p.step for p in batch], results)
        return results, verdicts

    def _alone(self, p: PendingStep) -> StepResult | StepFailure:
        """A step whose rows go one at a time (replay_rows)."""
        result = rows_one_by_one(self.stage, p.request)
        if self.stage.mtp is not None:
            observe_results(self.stage.mtp, [p.step], [result])
        return result
