"""Guessing without IO: what the next STEP carries (the client's, or the ring's on the
last stage: app.serving.rules.ring_turns).

One `GuessTracker` per generation. After each TOKENS it is told what came back; it then
says where the next step starts, which rows it carries (the newest token, then up to k
n-gram guesses from `core.guessing`) and where every stage must cut its cache first
(`keep_until`: the positions of guesses the last stage rejected). A rejected guess so
costs no extra trip: the cut rides on the next step.

Positions: `pos` is how many tokens every stage holds as real; a step evaluates its rows
from `pos`, so after it the stages hold `pos + rows`, of which the newest token and the
accepted guesses stay real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import ClientError
from core.guessing import (
    GuessPolicy,
    GuessState,
    choose_guesses,
    guesses_now,
    initial_state,
    next_guess_state,
)


@dataclass(frozen=True)
class NextStep:
    start: int
    tokens: tuple[int, ...]
    """The newest token followed by the guesses."""
    guesses: tuple[int, ...]
    keep_until: int | None


class GuessTracker:
    def __init__(self, prompt: Sequence[int], max_tokens: int, policy: GuessPolicy) -> None:
        self.policy = policy
        self.state: GuessState = initial_state(policy)
        self.history: list[int] = list(prompt)
        self.max_tokens = max_tokens
        self.produced = 0
        self.pos = len(self.history)
        """Positions every stage holds as real."""
        self.cached = self.pos
        """Positions every stage holds, rejected guesses included."""
        self._last_guesses: tuple[int, ...] = ()
        self._offered: tuple[int, ...] = ()
        """The MTP head's guesses that came with the latest tokens."""
        self.proposed = 0
        self.accepted = 0
        self.trips = 0

    def reply(
        self,
        tokens: Sequence[int],
        n_accepted: int,
        trip_ms: float,
        offered: Sequence[int] = (),
    ) -> None:
        """TOKENS for the latest step: its accepted guesses, then the model's own token,
        and the last stage's guesses of what follows (`offered`, MTP)."""
        if not 0 <= n_accepted <= len(self._last_guesses) or len(tokens) != n_accepted + 1:
            raise ClientError(
                f"malformed TOKENS: a reply of {len(tokens)} tokens accepting {n_accepted} of "
                f"{len(self._last_guesses)} guesses does not add up"
            )
        self._offered = tuple(offered)
        if self._last_guesses or self.trips:
            self.state = next_guess_state(
                self.policy, self.state, len(self._last_guesses), n_accepted, trip_ms
            )
        self.proposed += len(self._last_guesses)
        self.accepted += n_accepted
        self.trips += 1
        if self.cached > self.pos:  # a decode step: its first row and accepted guesses stay
            self.pos += 1 + n_accepted
        self.history.extend(tokens)
        self.produced += len(tokens)

    def went_round(self, tokens: Sequence[int], rejected: int = 0) -> None:
        """TOKENS of a step that the last stage sent round the ring (its guesses were not
        chosen here): take its tokens as the answer's. The stages hold the `rejected`
        guesses past them, so a step built after this cuts there (`keep_until`)."""
        self.history.extend(tokens)
        self.produced += len(tokens)
        self.pos = len(self.history) - 1  # the newest token is the next step's first row
        self.cached = self.pos + rejected
        self._last_guesses = ()
        self._offered = ()

    def next_step(self) -> NextStep:
        """The step after the latest reply (call `reply` first)."""
        room = self.max_tokens - self.produced - 1  # guesses beyond max_tokens are wasted
        k = max(0, min(guesses_now(self.policy, self.state), room))
        guesses = choose_guesses(self.policy, self.history, self._offered, k)
        keep = self.pos if self.cached > self.pos else None
        tokens = (self.history[-1], *guesses)
        self._last_guesses = guesses
        self.cached = self.pos + len(tokens)
        return NextStep(self.pos, tokens, guesses, keep)
