"""Guessing ahead: n-gram guesses from the text so far, and how many guesses to send.

Two pure pieces, both used by the client (`app.client.swarm_client`):

- `ngram_guesses(history, k)`: if the last 2-4 tokens appeared earlier in the prompt or
  the answer, guess the up-to-k tokens that followed them then (the most recent earlier
  occurrence of the longest matching suffix wins). No model needed.
- `GuessPolicy` / `next_guess_state`: how many guesses the next step carries. A fixed
  count, or adaptive: shrink after a reject, grow after full acceptance, and switch
  guessing off for a while when verified trips do not pay on this chain (tokens per
  trip against what the longer trips cost, both measured), then probe again.

A chain of home PCs spends almost all of a token's time on the network, so one trip that
confirms several guessed tokens is nearly free speed; on a chain where compute dominates
the extra rows cost real time, which is what the pay-off test catches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

MIN_NGRAM = 2
MAX_NGRAM = 4


def choose_guesses(
    policy: GuessPolicy, history: Sequence[int], offered: Sequence[int], k: int
) -> tuple[int, ...]:
    """The next step's guesses: up to k from the policy's source. `offered` are the MTP
    head's guesses that came back with the latest tokens."""
    if k <= 0:
        return ()
    if policy.source in (MTP, MTP_NGRAM) and offered:
        return tuple(int(t) for t in offered[:k])
    if policy.source in (NGRAM, MTP_NGRAM):
        return ngram_guesses(history, k)
    return ()


def ngram_guesses(
    history: Sequence[int], k: int, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM
) -> tuple[int, ...]:
    """Up to `k` guessed continuations of `history` found by n-gram lookup, or ().

    Longer suffixes are tried first (a 4-token match predicts better than a 2-token
    one); for each length the most recent earlier occurrence wins, since the text
    nearest the cursor is the likeliest to repeat.
    """
    if k <= 0 or min_n < 1 or max_n < min_n:
        return ()
    n_hist = len(history)
    for n in range(min(max_n, n_hist - 1), min_n - 1, -1):
        suffix = list(history[n_hist - n :])
        # An occurrence ending at e (exclusive) must leave at least one token after it.
        for end in range(n_hist - 1, n - 1, -1):
            if list(history[end - n : end]) == suffix:
                return tuple(history[end : end + k])
    return ()


NGRAM = "ngram"
MTP = "mtp"
MTP_NGRAM = "mtp+ngram"
SOURCES = (NGRAM, MTP, MTP_NGRAM)


@dataclass(frozen=True)
class GuessPolicy:
    """How many guesses per step. The default is what users get (`DEFAULT_GUESSES`):
    adaptive, up to 6. `adaptive=False`: always `max_guesses` (when the text has them)."""

    max_guesses: int = 6
    adaptive: bool = True
    source: str = NGRAM
    """Where guesses come from: n-gram lookup on the client (`ngram`), the model's MTP
    head on the last stage, sent back with each token (`mtp`), or MTP guesses when the
    last stage sent some and n-gram ones otherwise (`mtp+ngram`)."""
    min_guesses: int = 1
    start_guesses: int = 2
    pay_margin: float = 1.0
    """Guessing stays on while (tokens per verified trip / its time) beats
    (1 / a plain trip's time) times this margin."""
    cooldown_steps: int = 16
    """Plain steps to run after guessing was found not to pay, before probing again."""
    judge_after: int = 4
    """Trips with guesses to average before deciding they do not pay (one unlucky
    trip must not switch guessing off)."""
    ema: float = 0.3
    """Weight of the newest measurement in the running averages."""
    probe_every: int = 24
    """After this many trips with guesses in a row, one plain trip re-measures the
    plain cost (the chain's load changes; the pay-off test needs a fresh figure)."""

    def __post_init__(self) -> None:
        if self.max_guesses < 0 or self.min_guesses < 1 or self.cooldown_steps < 0:
            raise ValueError("max_guesses >= 0, min_guesses >= 1, cooldown_steps >= 0")
        if not 0.0 < self.ema <= 1.0 or self.pay_margin <= 0.0 or self.probe_every < 1:
            raise ValueError("ema must be in (0, 1], pay_margin > 0, probe_every >= 1")
        if self.source not in SOURCES:
            raise ValueError(f"guess source must be one of {', '.join(SOURCES)}")

    @classmethod
    def fixed(cls, guesses: int) -> GuessPolicy:
        return cls(max_guesses=guesses, adaptive=False)

    @classmethod
    def parse(cls, text: str) -> GuessPolicy:
        """`none`, `ngram` (always up to 4), a count (`4`) or `adaptive` (up to 6): the
        bench's and the CLI's `--guesses`; `mtp` / `mtp+ngram` (up to 6, adaptive), or
        `mtp:4`, `mtp+ngram:adaptive`, take the MTP head's guesses (core.guessing.SOURCES)."""
        source, _, rest = text.partition(":")
        if source in (MTP, MTP_NGRAM):
            base = cls.parse(rest or "adaptive")
            return replace(base, source=source)
        if text == "none":
            return cls.fixed(0)
        if text == "ngram":
            return cls.fixed(4)
        if text == "adaptive":
            return cls(max_guesses=6, adaptive=True)
        try:
            n = int(text)
        except ValueError:
            raise ValueError(
                f"guesses must be none, ngram, adaptive or a count, got {text!r}"
            ) from None
        if n < 0:
            raise ValueError(f"a guess count cannot be negative, got {n}")
        return cls.fixed(n)


GUESS_CHOICES = ("none", "ngram", "adaptive")
"""What users choose between (`--guesses`)."""
DEFAULT_GUESSES = GuessPolicy()
"""Clients guess by default: adaptive n-gram guesses cost a trip nothing when they are
wrong (the cut rides on the next step) and switch themselves off where guessed trips do
not pay, so a user who never hears of them is never slower for them."""


@dataclass(frozen=True)
class GuessState:
    """What the adaptive policy has learned so far; start with `initial_state`."""

    guesses: int
    off_for: int = 0
    """Plain steps left before guessing is tried again."""
    plain_ms: float | None = None
    """Running average of a plain (one-row) trip."""
    guessed_ms: float | None = None
    guessed_tokens: float | None = None
    """Running averages over trips that carried guesses: their time, tokens they yielded."""
    guessed_in_row: int = 0
    """Trips with guesses since the last plain one."""
    guessed_trips: int = 0
    """Trips with guesses behind the guessed averages (reset when guessing turns off)."""


def initial_state(policy: GuessPolicy) -> GuessState:
    start = policy.start_guesses if policy.adaptive else policy.max_guesses
    return GuessState(guesses=min(start, policy.max_guesses))


def guesses_now(policy: GuessPolicy, state: GuessState) -> int:
    """How many guesses the next step may carry."""
    if policy.max_guesses == 0 or state.off_for > 0:
        return 0
    if policy.adaptive and state.guessed_in_row >= policy.probe_every:
        return 0  # one plain trip to measure what a trip without guesses costs now
    return state.guesses


def _avg(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1.0 - weight) * old + weight * new


def next_guess_state(
    policy: GuessPolicy, state: GuessState, proposed: int, accepted: int, trip_ms: float
) -> GuessState:
    """The state after a step that carried `proposed` guesses, `accepted` of them kept,
    whose trip took `trip_ms` (client send to its TOKENS)."""
    if not policy.adaptive:
        return state
    w = policy.ema
    if proposed == 0:
        return replace(
            state,
            off_for=max(0, state.off_for - 1),
            plain_ms=_avg(state.plain_ms, trip_ms, w),
            guessed_in_row=0,
        )
    if accepted >= proposed:
        guesses = min(policy.max_guesses, state.guesses + 1)
    else:
        guesses = max(policy.min_guesses, accepted + 1 if accepted else state.guesses // 2)
    guessed_ms = _avg(state.guessed_ms, trip_ms, w)
    guessed_tokens = _avg(state.guessed_tokens, accepted + 1.0, w)
    trips = state.guessed_trips + 1
    # Tokens per ms with guesses against without: on a chain where the extra rows cost
    # more than the accepted guesses save, guessing goes off and is probed again later.
    pays = (
        state.plain_ms is None
        or trips < policy.judge_after
        or guessed_tokens / guessed_ms >= policy.pay_margin / state.plain_ms
    )
    if not pays:
        return GuessState(guesses, policy.cooldown_steps, state.plain_ms)
    return GuessState(
        guesses, 0, state.plain_ms, guessed_ms, guessed_tokens, state.guessed_in_row + 1, trips
    )
