"""Engine steps for a replay's rows that must each be evaluated alone (`wire.Step.
one_by_one`: a replay's generated tokens, app.session.replay_shapes).

A row evaluated in a llama_decode of its own meets the one-row kernels, as plain
decoding's row did when that token was first computed, so its hidden state (stages
before the last) and its KV are the first run's, bit for bit. The last stage keeps the
logits of the final row only: the replay's next token is chosen from it.

`step_apart` splits an engine step's batch: the steps that want their rows alone are
evaluated after the rest, each row in a decode of its own; the rest go through the
worker's usual path (batched, guesses verified row by row). Runs in the engine thread,
like `Stage.step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from core.stage import Stage, StepFailure, StepRequest, StepResult

T = TypeVar("T")
C = TypeVar("C")
V = TypeVar("V")

Result = StepResult | StepFailure


def rows_one_by_one(stage: Stage, req: StepRequest) -> Result:
    """`stage.step([req])`, but each of its rows in a decode of its own, in order. On a
    failure part-way the rows evaluated stay cached (as a failed multi-row decode's do
    not): the session fails as a whole either way (the worker ends it)."""
    hidden: list[np.ndarray] = []
    nextn: list[np.ndarray] = []
    logits: np.ndarray | None = None
    for j in range(req.n_rows):
        row = StepRequest(
            req.session,
            req.start + j,
            tokens=None if req.tokens is None else req.tokens[j : j + 1],
            hidden=None if req.hidden is None else req.hidden[j : j + 1],
            keep_until=req.keep_until if j == 0 else None,
        )
        (res,) = stage.step([row])
        if isinstance(res, StepFailure):
            return res
        if res.hidden is not None:
            hidden.append(res.hidden)
        if res.nextn is not None:
            nextn.append(res.nextn)
        logits = res.logits  # the last stage: only the final row's are kept
    if stage.spec.is_last:
        return StepResult(
            req.session,
            req.start,
            logits=logits,
            nextn=np.concatenate(nextn) if nextn else None,
        )
    return StepResult(req.session, req.start, hidden=np.concatenate(hidden))


def step_apart(
    items: Sequence[T],
    alone: Callable[[T], bool],
    checks: dict[int, C],
    step_rest: Callable[[list[T], dict[int, C]], tuple[list[Result], dict[int, V]]],
    step_alone: Callable[[T], Result],
) -> tuple[list[Result], dict[int, V]]:
    """Results for `items` in order: those `alone` says so by `step_alone` (after the
    rest), the others in one `step_rest` call with their `checks` (keyed by index in
    `items`, re-keyed for the call and back; an item alone has no checks)."""
    rest = [i for i, item in enumerate(items) if not alone(item)]
    results: list[Result | None] = [None] * len(items)
    verdicts: dict[int, V] = {}
    if rest:
        where = {i: k for k, i in enumerate(rest)}
        sub_checks = {where[i]: c for i, c in checks.items() if i in where}
        out, sub_verdicts = step_rest([items[i] for i in rest], sub_checks)
        for k, i in enumerate(rest):
            results[i] = out[k]
        verdicts = {rest[k]: v for k, v in sub_verdicts.items()}
    for i, item in enumerate(items):
        if results[i] is None:
            results[i] = step_alone(item)
    return [r for r in results if r is not None], verdicts
