"""The STEP of token ids (no hidden rows) that the first stage embeds: built by the client
for a prompt chunk, a replay's rows or the next token (app.client.generation), and by
the last stage for a step round the ring (app.serving.links.ring), which sends exactly
the step the client would have sent. One builder, so the two cannot drift apart.
"""

from __future__ import annotations

from net import wire
from net.wire.tensors import WireDtype


def token_step(
    session: str,
    step_id: int,
    start: int,
    tokens: tuple[int, ...],
    *,
    guesses: tuple[int, ...] = (),
    keep_until: int | None = None,
    one_by_one: bool = False,
    sent_at_ns: int = 0,
) -> wire.Step:
    """Positions [start, start + len(tokens)) of `session` as token ids: the newest token
    and then `guesses` (the tail of `tokens`), after every stage cut its cache at
    `keep_until` (rejected guesses); `one_by_one` for a replay's generated rows
    (app.session.replay_shapes). `sent_at_ns`: the sender's wall clock, for timings."""
    return wire.Step(
        session=session,
        step_id=step_id,
        start=start,
        tokens=tokens,
        hidden=None,
        n_rows=len(tokens),
        width=0,
        wire_dtype=WireDtype.F32,  # no rows travel: a token step carries no dtype of its own
        guesses=guesses,
        keep_until=keep_until,
        sent_at_ns=sent_at_ns,
        one_by_one=one_by_one,
    )
