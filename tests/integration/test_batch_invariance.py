"""A session's numbers do not depend on what shares its steps: 32 sessions of the
default model, batched through a two-stage chain the way a busy stage batches them
(prompts of different lengths in shared decodes, then one row of every session per
decode), give every session the hidden states and logits it gets alone, bit for bit.
What makes it so: a KV stream per session, and kernels whose sums do not depend on the
rows beside them (docs/decisions/batch-invariance.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from core.models import GEMMA3, default_model_path, resolve_model, stage_files
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

SESSIONS = 32
GAPS = 8
NEW = 6
CONTEXT = 64  # positions per session


def _prompt(k: int, vocab: int) -> list[int]:
    return [1 + (k * 31 + j * 17) % (vocab - 1) for j in range(3 + k % 11)]


def _digest(rows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.float32).tobytes()).hexdigest()


class _Chain:
    def __init__(
        self, paths: list[Path], ranges: list[LayerRange], n_layer: int, n: int, vocab: int
    ):
        self.vocab = vocab
        self.stages = [
            Stage.from_file(
                p, StageSpec(r, n_layer, n_ctx=CONTEXT * n, n_batch=128, n_seq_max=n, use_gpu=False)
            )
            for p, r in zip(paths, ranges, strict=True)
        ]

    def step(self, rows: dict[str, tuple[int, list[int]]]) -> dict[str, tuple[str, str, int]]:
        """One step of every session in `rows` (start, tokens), all in shared decodes:
        per session the digest of the first stage's hidden rows and of the last logits,
        and the greedy token."""
        first, last = self.stages
        reqs = [
            StepRequest(s, start, tokens=np.asarray(toks, dtype=np.int32))
            for s, (start, toks) in rows.items()
        ]
        hidden = {r.session: r for r in first.step(reqs) if isinstance(r, StepResult)}
        assert len(hidden) == len(rows)
        outs = last.step([StepRequest(s, rows[s][0], hidden=h.hidden) for s, h in hidden.items()])
        got: dict[str, tuple[str, str, int]] = {}
        for out in outs:
            assert isinstance(out, StepResult) and out.logits is not None
            h = hidden[out.session].hidden
            assert h is not None
            got[out.session] = (_digest(h), _digest(out.logits), int(np.argmax(out.logits[-1])))
        return got

    def run(self, sessions: list[str], gaps: int = 0) -> dict[str, list[tuple[str, str, int]]]:
        """Every session's prompt, then NEW greedy tokens, all sessions in lockstep. With
        `gaps`, the first sessions sit in every other slot (sessions that ended between
        them), so a decode's slots are not one consecutive run."""
        for stage in self.stages:
            for k, s in enumerate(sessions):
                if k < gaps:
                    stage.open(f"gone-{k}")
                stage.open(s)
            for k in range(gaps):
                stage.close(f"gone-{k}")
        trace: dict[str, list[tuple[str, str, int]]] = {s: [] for s in sessions}
        prompts = {s: _prompt(int(s), self.vocab) for s in sessions}
        rows = {s: (0, prompts[s]) for s in sessions}
        for _ in range(NEW):
            got = self.step(rows)
            for s, step in got.items():
                trace[s].append(step)
            rows = {s: (rows[s][0] + len(rows[s][1]), [got[s][2]]) for s in sessions}
        return trace

    def close(self) -> None:
        for stage in self.stages:
            stage.shutdown()


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("invariance") / "tiny-f32.gguf")


@pytest.mark.parametrize("which", ["default", "gemma-q4_k_m", "tiny-f32"])
def test_32_batched_sessions_get_the_hidden_states_they_get_alone(
    which: str, tiny_f32: Path
) -> None:
    # The default model's weights are Q4_1 and K-quants. Gemma's Q4_K weights are
    # repacked, whose 4-row kernel sums in another order than their one-row one; the
    # tiny model's F32 weights would go through llamafile's multi-row matmul.
    model, vocab = {
        "default": (default_model_path(), 4000),
        "gemma-q4_k_m": (resolve_model(GEMMA3), 4000),
        "tiny-f32": (tiny_f32, 512),
    }[which]
    manifest, _ = stage_files(model, [])
    n_layer = manifest.facts.n_layer
    ranges = [LayerRange(0, n_layer // 2), LayerRange(n_layer // 2, n_layer)]
    _, paths = stage_files(model, ranges)
    names = [str(k) for k in range(SESSIONS)]

    busy = _Chain(paths, ranges, n_layer, SESSIONS + GAPS, vocab)
    try:
        batched = busy.run(names, gaps=GAPS)
    finally:
        busy.close()
    alone = _Chain(paths, ranges, n_layer, 1, vocab)
    try:
        solo: dict[str, list[tuple[str, str, int]]] = {}
        for s in names:
            solo.update(alone.run([s]))
            for stage in alone.stages:
                stage.close(s)
    finally:
        alone.close()

    same = [s for s in names if batched[s] == solo[s]]
    assert len(same) == SESSIONS, f"{len(same)} of {SESSIONS} sessions as alone"


def _long_session(model: Path, threads: int) -> list[str]:
    """Digests of the logits of 12 one-row decodes after 520 positions (past 512 cells,
    where attention used to be split into one chunk per thread)."""
    spec = StageSpec(
        LayerRange(0, 8), 8, n_ctx=1024, n_batch=512, n_seq_max=1, use_gpu=False, n_threads=threads
    )
    stage = Stage.from_file(model, spec)
    try:
        stage.open("long")
        prompt = [1 + (j * 37) % 500 for j in range(520)]
        for start in (0, 512):
            chunk = np.asarray(prompt[start : start + 512], dtype=np.int32)
            (out,) = stage.step([StepRequest("long", start, tokens=chunk)])
        digests, position = [], len(prompt)
        for _ in range(12):
            assert isinstance(out, StepResult) and out.logits is not None
            digests.append(_digest(out.logits[-1]))
            token = np.asarray([int(np.argmax(out.logits[-1]))], dtype=np.int32)
            (out,) = stage.step([StepRequest("long", position, tokens=token)])
            position += 1
        return digests
    finally:
        stage.shutdown()


def test_a_long_session_gives_the_same_numbers_at_any_thread_count(tiny_f32: Path) -> None:
    # Volunteers' PCs run different thread counts; a chain is compared with the whole
    # model, and a spot check recomputes a stage's steps on another PC, bit for bit.
    one, three = _long_session(tiny_f32, 1), _long_session(tiny_f32, 3)
    assert len(one) == 12 and one == three
