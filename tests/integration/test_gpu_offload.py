"""The stage on a GPU through the shipped Vulkan backend, on Mesa's software Vulkan device.

CI has no GPU, but the engine wheel carries ggml's Vulkan backend and CI installs Mesa's
lavapipe, a Vulkan device that runs on the CPU. ggml ignores CPU-type Vulkan devices
unless GGML_VK_VISIBLE_DEVICES names them, so these tests name it: the blocks and their
KV cache then really live in Vulkan buffers, the capture reads a device tensor, and the
offload plan with a VRAM cap really splits a stage between device and CPU. Greedy tokens
must equal the CPU chain's (the kernels differ, so logits may differ a little).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

CHAIN = r"""
import json, sys
from core.llama_engine import stage_sizes
from core.models import resolve_model, stage_files
from core.offload import compute_reserve_bytes
from core.pipeline import LocalPipeline
from core.stage import Stage
from core.tokenizer import Tokenizer
from core.types import LayerRange, StageSpec

use_gpu, cap_blocks = sys.argv[1] == "gpu", int(sys.argv[2])
model = resolve_model("gemma-3-270m")
ranges = LayerRange.from_cuts([0, 9, 18])
manifest, paths = stage_files(model, ranges)
tok = Tokenizer.from_gguf(model)
prompt = tok.encode("The capital of France is")
tok.close()
n_ctx, n_batch, cap = 128, 32, 0
if cap_blocks:
    # Room for the reserve and exactly `cap_blocks` blocks of the first stage.
    sizes = stage_sizes(paths[0], with_head=False)
    tail = zip(sizes.block_bytes[-cap_blocks:], sizes.kv_bytes_per_token[-cap_blocks:])
    cap = compute_reserve_bytes(sizes, n_batch) + sum(b + k * n_ctx for b, k in tail) + 1
stages = [
    Stage.from_file(p, StageSpec(r, manifest.facts.n_layer, n_ctx=n_ctx, n_batch=n_batch,
                                 n_seq_max=1, use_gpu=use_gpu, device_cap_bytes=cap))
    for p, r in zip(paths, ranges)
]
pipe = LocalPipeline(stages)
pipe.open("s")
out, pos, ids = [], 0, list(prompt)
for _ in range(4):
    logits = pipe.forward("s", pos, ids)
    pos += len(ids)
    ids = [int(logits[-1].argmax())]
    out.append(ids[0])
plans = [s.engine.offload for s in pipe.stages]
print(json.dumps({
    "tokens": out,
    "devices": [p.device for p in plans],
    "layers_on_device": [p.layers_on_device for p in plans],
    "n_layer": [p.n_layer for p in plans],
    "device_bytes": [p.device_bytes for p in plans],
    "cap": cap,
}))
pipe.shutdown()
"""


def _vulkan_ready() -> str | None:
    """Why the Vulkan path cannot run here, or None."""
    from core.backends import LIB_DIR

    if not list(LIB_DIR.glob("*ggml-vulkan*")):
        return "the engine wheel was built without Vulkan (ENGINE_GPU=)"
    icds = list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json"))
    if not icds:
        return "Mesa's lavapipe is not installed (apt-get install mesa-vulkan-drivers)"
    return None


def _run(mode: str, cap_blocks: int = 0) -> dict[str, object]:
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"}
    env.pop("SANGAMA_DEVICE", None)
    out = subprocess.run(
        [sys.executable, "-c", CHAIN, mode, str(cap_blocks)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def cpu_chain() -> dict[str, object]:
    reason = _vulkan_ready()
    if reason is not None and os.environ.get("CI"):
        pytest.fail(f"CI must run the GPU path: {reason}")
    if reason is not None:
        pytest.skip(reason)
    return _run("cpu")


def test_every_stage_on_the_device_gives_the_cpu_tokens(cpu_chain: dict[str, object]) -> None:
    gpu = _run("gpu")
    assert cpu_chain["devices"] == [None, None]
    assert gpu["devices"] == ["Vulkan0", "Vulkan0"]
    assert gpu["layers_on_device"] == gpu["n_layer"] == [9, 9]
    assert gpu["tokens"] == cpu_chain["tokens"]


def test_a_vram_cap_splits_the_stage_and_is_honoured(cpu_chain: dict[str, object]) -> None:
    capped = _run("gpu", cap_blocks=3)
    layers: list[int] = list(capped["layers_on_device"])  # type: ignore[call-overload]
    first, last = layers
    assert first == 3  # the cap was sized for three of the first stage's blocks
    assert 0 < last < 9  # the last stage's blocks differ in size: partly on the device
    cap = int(capped["cap"])  # type: ignore[call-overload]
    assert all(int(b) <= cap for b in capped["device_bytes"])  # type: ignore[attr-defined]
    assert capped["tokens"] == cpu_chain["tokens"]
