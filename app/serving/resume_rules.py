"""Which rows of a replay a stage must compute: pure functions, no IO, no engine.

When a stage dies mid-answer the client replays the session's tokens so far (prompt +
generated) through a new chain (app.client.recovery). The replay is a new session on
every stage, but its OPEN names the session it continues (`resumes`), how many
positions the client expects a surviving stage to hold (`resume_held`, the history
but its final token) and a digest of their token ids. The last stage still holds that
session when the route kept it (its upstream died, not it): instead of computing all
the replayed rows again it takes the old session's KV over under the new id and
computes only the rows from `resume_held` on (the final one, whose logits choose the
next token). Stages before the replacement, and the replacement, hold nothing usable
and compute everything, as a plain replay.

Why only the last stage: a stage that kept its KV does not compute the rows it skips,
so it has no hidden states to send further down; a stage after it would then have to
hold them too, and one that does not (it restarted) would be fed a gap. On the last
stage nothing comes after, and it is the stage every reroute around a middle stage
keeps. A middle stage downstream of the replacement (chains of four or more) replays
everything, as before.

What keeps the KV consistent and the adoption safe:

    check                                      else
    -----------------------------------------  -----------------------------------------
    the resumed session is open here           a plain new session (the stage restarted,
                                               or its resume grace ran out)
    same client (reply_to) and model           a plain new session; the old one is left
                                               alone (someone else's, or another model)
    this stage may cut its cache (no MTP head,  a plain new session (the worker gives
      no recurrent layers)                       the rules no histories to check)
    it holds >= resume_held positions whose    a plain new session; the old one is left
      token ids hash to resume_digest            alone (a history that differs keeps
                                               nothing of it)

The digest binds the old session's id, so only a party that knows both the session id
(random, known to the client and the stages it chose) and the exact token history can
take a session over, and the tokens still go to the same client whose link the last
stage already checks. Positions below `resume_held` were computed along the old chain,
the rest along the new one; both chains run the same layers on the same tokens, so the
cache is the one an uninterrupted run would hold (greedy output equal token for token).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.replay_resume import history_digest
from net import wire


@dataclass(frozen=True)
class HeldSession:
    """What the last stage knows of the session a replay names."""

    open: wire.Open
    history: Sequence[int]
    """Token ids at the positions its KV holds, in order."""


def positions_kept(new: wire.Open, old: HeldSession | None) -> int:
    """How many positions of `old`'s KV the new session `new` takes over (0: none, open
    it as a plain new session). See the module's table."""
    if not new.resumes or old is None:
        return 0
    if old.open.session != new.resumes:
        return 0
    if old.open.reply_to != new.reply_to or old.open.model != new.model:
        return 0
    held = new.resume_held
    if not 0 < held < new.prompt_len or len(old.history) < held:
        return 0
    mine = history_digest(old.open.session, old.history[:held])
    if not hmac.compare_digest(mine, new.resume_digest):
        return 0
    return held


def rows_to_skip(kept: int, start: int, n_rows: int) -> int:
    """Of a step's rows at positions [start, start + n_rows), how many lead ones the
    stage holds already (positions below `kept`): 0..n_rows."""
    return max(0, min(n_rows, kept - start))


def trimmed(step: wire.Step, skip: int) -> wire.Step:
    """`step` without its first `skip` rows (0 < skip < n_rows): the same session and
    step id, from position start + skip. Hidden rows are cut on their byte boundary;
    the tokens naming those positions go with them."""
    if not 0 < skip < step.n_rows:
        raise ValueError(f"skip {skip} outside 1..{step.n_rows - 1}")
    hidden = step.hidden
    if hidden is not None:
        row_bytes = len(hidden) // step.n_rows
        hidden = hidden[skip * row_bytes :]
    tokens = step.tokens[skip:] if len(step.tokens) == step.n_rows else step.tokens
    return replace(
        step, start=step.start + skip, tokens=tokens, hidden=hidden, n_rows=step.n_rows - skip
    )
