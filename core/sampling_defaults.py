"""The sampling a model is meant to be asked with, read from its GGUF (pure: no engine).

llama.cpp's converter can store the publisher's recommendation as `general.sampling.*`
keys (`temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`, `penalty_last_n`). Many GGUFs
predate those keys; for the models Sangama bundles the model card's own recommendation
stands in, and anything else gets settings that suit a small instruction-tuned model.

Greedy decoding with no penalty is a poor default for chat: a small model falls into a
loop at once ("L'Etoile, la Marseillaise, ..." for 256 tokens) where light sampling with a
mild repetition penalty answers the question.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.types import SamplingParams

__all__ = [
    "FALLBACK",
    "GREEDY",
    "KNOWN_MODELS",
    "RecommendedSampling",
    "SamplingChoice",
    "recommended_sampling",
]

MetadataLookup = Callable[[str], object | None]
"""A GGUF metadata key -> its value (str, int or float), or None where absent."""

FALLBACK = SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1)
"""For a model that recommends nothing: light sampling, a mild repetition penalty."""

GREEDY = SamplingParams()
"""The one-switch-away alternative: the most likely token every time, no penalty."""

KNOWN_MODELS: Mapping[str, SamplingParams] = {
    # SmolLM2 Instruct's model card: temperature 0.2, top_p 0.9; its GGUF has no
    # general.sampling keys. The penalty keeps the 135M model from looping on long answers.
    "smollm2": SamplingParams(temperature=0.2, top_p=0.9, repetition_penalty=1.1),
}
"""`general.basename` (lower case) -> the model card's recommendation."""

_KEYS = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "repetition_penalty": "general.sampling.penalty_repeat",
    "repetition_window": "general.sampling.penalty_last_n",
}
_INTEGER_FIELDS = frozenset({"top_k", "repetition_window"})


@dataclass(frozen=True)
class RecommendedSampling:
    params: SamplingParams
    source: str
    """Where it came from, for people: "the model file", "the model card", "Sangama's default"."""


def recommended_sampling(lookup: MetadataLookup | Mapping[str, object]) -> RecommendedSampling:
    """The model's recommended sampling: its `general.sampling.*` keys where present
    (unset fields from the fallback), else the model card's for a known model, else
    FALLBACK. Unusable values (out of range, not numbers) are ignored, never raised."""
    get: MetadataLookup = lookup.get if isinstance(lookup, Mapping) else lookup
    found: dict[str, Any] = {}
    for field, key in _KEYS.items():
        value = _number(get(key), integer=field in _INTEGER_FIELDS)
        if value is not None:
            found[field] = value
    if found:
        params = FALLBACK
        for field, value in found.items():
            try:
                params = replace(params, **{field: value})
            except ValueError:
                continue  # one bad key does not spoil the others
        return RecommendedSampling(params, "the model file")
    basename = get("general.basename")
    if isinstance(basename, str) and basename.strip().lower() in KNOWN_MODELS:
        return RecommendedSampling(KNOWN_MODELS[basename.strip().lower()], "the model card")
    return RecommendedSampling(FALLBACK, "Sangama's default")


def _number(value: object, *, integer: bool) -> float | int | None:
    """A metadata value as a number: llama.cpp hands every value over as text."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x):
        return None
    if integer:
        return int(x) if x == int(x) else None
    return x


@dataclass(frozen=True)
class SamplingChoice:
    """What a person asked for: greedy, or the model's recommendation with some fields
    set by hand (`sangama chat --temperature 0.5` keeps the recommended top-p and
    penalty). Resolved once the model's recommendation is known (after connecting)."""

    greedy: bool = False
    overrides: tuple[tuple[str, float | int], ...] = ()
    """(SamplingParams field, value) pairs; the seed may be one of them."""

    def __post_init__(self) -> None:
        known = set(SamplingParams.__dataclass_fields__)
        unknown = [name for name, _ in self.overrides if name not in known]
        if unknown:
            raise ValueError(f"not a sampling setting: {', '.join(unknown)}")

    def resolve(self, recommended: SamplingParams) -> SamplingParams:
        """The settings to sample with; raises ValueError for values out of range."""
        base = GREEDY if self.greedy else recommended
        fields: dict[str, Any] = dict(self.overrides)
        return replace(base, **fields) if fields else base
