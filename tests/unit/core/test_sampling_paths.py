"""core.sampling's fast paths equal the filter composition they stand for, draw for draw.

`sample` skips copies for greedy and works on the top-k survivors only when top_k > 0;
the reference here is the documented chain built from the public filters, run with an
identically seeded generator, so a fast path that drifts by one ulp or one draw fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.sampling import (
    Logits,
    apply_repetition_penalty,
    greedy,
    greedy_rows,
    make_rng,
    min_p_filter,
    sample,
    softmax,
    top_k_filter,
    top_p_filter,
)
from core.types import SamplingParams

pytestmark = pytest.mark.unit


def reference(
    x: Logits, params: SamplingParams, rng: np.random.Generator, history: Sequence[int]
) -> int:
    """The chain as the module docstring states it, on the full vector at every step."""
    y = apply_repetition_penalty(x, history, params.repetition_penalty, params.repetition_window)
    if params.greedy:
        return greedy(y)
    y = min_p_filter(top_p_filter(top_k_filter(y, params.top_k), params.top_p), params.min_p)
    candidates = np.flatnonzero(np.isfinite(y))
    cumulative = np.cumsum(softmax(y[candidates], params.temperature))
    u = rng.random() * cumulative[-1]
    pick = min(int(np.searchsorted(cumulative, u, side="right")), candidates.size - 1)
    return int(candidates[pick])


@st.composite
def tied_vectors(draw: st.DrawFn) -> Logits:
    """Vectors with many exact ties and -inf entries: where top-k's tie rule matters."""
    n = draw(st.integers(2, 300))
    pool = draw(st.lists(st.floats(-30.0, 30.0, width=32), min_size=1, max_size=6))
    values = draw(
        st.lists(st.one_of(st.sampled_from(pool), st.just(-np.inf)), min_size=n, max_size=n)
    )
    values[draw(st.integers(0, n - 1))] = pool[0]
    return np.array(values, dtype=np.float32)


params_strategy = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 3.0)),
    top_k=st.integers(0, 60),
    top_p=st.one_of(st.just(1.0), st.floats(0.05, 1.0)),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.9)),
    repetition_penalty=st.one_of(st.just(1.0), st.floats(0.5, 2.0)),
    repetition_window=st.integers(0, 8),
    seed=st.integers(0, 2**32),
)


@settings(max_examples=100, deadline=None)
@given(x=tied_vectors(), params=params_strategy, data=st.data())
def test_sample_draws_what_the_full_vector_chain_draws(
    x: Logits, params: SamplingParams, data: st.DataObject
) -> None:
    history = data.draw(st.lists(st.integers(0, x.size - 1), max_size=10))
    fast_rng, ref_rng = make_rng(params), make_rng(params)
    for _ in range(5):  # several draws: the generators must stay in step too
        assert sample(x, params, fast_rng, history) == reference(x, params, ref_rng, history)


def test_a_gemma_sized_row_samples_alike_and_is_never_written() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(262_144).astype(np.float32) * 4
    x[rng.integers(0, x.size, 500)] = x.max()  # ties at the very top
    x.flags.writeable = False  # as the engine's own buffer is handed out
    for params in (
        SamplingParams(),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=11),
        SamplingParams(temperature=1.2, top_k=200, min_p=0.05, seed=12),
        SamplingParams(temperature=0.7, top_k=40, repetition_penalty=1.3, seed=13),
    ):
        a, b = make_rng(params), make_rng(params)
        history = [int(i) for i in np.argsort(-x)[:8]]
        got = [sample(x, params, a, history) for _ in range(20)]
        assert got == [reference(x, params, b, history) for _ in range(20)]


def test_greedy_rows_takes_each_rows_argmax_lowest_index_first() -> None:
    rows = np.array([[0.0, 2.0, 2.0], [5.0, -1.0, 5.0], [-np.inf, -np.inf, 0.0]], np.float32)
    assert greedy_rows(rows) == [1, 0, 2]
    with pytest.raises(ValueError):
        greedy_rows(rows[0])
