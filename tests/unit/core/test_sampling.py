"""core.sampling: each filter on hand-made logits, seeding, and the full chain as a property."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.sampling import (
    Logits,
    apply_repetition_penalty,
    greedy,
    guess_acceptance,
    make_rng,
    min_p_filter,
    sample,
    softmax,
    top_k_filter,
    top_p_filter,
)
from core.types import SamplingParams

pytestmark = pytest.mark.unit

# Probabilities 0.5, 0.3, 0.15, 0.05 laid out out of order, so no test passes by
# accidentally relying on "the best token is index 0".
PROBS = np.array([0.15, 0.5, 0.05, 0.3])
LOGITS: Logits = np.log(PROBS).astype(np.float32)


def logits(*values: float) -> Logits:
    return np.array(values, dtype=np.float32)


def kept(x: Logits) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isfinite(x))}


def draws(params: SamplingParams, x: Logits, n: int) -> list[int]:
    rng = make_rng(params)
    return [sample(x, params, rng) for _ in range(n)]


# --- greedy -------------------------------------------------------------------------


def test_greedy_picks_the_argmax() -> None:
    x = logits(0.1, 3.0, -2.0, 2.9)
    assert greedy(x) == 1
    assert sample(x, SamplingParams(), make_rng(SamplingParams())) == 1


def test_greedy_breaks_ties_towards_the_lowest_index() -> None:
    assert greedy(logits(1.0, 5.0, 5.0, 5.0)) == 1


def test_greedy_ignores_the_rng() -> None:
    x = logits(0.3, 0.2, 0.31)
    picks = {sample(x, SamplingParams(seed=s), np.random.default_rng(s)) for s in range(20)}
    assert picks == {2}


# --- seeding ------------------------------------------------------------------------


def test_same_seed_gives_the_same_token_sequence() -> None:
    params = SamplingParams(temperature=1.0, seed=42)
    flat = np.zeros(16, dtype=np.float32)
    assert draws(params, flat, 50) == draws(params, flat, 50)


def test_different_seeds_give_different_sequences() -> None:
    flat = np.zeros(16, dtype=np.float32)
    sequences = {tuple(draws(SamplingParams(temperature=1.0, seed=s), flat, 30)) for s in range(10)}
    assert len(sequences) == 10


# --- top-k ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(25))
def test_top_k_one_equals_greedy(seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=50).astype(np.float32)
    params = SamplingParams(temperature=2.0, top_k=1, seed=seed)
    assert sample(x, params, make_rng(params)) == greedy(x)


def test_top_k_keeps_exactly_k_and_prefers_low_indices_on_ties() -> None:
    x = logits(1.0, 3.0, 2.0, 2.0, 2.0, 0.0)
    assert kept(top_k_filter(x, 3)) == {1, 2, 3}


def test_top_k_zero_or_larger_than_vocab_keeps_everything() -> None:
    assert kept(top_k_filter(LOGITS, 0)) == {0, 1, 2, 3}
    assert kept(top_k_filter(LOGITS, 10)) == {0, 1, 2, 3}


# --- top-p ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.49, {1}),  # 0.5 alone reaches it
        (0.79, {1, 3}),  # 0.5 + 0.3
        (0.81, {1, 3, 0}),  # needs the 0.15 too
        (0.99, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(p: float, expected: set[int]) -> None:
    assert kept(top_p_filter(LOGITS, p)) == expected


def test_top_p_keeps_survivors_logits_unchanged() -> None:
    out = top_p_filter(LOGITS, 0.79)
    np.testing.assert_array_equal(out[[1, 3]], LOGITS[[1, 3]])


# --- min-p ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [
        (0.2, {0, 1, 3}),  # floor 0.10: only 0.05 goes
        (0.35, {1, 3}),  # floor 0.175: 0.15 goes too
        (0.7, {1}),  # floor 0.35: only the top survives
    ],
)
def test_min_p_drops_tokens_below_min_p_times_the_top(min_p: float, expected: set[int]) -> None:
    assert kept(min_p_filter(LOGITS, min_p)) == expected


# --- repetition penalty ---------------------------------------------------------------


def test_penalty_lowers_a_repeated_token_below_an_unrepeated_competitor() -> None:
    x = logits(2.0, 1.8, -1.0)
    params = SamplingParams(repetition_penalty=1.5)
    assert sample(x, params, make_rng(params)) == 0  # without history token 0 wins
    assert sample(x, params, make_rng(params), history=[0, 0, 2]) == 1


def test_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    out = apply_repetition_penalty(logits(2.0, 1.0, -1.0), [0, 2, 2], penalty=2.0, window=64)
    np.testing.assert_allclose(out, [1.0, 1.0, -2.0])


def test_penalty_only_looks_at_the_last_window_tokens() -> None:
    out = apply_repetition_penalty(logits(2.0, 2.0, 2.0), [0, 1, 2], penalty=2.0, window=2)
    np.testing.assert_allclose(out, [2.0, 1.0, 1.0])


def test_penalty_is_off_with_a_zero_window() -> None:
    x = logits(2.0, 2.0)
    np.testing.assert_array_equal(apply_repetition_penalty(x, [0], 2.0, window=0), x)


def test_penalty_rejects_token_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        apply_repetition_penalty(logits(1.0, 2.0), [-1], penalty=1.3, window=8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        apply_repetition_penalty(logits(1.0, 2.0), [2], penalty=1.3, window=8)


# --- temperature and the draw ---------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_empirical_distribution_matches_softmax(temperature: float) -> None:
    x = logits(1.0, 0.5, -0.5, 2.0)
    params = SamplingParams(temperature=temperature, seed=1234)
    n = 20_000
    counts = np.bincount(draws(params, x, n), minlength=4)
    expected = np.exp(x / temperature) / np.exp(x / temperature).sum()
    # The standard error of each frequency is <= 0.0036 here; 0.015 is over 4 of them.
    np.testing.assert_allclose(counts / n, expected, atol=0.015)


def test_softmax_is_stable_for_huge_logits_and_zero_for_minus_inf() -> None:
    probs = softmax(logits(1e4, 1e4 - 1.0, -np.inf))
    assert np.all(np.isfinite(probs))
    np.testing.assert_allclose(probs, [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1)), 0])


def test_filters_do_not_modify_their_input() -> None:
    x = LOGITS.copy()
    top_k_filter(x, 1)
    top_p_filter(x, 0.3)
    min_p_filter(x, 0.9)
    apply_repetition_penalty(x, [0, 1], 2.0, 8)
    np.testing.assert_array_equal(x, LOGITS)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([np.nan, 1.0], dtype=np.float32),
        np.array([np.inf, 1.0], dtype=np.float32),
        np.array([-np.inf, -np.inf], dtype=np.float32),
        np.zeros((2, 2), dtype=np.float32),
        np.zeros(0, dtype=np.float32),
    ],
)
def test_sample_rejects_unusable_logits(bad: Logits) -> None:
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError):
        sample(bad, params, make_rng(params))


# --- parameters -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_p": float("nan")},
        {"min_p": -0.1},
        {"min_p": 1.0},
        {"repetition_penalty": 0.0},
        {"repetition_penalty": float("nan")},
        {"repetition_window": -1},
        {"seed": -1},
    ],
)
def test_invalid_sampling_params_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_sampling_params_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 1.0  # type: ignore[misc]


# --- guess acceptance -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "guessed", "accepted"),
    [
        ([5, 6, 7], [5, 6, 7], 3),
        ([5, 6, 7], [5, 9, 7], 1),  # stops at the first mismatch even if later ones agree
        ([5, 6, 7], [4, 6, 7], 0),
        ([5, 6], [5, 6, 7], 2),  # the target has no opinion past its own length
        ([5, 6, 7], [], 0),
    ],
)
def test_guess_acceptance(target: list[int], guessed: list[int], accepted: int) -> None:
    assert guess_acceptance(target, guessed) == accepted


# --- the whole chain, as a property ---------------------------------------------------


@st.composite
def logit_vectors(draw: st.DrawFn) -> Logits:
    n = draw(st.integers(1, 40))
    finite = st.floats(-60.0, 60.0, width=32)
    values = draw(st.lists(st.one_of(finite, st.just(-np.inf)), min_size=n, max_size=n))
    values[draw(st.integers(0, n - 1))] = draw(finite)  # at least one token is possible
    return np.array(values, dtype=np.float32)


sampling_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.01, 5.0)),
    top_k=st.integers(0, 45),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 0.99),
    repetition_penalty=st.floats(0.5, 3.0),
    repetition_window=st.integers(0, 8),
    seed=st.integers(0, 2**32),
)


@settings(max_examples=300, deadline=None)
@given(x=logit_vectors(), params=sampling_params, data=st.data())
def test_sample_returns_a_finite_token_that_survives_every_filter(
    x: Logits, params: SamplingParams, data: st.DataObject
) -> None:
    history = data.draw(st.lists(st.integers(0, x.size - 1), max_size=12))
    token = sample(x, params, make_rng(params), history)

    assert 0 <= token < x.size
    assert np.isfinite(x[token])
    penalized = apply_repetition_penalty(
        x, history, params.repetition_penalty, params.repetition_window
    )
    if params.greedy:
        assert token == greedy(penalized)
        return
    survivors = min_p_filter(
        top_p_filter(top_k_filter(penalized, params.top_k), params.top_p), params.min_p
    )
    assert np.isfinite(survivors[token])


@given(x=logit_vectors(), k=st.integers(1, 45))
def test_top_k_keeps_min_k_and_the_finite_count(x: Logits, k: int) -> None:
    assert len(kept(top_k_filter(x, k))) == min(k, int(np.isfinite(x).sum()))
