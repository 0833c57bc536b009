"""Which rows of a replay a stage must compute: pure functions, no IO, no engine.

When a stage dies mid-answer the client replays the session's tokens so far (prompt +
generated) through a new chain (app.client.recovery). The replay is a new session on
every stage, but its OPEN names the session it continues (`resumes`), how many
positions the client expects a surviving stage to hold (`resume_held`, the history
but its final token), a digest of their token ids, and the first layer whose stage may
take it over (`resume_from_layer`). A stage from that layer on still holds the old
session (the route kept it and its upstream died, not it): instead of computing all the
replayed rows again it takes the old session's KV over under the new id and computes
only the rows from `resume_held` on, and a stage that is not the last forwards only
those. Stages before that layer (the replacement, and those upstream of it) hold
nothing usable for the new chain, or must feed it every row: they compute everything,
as a plain replay.

Why a layer the client names: a stage that kept its KV does not compute the rows it
skips, so it has no hidden states to send further down; every stage after it must hold
them too. Only the client knows which stages of the new route served the same layers on
the old one, so it names the first layer of the longest run of such stages that ends
the chain (app.client.recovery.first_layer_to_adopt). Without the field (a client before
it) only the last stage adopts: nothing comes after it. Should a stage after the named
layer hold nothing after all (it restarted unnoticed, its grace ran out) it is fed a gap
and answers MISSING_POSITIONS: the client replays again, and the stages that adopted
dropped the old session with the failed replay, so that replay computes everything.

What keeps the KV consistent and the adoption safe:

    check                                      else
    -----------------------------------------  -----------------------------------------
    the stage starts at or after               a plain new session (it must feed every
      resume_from_layer (absent: it is last)     row to a stage after it that is new)
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

from app.session.replay_resume import history_digest
from net import wire


def may_adopt(new: wire.Open, first_layer: int, is_last: bool) -> bool:
    """Whether the stage whose first layer is `first_layer` may take over the session
    `new` resumes (the checks of `positions_kept` still follow)."""
    if not new.resumes:
        return False
    if new.resume_from_layer is None:  # a client before the field: the last stage only
        return is_last
    return first_layer >= new.resume_from_layer


def extend_history(history: list[int], step: wire.Step) -> bool:
    """Add a computed `step` to the token ids a session's KV holds (cut to its
    `keep_until`, then its rows' tokens; in place); False once they are not known: a
    step that names no token per row, or rows that do not continue what is held. An
    unknown history keeps nothing (a replay then computes everything here)."""
    if len(step.tokens) != step.n_rows:
        return False
    if step.keep_until is not None:
        del history[step.keep_until :]
    if len(history) != step.start:
        return False
    history.extend(step.tokens)
    return True


@dataclass(frozen=True)
class HeldSession:
    """What a stage knows of the session a replay names."""

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
