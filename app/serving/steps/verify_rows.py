"""Engine steps when some sessions carry guesses. The last stage: the head only where it
can still matter (`step_verifying`); the stages before it: guessed rows one at a time
(`step_guesses_alone`), so guessing never changes an answer.

Measured (bench/guess_trips.py, Gemma 3 270M on this machine's CPU): the last stage's
layers cost about the same for 1 or 5 rows, but the output head over 262 144 tokens
costs ~30 ms of CPU per output row, 130 ms for 3-5 rows; so a trip with 4 guesses spent
most of its extra time computing logits for rows after the first wrong guess, which
are thrown away. Here a guessed session's rows are evaluated up to and including its
first guess row with logits for that row only (it joins the batch with everyone else),
and each further row is evaluated alone only while the guesses before it stood
(`core.guess_acceptance.RowByRow` decides). Rows never evaluated here are rows the next
step's `keep_until` would have cut anyway, so this stage's cache ends exactly where
every other stage's will after the cut.

A one-row evaluation of a guessed row is also what plain decoding does on this stage,
so its logits are the plain run's (no multi-row kernel near-ties on the head).

Runs in the engine thread, like `Stage.step`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from core.guess_acceptance import RowByRow, Verdict
from core.stage import Stage, StepFailure, StepRequest, StepResult


def _rows(req: StepRequest, a: int, b: int) -> StepRequest:
    return StepRequest(
        req.session,
        req.start + a,
        tokens=None if req.tokens is None else req.tokens[a:b],
        hidden=None if req.hidden is None else req.hidden[a:b],
    )


def step_verifying(
    stage: Stage, requests: list[StepRequest], checks: dict[int, tuple[int, RowByRow]]
) -> tuple[list[StepResult | StepFailure], dict[int, Verdict]]:
    """`Stage.step(requests)`, except that request i in `checks` (with its number of
    guesses, the last rows) is verified row by row. Returns the results (a verified
    request's logits: the rows evaluated, in order) and each verified request's verdict."""
    first: list[StepRequest] = []
    for i, req in enumerate(requests):
        if i in checks and checks[i][0] > 0:
            k = checks[i][0]
            head = _rows(req, 0, req.n_rows - k)  # everything up to the first guess's row
            first.append(replace(head, keep_until=req.keep_until))
        else:
            first.append(req)
    results = stage.step(first)
    verdicts: dict[int, Verdict] = {}
    for i, (k, check) in checks.items():
        res = results[i]
        if isinstance(res, StepFailure) or k == 0:
            continue
        req = requests[i]
        assert res.logits is not None
        rows = [res.logits[-1]]
        nextn = [] if res.nextn is None else [res.nextn]  # an MTP head's input, kept
        verdict = check.feed(rows[0])
        j = req.n_rows - k
        while verdict is None:
            (more,) = stage.step([_rows(req, j, j + 1)])
            if isinstance(more, StepFailure):
                results[i] = more
                break
            assert more.logits is not None
            rows.append(more.logits[-1])
            if more.nextn is not None:
                nextn.append(more.nextn)
            verdict = check.feed(rows[-1])
            j += 1
        else:
            results[i] = StepResult(
                req.session,
                req.start,
                logits=np.stack(rows),
                nextn=np.concatenate(nextn) if nextn else None,
            )
            verdicts[i] = verdict
    return results, verdicts


def step_guesses_alone(
    stage: Stage, requests: list[StepRequest], guessed: dict[int, int]
) -> list[StepResult | StepFailure]:
    """`Stage.step(requests)` on a stage before the last, except that request i in
    `guessed` (with its number of guesses, the last rows) has its guessed rows evaluated
    one at a time after the others: each row then meets the same kernels as in plain
    decoding, so the hidden states it sends on are plain decoding's, bit for bit."""
    first = [
        replace(_rows(req, 0, req.n_rows - guessed[i]), keep_until=req.keep_until)
        if guessed.get(i, 0) > 0
        else req
        for i, req in enumerate(requests)
    ]
    results = stage.step(first)
    for i, k in guessed.items():
        res, req = results[i], requests[i]
        if isinstance(res, StepFailure) or k <= 0:
            continue
        assert res.hidden is not None
        parts = [res.hidden]
        for j in range(req.n_rows - k, req.n_rows):
            (more,) = stage.step([_rows(req, j, j + 1)])
            if isinstance(more, StepFailure):
                results[i] = more
                break
            assert more.hidden is not None
            parts.append(more.hidden)
        else:
            results[i] = StepResult(req.session, req.start, hidden=np.concatenate(parts))
    return results
