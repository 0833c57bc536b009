"""Turning the last stage's logits into a token: pure functions with an injected RNG.

Every filter takes a 1-D float32 logits vector and returns a new one in which the
tokens it rules out are -inf, so filters compose by plain function application and
the caller's array is never touched. The chain follows llama.cpp's default order:

    repetition penalty -> top-k -> top-p -> min-p -> temperature softmax -> draw

Logits may hold -inf (already masked) but never NaN or +inf; `sample` checks that
and that at least one entry is finite. The individual filters assume the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from core.types import SamplingParams

Logits = npt.NDArray[np.float32]
Probs = npt.NDArray[np.float64]

__all__ = [
    "Logits",
    "Probs",
    "apply_repetition_penalty",
    "greedy",
    "greedy_rows",
    "guess_acceptance",
    "make_rng",
    "min_p_filter",
    "sample",
    "softmax",
    "top_k_filter",
    "top_p_filter",
]


def make_rng(params: SamplingParams) -> np.random.Generator:
    """A generator seeded from the request alone, so a request replays identically."""
    return np.random.default_rng(params.seed)


def sample(
    logits: npt.ArrayLike,
    params: SamplingParams,
    rng: np.random.Generator,
    history: Sequence[int] = (),
) -> int:
    """Pick the next token id from `logits` given the tokens generated so far.

    `logits` may be a read-only view of the engine's own buffer: nothing here writes to
    it or copies all of it unless the settings need a full-vocabulary pass.
    """
    x = _checked(logits)
    if params.repetition_penalty != 1.0 and params.repetition_window > 0 and history:
        x = apply_repetition_penalty(
            x, history, params.repetition_penalty, params.repetition_window
        )
    if params.greedy:
        # The argmax survives top-k/top-p/min-p by construction, so they cannot change it.
        return greedy(x)
    if 0 < params.top_k < x.size:
        return _sample_top_k(x, params, rng)
    x = top_k_filter(x, params.top_k)
    x = top_p_filter(x, params.top_p)
    x = min_p_filter(x, params.min_p)
    return _draw(x, params.temperature, rng)


def greedy_rows(logits: Logits) -> list[int]:
    """`greedy` of every row of a (rows, vocab) array (e.g. k guessed tokens plus one)."""
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits rows must be a (rows, vocab) array, got shape {logits.shape}")
    return [int(i) for i in np.argmax(logits, axis=1)]


def greedy(logits: Logits) -> int:
    """Index of the largest logit; the lowest index wins ties (np.argmax's rule)."""
    return int(np.argmax(logits))


def softmax(logits: Logits, temperature: float = 1.0) -> Probs:
    """Probabilities in float64; -inf entries get exactly 0.

    Subtracting the max first keeps exp() from overflowing at any temperature.
    """
    if not temperature > 0:
        raise ValueError("softmax needs a temperature > 0; use greedy() for temperature 0")
    scaled = (logits.astype(np.float64) - float(np.max(logits))) / temperature
    weights: Probs = np.exp(scaled)
    weights /= weights.sum()
    return weights


def apply_repetition_penalty(
    logits: Logits, history: Sequence[int], penalty: float, window: int
) -> Logits:
    """CTRL / llama.cpp penalty over the distinct tokens of the last `window` of history.

    Positive logits are divided by `penalty` and negative ones multiplied, so a
    penalty > 1 always makes a seen token less likely whatever its sign.
    """
    out = logits.copy()
    if penalty == 1.0 or window <= 0 or not history:
        return out
    seen = np.unique(np.asarray(history[-window:], dtype=np.int64))
    if seen[0] < 0 or seen[-1] >= out.size:
        # A negative id would silently wrap around in numpy indexing: refuse instead.
        raise ValueError(f"history holds token ids outside the vocabulary of {out.size}")
    picked = out[seen]
    out[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def top_k_filter(logits: Logits, k: int) -> Logits:
    """Keep exactly the `k` largest logits (lowest index first on ties); k <= 0 keeps all."""
    out = logits.copy()
    if k <= 0 or k >= out.size:
        return out
    # O(n) partition rather than a full sort: vocabularies reach 262k entries.
    threshold = np.partition(out, out.size - k)[out.size - k]
    keep = out > threshold
    ties = np.flatnonzero(out == threshold)[: k - int(keep.sum())]
    keep[ties] = True
    out[~keep] = -np.inf
    return out


def top_p_filter(logits: Logits, p: float) -> Logits:
    """Keep the smallest most-likely set whose probability reaches `p` (nucleus)."""
    out = logits.copy()
    if p >= 1.0:
        return out
    # Only finite entries can be kept; after top-k that is a handful, not the vocabulary.
    candidates = np.flatnonzero(np.isfinite(out))
    order = candidates[np.argsort(-out[candidates], kind="stable")]
    cumulative = np.cumsum(softmax(out[order]))
    n_keep = min(int(np.searchsorted(cumulative, p, side="left")) + 1, order.size)
    drop = np.ones(out.size, dtype=bool)
    drop[order[:n_keep]] = False
    out[drop] = -np.inf
    return out


def min_p_filter(logits: Logits, min_p: float) -> Logits:
    """Drop tokens whose probability is below `min_p` times the top token's."""
    out = logits.copy()
    if min_p <= 0.0:
        return out
    # p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p): no softmax needed.
    floor = float(np.max(out)) + math.log(min_p)
    out[out < floor] = -np.inf
    return out


def guess_acceptance(target_tokens: Sequence[int], guessed: Sequence[int]) -> int:
    """How many leading guessed tokens equal the target model's greedy choices.

    `target_tokens[i]` is the target's pick at the position `guessed[i]` claims.
    """
    accepted = 0
    for target, guess in zip(target_tokens, guessed, strict=False):
        if target != guess:
            break
        accepted += 1
    return accepted


def _checked(logits: npt.ArrayLike) -> Logits:
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D vector, got shape {x.shape}")
    # One pass instead of three: the max is NaN if any entry is, +inf if any entry is,
    # and -inf only if every entry is.
    top = float(np.max(x))
    if math.isnan(top) or top == math.inf:
        raise ValueError("logits contain NaN or +inf")
    if top == -math.inf:
        raise ValueError("every logit is -inf: nothing to sample")
    return x


def _sample_top_k(logits: Logits, params: SamplingParams, rng: np.random.Generator) -> int:
    """top-k -> top-p -> min-p -> draw on the k survivors only, never the whole vocabulary.

    Equal, bit for bit and draw for draw, to the composition of the filters and `_draw`:
    the survivors are the same tokens in the same (ascending id) order, so every softmax,
    cumulative sum and search below sees the same floats as on the full vector.
    """
    k = params.top_k
    threshold = np.partition(logits, logits.size - k)[logits.size - k]
    # One pass over the vocabulary; the tie rule (lowest ids first) then runs on the few.
    at_least = np.flatnonzero(logits >= threshold)
    level = logits[at_least]
    above = level > threshold
    n_ties = k - int(above.sum())
    tie_rank = np.cumsum(~above)  # 1 for the first tie, 2 for the second, ...
    chosen = above | (~above & (tie_rank <= n_ties))
    ids, vals = at_least[chosen], level[chosen]
    finite = np.isfinite(vals)
    ids, vals = ids[finite], vals[finite]
    if params.top_p < 1.0:
        order = np.argsort(-vals, kind="stable")
        cumulative = np.cumsum(softmax(vals[order]))
        n_keep = min(int(np.searchsorted(cumulative, params.top_p, side="left")) + 1, order.size)
        keep = np.sort(order[:n_keep])
        ids, vals = ids[keep], vals[keep]
    if params.min_p > 0.0:
        floor = float(np.max(vals)) + math.log(params.min_p)
        keep_mask = vals >= floor
        ids, vals = ids[keep_mask], vals[keep_mask]
    cumulative = np.cumsum(softmax(vals, params.temperature))
    u = rng.random() * cumulative[-1]
    pick = min(int(np.searchsorted(cumulative, u, side="right")), ids.size - 1)
    return int(ids[pick])


def _draw(logits: Logits, temperature: float, rng: np.random.Generator) -> int:
    candidates = np.flatnonzero(np.isfinite(logits))
    cumulative = np.cumsum(softmax(logits[candidates], temperature))
    # Inverse CDF on the survivors only; scaling u by the total absorbs rounding in the sum.
    u = rng.random() * cumulative[-1]
    pick = min(int(np.searchsorted(cumulative, u, side="right")), candidates.size - 1)
    return int(candidates[pick])
