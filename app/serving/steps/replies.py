"""What a stage sends on after its step: to the next stage, the STEP with its rows
replaced by this stage's output; on the last stage, the tokens chosen from the logits
(sampled, or the guesses that stood) as a TOKENS reply. No IO: the worker sends them."""

from __future__ import annotations

import numpy as np

from app.serving.session_records import ServedSession
from core.guess_acceptance import Verdict, accept_guesses
from core.sampling import sample
from net import wire
from net.wire.tensors import WireDtype, encode_rows


def onward_step(
    step: wire.Step,
    hidden: np.ndarray,
    dtype: WireDtype,
    timings: tuple[wire.StageTiming, ...],
) -> wire.Step:
    """The step for the next stage: the same session, positions, tokens and guesses,
    this stage's hidden rows, and the timings so far with this stage's own."""
    return wire.Step(
        session=step.session,
        step_id=step.step_id,
        start=step.start,
        tokens=step.tokens,
        hidden=encode_rows(hidden, dtype),
        n_rows=hidden.shape[0],
        width=hidden.shape[1],
        wire_dtype=dtype,
        guesses=step.guesses,
        keep_until=step.keep_until,
        timings=timings,
        sent_at_ns=step.sent_at_ns,
        one_by_one=step.one_by_one,
    )


def choose_tokens(
    session: ServedSession, step: wire.Step, logits: np.ndarray, verdict: Verdict | None
) -> list[int] | None:
    """Last stage: the tokens this step yields, None for a prompt chunk before the last.
    The session's history takes the step's tokens (cut back first where the step says
    guesses after `keep_until` fell) and its count of generated tokens the chosen ones."""
    if step.keep_until is not None:
        del session.history[step.keep_until :]
    session.history.extend(step.tokens)
    if step.start + step.n_rows < session.open.prompt_len:
        return None
    assert session.rng is not None and session.params is not None
    params = session.params
    guesses = step.guesses
    if guesses:
        # Row j's logits predict what follows row j: the last len(guesses)+1 rows decide;
        # the penalty's history must not yet hold the guesses under test.
        if verdict is None:  # verified here from all rows' logits
            verdict = accept_guesses(
                logits[-(len(guesses) + 1) :],
                guesses,
                params,
                session.rng,
                session.history[: len(session.history) - len(guesses)],
            )
        room = max(1, session.open.max_tokens - session.generated)
        chosen = list(verdict.tokens[:room])
    else:
        chosen = [sample(logits[-1], params, session.rng, session.history)]
    session.generated += len(chosen)
    return chosen


def tokens_reply(
    session: ServedSession,
    step: wire.Step,
    chosen: list[int],
    logits: np.ndarray,
    timings: tuple[wire.StageTiming, ...],
    return_logits: bool,
) -> wire.Tokens:
    """The TOKENS reply for `chosen` (after `choose_tokens` counted them); with
    `return_logits`, the logits row that followed the newest token rides along."""
    diagnostics = b""
    if return_logits:
        row = logits[0] if step.guesses else logits[-1]
        diagnostics = row.astype(np.float32).tobytes()
    return wire.Tokens(
        session=step.session,
        step_id=step.step_id,
        tokens=tuple(chosen),
        guesses=(),
        n_accepted=len(chosen) - 1,
        finished=session.generated >= session.open.max_tokens,
        timings=timings,
        logits_sample=diagnostics,
    )
