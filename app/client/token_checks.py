"""The client's checks of a TOKENS reply against the step it answers: pure, no IO.

The last stage chooses every token, so a dishonest or broken one can answer anything;
what the client can hold it to is what it asked for. A reply must carry at least one
token and at most the step's guesses plus one, accept as many guesses as it says
(`n_accepted` is its tokens less one; for a step the client built, its guess tracker
checks these two, app.session.guess_tracker), stay within the answer's `max_tokens`,
and name token ids of the model's vocabulary. Where the stage returns the logits row of
the newest token (a diagnostic setting) and no repetition penalty changes them, a
greedy answer's first token must be that row's argmax and a top-k one's among its k
best.

What passes these can still be a wrong answer of the right form: spot checks of
answers by a trusted node are what catch those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core.sampling import greedy
from core.types import SamplingParams
from net import wire


@dataclass(frozen=True)
class Asked:
    """What the client asked of the step a TOKENS answers."""

    carried: int
    """Guesses the step carried (the client's, or the ring's as the reply says)."""
    room: int
    """Tokens the answer may still take (`max_tokens` less those received)."""
    sampling: SamplingParams
    round_the_ring: bool = False
    """The last stage built the step (the ring) and chose its guesses; otherwise the
    client's guess tracker counts the reply's tokens against its own guesses."""
    vocab_size: int | None = None
    """The model's vocabulary (token ids below it); None: not known here."""


def tokens_problem(
    frame: wire.Tokens, asked: Asked, logits: npt.NDArray[np.float32] | None = None
) -> str | None:
    """Why `frame` cannot answer the step `asked`, None when nothing is wrong with it."""
    tokens = frame.tokens
    if not tokens:
        return "no token"
    if asked.round_the_ring:  # a step the client built: its guess tracker counts these
        if len(tokens) > asked.carried + 1:
            return f"{len(tokens)} tokens for a step of {asked.carried} guesses"
        if frame.n_accepted != len(tokens) - 1:
            return f"{len(tokens)} tokens but {frame.n_accepted} guesses accepted"
    if len(tokens) > asked.room:
        return f"{len(tokens)} tokens where {asked.room} were left of max_tokens"
    vocab = asked.vocab_size
    if vocab is not None:
        outside = [t for t in tokens if not 0 <= t < vocab]
        if outside:
            return f"token {outside[0]} outside the vocabulary of {vocab}"
    return _sampling_problem(tokens[0], asked.sampling, logits)


def _sampling_problem(
    token: int, params: SamplingParams, logits: npt.NDArray[np.float32] | None
) -> str | None:
    """What the logits row of the newest token says of the first token chosen."""
    penalised = params.repetition_penalty != 1.0 and params.repetition_window > 0
    if logits is None or penalised or not 0 <= token < logits.size:
        return None
    if not np.isfinite(logits).all():
        return "logits that are not finite"
    if params.greedy:
        best = greedy(logits)
        if token != best:
            return f"token {token} is not the greedy choice {best}"
    elif 0 < params.top_k < logits.size:
        above = int(np.count_nonzero(logits > logits[token]))
        if above >= params.top_k:
            return f"token {token} is not among the top {params.top_k}"
    return None
