"""A worker that lies, for the spot-check tests only: put this folder first on a worker's
PYTHONPATH with SANGAMA_TEST_LIE=flip, and every hidden row a stage sends on has the
lowest bit of its first value flipped (the rows still look plausible; the answer barely
moves). Python imports `sitecustomize` at start, so nothing in the shipped code path
knows of it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

if os.environ.get("SANGAMA_TEST_LIE") == "flip":
    from app.serving.rules import stage as _stage
    from net import wire

    # The name as app.serving.rules.stage calls it (imported there from steps.replies).
    _honest = vars(_stage)["onward_step"]

    def _lying(*args: Any, **kwargs: Any) -> wire.Step:
        step: wire.Step = _honest(*args, **kwargs)
        if step.hidden:
            flipped = bytearray(step.hidden)
            flipped[0] ^= 1
            step = replace(step, hidden=bytes(flipped))
        return step

    vars(_stage)["onward_step"] = _lying
