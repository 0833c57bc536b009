"""A model's recommended sampling: its GGUF keys, else its model card, else a default."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.sampling_defaults import FALLBACK, GREEDY, SamplingChoice, recommended_sampling
from core.types import SamplingParams


def test_gguf_sampling_keys_win_and_arrive_as_text() -> None:
    meta = {
        "general.basename": "smollm2",
        "general.sampling.temp": "0.6",
        "general.sampling.top_k": "20",
        "general.sampling.top_p": "0.95",
        "general.sampling.penalty_repeat": "1.05",
    }
    found = recommended_sampling(meta)
    assert found.source == "the model file"
    assert found.params == SamplingParams(
        temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.05
    )


def test_fields_the_file_leaves_out_come_from_the_fallback() -> None:
    found = recommended_sampling({"general.sampling.temp": 1.0})
    assert found.params.temperature == 1.0
    assert found.params.top_p == FALLBACK.top_p
    assert found.params.repetition_penalty == FALLBACK.repetition_penalty


def test_unusable_values_are_ignored_not_raised() -> None:
    found = recommended_sampling(
        {
            "general.sampling.temp": "warm",
            "general.sampling.top_p": "7",  # outside (0, 1]
            "general.sampling.top_k": "2.5",
            "general.sampling.min_p": "0.05",
        }
    )
    assert found.params == SamplingParams(
        temperature=FALLBACK.temperature, top_p=0.9, min_p=0.05, repetition_penalty=1.1
    )


def test_a_known_model_gets_its_model_card_and_others_the_fallback() -> None:
    smol = recommended_sampling({"general.basename": "SmolLM2"})
    assert smol.source == "the model card"
    assert smol.params.temperature == 0.2 and smol.params.top_p == 0.9
    other = recommended_sampling(lambda _key: None)
    assert other.params == FALLBACK
    assert other.params == SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1)


def test_greedy_is_greedy() -> None:
    assert GREEDY.greedy and GREEDY.repetition_penalty == 1.0


def test_the_default_model_recommends_light_sampling(smollm2_path: Path) -> None:
    tokenizer = pytest.importorskip("core.tokenizer").Tokenizer.from_gguf(smollm2_path)
    try:
        found = tokenizer.recommended_sampling()
    finally:
        tokenizer.close()
    assert not found.params.greedy
    assert found.params.repetition_penalty > 1.0


def test_a_choice_overrides_only_what_was_given() -> None:
    recommended = SamplingParams(temperature=0.2, top_p=0.9, repetition_penalty=1.1)
    assert SamplingChoice().resolve(recommended) == recommended
    hot = SamplingChoice(overrides=(("temperature", 0.8),)).resolve(recommended)
    assert hot == SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.1)
    greedy = SamplingChoice(greedy=True, overrides=(("seed", 5),)).resolve(recommended)
    assert greedy.greedy and greedy.repetition_penalty == 1.0 and greedy.seed == 5


def test_a_choice_refuses_unknown_and_out_of_range_settings() -> None:
    with pytest.raises(ValueError, match="not a sampling setting"):
        SamplingChoice(overrides=(("warmth", 1.0),))
    with pytest.raises(ValueError):
        SamplingChoice(overrides=(("top_p", 2.0),)).resolve(FALLBACK)
