"""n-gram guesses and the adaptive guess count: pure functions, exact expectations."""

from __future__ import annotations

import pytest

from core.guessing import (
    DEFAULT_GUESSES,
    GUESS_CHOICES,
    GuessPolicy,
    GuessState,
    guesses_now,
    initial_state,
    next_guess_state,
    ngram_guesses,
)

pytestmark = pytest.mark.unit


def test_ngram_guesses_what_followed_the_suffix_last_time() -> None:
    #          0  1  2  3  4  5  6  7  8
    history = [9, 1, 2, 3, 4, 5, 7, 1, 2]
    assert ngram_guesses(history, 3) == (3, 4, 5)
    assert ngram_guesses(history, 1) == (3,)
    assert ngram_guesses(history, 0) == ()


def test_ngram_prefers_the_longest_suffix_then_the_most_recent_occurrence() -> None:
    # The 2-gram (1, 2) last appeared before 8; the 3-gram (0, 1, 2) only before 4.
    history = [0, 1, 2, 4, 6, 1, 2, 8, 0, 1, 2]
    assert ngram_guesses(history, 1) == (4,)
    assert ngram_guesses(history, 1, max_n=2) == (8,)


def test_ngram_needs_a_match_of_at_least_min_n_with_a_token_after_it() -> None:
    assert ngram_guesses([1, 2, 3, 4], 4) == ()
    assert ngram_guesses([5, 5], 2) == ()  # the only earlier "5" has the suffix itself after it
    assert ngram_guesses([5, 5, 5], 2) == (5,)
    assert ngram_guesses([1, 2, 3, 1, 2], 9) == (3, 1, 2)  # stops at the end of the text


def test_fixed_policy_always_offers_its_count() -> None:
    policy = GuessPolicy.parse("4")
    state = initial_state(policy)
    for accepted in (0, 4, 1):
        state = next_guess_state(policy, state, 4, accepted, 10.0)
        assert guesses_now(policy, state) == 4
    assert guesses_now(GuessPolicy.parse("none"), initial_state(GuessPolicy.parse("none"))) == 0


def test_parse_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="guesses must be"):
        GuessPolicy.parse("lots")
    with pytest.raises(ValueError):
        GuessPolicy(max_guesses=-1)


def test_adaptive_grows_on_full_acceptance_and_shrinks_on_reject() -> None:
    policy = GuessPolicy(max_guesses=6, adaptive=True, start_guesses=2)
    state = initial_state(policy)
    assert guesses_now(policy, state) == 2
    state = next_guess_state(policy, state, 2, 2, 10.0)
    assert guesses_now(policy, state) == 3
    for _ in range(5):
        state = next_guess_state(policy, state, guesses_now(policy, state), 9, 10.0)
    assert guesses_now(policy, state) == 6  # capped
    state = next_guess_state(policy, state, 6, 2, 10.0)
    assert guesses_now(policy, state) == 3  # accepted + 1
    state = next_guess_state(policy, state, 3, 0, 10.0)
    assert guesses_now(policy, state) == 1  # halved, never below min_guesses


def test_adaptive_turns_off_when_verified_trips_do_not_pay_and_probes_later() -> None:
    policy = GuessPolicy(max_guesses=4, adaptive=True, cooldown_steps=3, judge_after=2)
    state = next_guess_state(policy, initial_state(policy), 0, 0, 10.0)  # plain: 10 ms
    assert state.plain_ms == 10.0
    # Trips with guesses take 30 ms and yield 1 token: 1/30 per ms < 1/10 per ms.
    state = next_guess_state(policy, state, 2, 0, 30.0)
    assert guesses_now(policy, state) > 0  # one trip is not enough to judge
    state = next_guess_state(policy, state, 1, 0, 30.0)
    assert guesses_now(policy, state) == 0
    for _ in range(3):
        assert guesses_now(policy, state) == 0
        state = next_guess_state(policy, state, 0, 0, 10.0)
    assert guesses_now(policy, state) > 0  # cooled down: probe again


def test_adaptive_keeps_guessing_where_trips_cost_the_same() -> None:
    policy = GuessPolicy(max_guesses=4, adaptive=True, judge_after=1)
    state = next_guess_state(policy, initial_state(policy), 0, 0, 600.0)
    for _ in range(10):  # a WAN chain: a trip with guesses costs what a plain one does
        state = next_guess_state(policy, state, guesses_now(policy, state), 0, 601.0)
        state = next_guess_state(policy, state, guesses_now(policy, state), 3, 600.0)
    assert state.off_for == 0 and guesses_now(policy, state) > 0


def test_adaptive_probes_a_plain_trip_after_a_long_run_of_guesses() -> None:
    policy = GuessPolicy(max_guesses=2, adaptive=True, probe_every=3)
    state = GuessState(guesses=2)
    for _ in range(3):
        assert guesses_now(policy, state) == 2
        state = next_guess_state(policy, state, 2, 2, 5.0)
    assert guesses_now(policy, state) == 0
    state = next_guess_state(policy, state, 0, 0, 5.0)
    assert guesses_now(policy, state) == 2


def test_users_get_adaptive_guesses_and_choose_by_name() -> None:
    assert GuessPolicy() == DEFAULT_GUESSES and DEFAULT_GUESSES.adaptive
    assert DEFAULT_GUESSES.max_guesses > 0
    assert GuessPolicy.parse("adaptive") == DEFAULT_GUESSES
    ngram = GuessPolicy.parse("ngram")
    assert not ngram.adaptive and ngram.max_guesses == 4
    assert GuessPolicy.parse("none").max_guesses == 0 and not GuessPolicy.fixed(3).adaptive
    assert {GuessPolicy.parse(c).max_guesses > 0 for c in GUESS_CHOICES} == {False, True}
    with pytest.raises(ValueError, match="negative"):
        GuessPolicy.parse("-2")
