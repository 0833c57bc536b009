"""Which shape each row of a replay gets: a pure function, shared by the client (which
cuts the replay into steps) and the tests.

llama.cpp's CPU kernels give a row results that depend on how many rows its decode
holds (multi-row matrix kernels round differently from the one-row ones), so a replay
whose decodes differ from the first run's can flip a near-tie and change a greedy
answer after a reroute (docs/decisions/replay-original-shapes.md).
A replay therefore gives every position the shape it had first:

- the prompt in the chunks the first run sent (`SwarmClient.generate`: cut at
  multiples of `chunk` from 0, the last chunk ending at the prompt's end);
- each generated token's row in a llama_decode of its own, as plain decoding computed
  it (one step per token), on every stage; the rows of many tokens still travel in one
  STEP per `chunk` rows (`wire.Step.one_by_one`), not a trip per token.

Which originals a replay then equals bit for bit, hence token for token (greedy):

- plain decoding (no guesses): yes;
- guessing ahead with `WorkerConfig.exact_guesses` (the default): yes, a guessed row
  was evaluated one at a time too on the stages before the last (verify_rows), and the
  last stage evaluated each row after the first guess alone (its first row joins the
  batch as a plain decode row does);
- guessing ahead with exact_guesses off, or a recurrent model (qwen35, whose guessed
  rows stay in one decode): no, a guessed and accepted row was computed in a
  multi-row decode that the replay does not reproduce;
- many sessions batched together: yes, a session's rows give the same numbers whatever
  other sessions' rows share their decodes (a KV stream per session, batch-invariant
  kernels: docs/many-users.md).

A session's prompt chunks never share a decode (core.stage), so the first run's prompt
shapes are its chunks whatever their timing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """Positions [start, start + rows) of a replay, sent as one STEP."""

    start: int
    rows: int
    one_by_one: bool
    """Each row in a decode of its own (a generated token's row); False: one decode."""


def replay_segments(prompt_len: int, chunk: int, generated: int) -> tuple[Segment, ...]:
    """The steps of a replay of a prompt of `prompt_len` tokens and `generated` tokens
    after it (positions prompt_len .. prompt_len + generated - 1), for a first run that
    sent its prompt in chunks of `chunk`. Generated rows go `chunk` to a step, so no
    STEP is larger than a prompt chunk; their shapes do not depend on that cut."""
    if prompt_len < 1:
        raise ValueError(f"a replay needs a prompt, got prompt_len={prompt_len}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if generated < 0:
        raise ValueError(f"generated must be >= 0, got {generated}")
    prompt = [Segment(a, min(chunk, prompt_len - a), False) for a in range(0, prompt_len, chunk)]
    end = prompt_len + generated
    tail = [Segment(a, min(chunk, end - a), True) for a in range(prompt_len, end, chunk)]
    return (*prompt, *tail)


def plain_segments(n_tokens: int, chunk: int) -> tuple[Segment, ...]:
    """A first run's prompt of `n_tokens`: its chunks, nothing one at a time."""
    return replay_segments(n_tokens, chunk, 0)
