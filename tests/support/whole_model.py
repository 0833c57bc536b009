"""The whole model's greedy tokens in this process: what a swarm's answer is checked against."""

from __future__ import annotations

from pathlib import Path

from app.lab.local_run import build_pipeline
from core.types import LayerRange


def whole_model_tokens(model: Path, n_layers: int, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt` from all `n_layers` of `model` in one stage
    (2 threads; thread counts do not change llama.cpp's CPU results)."""
    whole = build_pipeline([model], [LayerRange(0, n_layers)], n_layers, 1024, 64, 2, False)
    try:
        return list(whole.generate(prompt, n).tokens)
    finally:
        whole.shutdown()
