"""A worker that lies on purpose, for tests only: never shipped in the installers.

The installers leave this module out (installers/linux/build.py and
installers/windows/stage.py, TEST_ONLY), and the worker imports it only when
`SANGAMA_TEST_LIE` is set in its environment (app.serving.worker). It changes the
hidden-state rows a stage sends on, on a seeded random choice of steps, so tests can
show what the next stage's checks (app.serving.steps.row_checks) and spot checks catch:

    SANGAMA_TEST_LIE=flip    one high exponent bit of one value in a random row
                             (a value below 2 becomes huge or infinite)
    SANGAMA_TEST_LIE=noise   small noise on every row (a plausible lie)
    SANGAMA_TEST_LIE=swap    another session's latest rows, where there is one
    SANGAMA_TEST_LIE=zeros   every row zero
    SANGAMA_TEST_LIE_RATE    the share of steps lied on (0 to 1; default 1)
    SANGAMA_TEST_LIE_SEED    the random choice's seed (default 0)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np
import numpy.typing as npt

from app.serving.worker import TEST_LIE_ENV as LIE_ENV
from net import wire
from net.wire.tensors import WireDtype, decode_rows, encode_rows

RATE_ENV = "SANGAMA_TEST_LIE_RATE"
SEED_ENV = "SANGAMA_TEST_LIE_SEED"

KEPT_SESSIONS = 16
"""Sessions whose latest honest rows are kept for `swap`."""

NOISE_SCALE = 1e-3
"""Noise's standard deviation, relative to each row's RMS."""

_HIGH_EXPONENT_BIT = np.uint32(1 << 30)

F32 = npt.NDArray[np.float32]


class LieKind(Enum):
    FLIP = "flip"
    NOISE = "noise"
    SWAP = "swap"
    ZEROS = "zeros"


@dataclass(frozen=True)
class LieSettings:
    kind: LieKind
    rate: float = 1.0
    seed: int = 0


def settings_from_env(env: Mapping[str, str]) -> LieSettings | None:
    """The lie `env` asks for, None where `SANGAMA_TEST_LIE` is unset or empty;
    ValueError for a kind, rate or seed it cannot be."""
    kind = env.get(LIE_ENV, "").strip()
    if not kind:
        return None
    rate = float(env.get(RATE_ENV, "1"))
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{RATE_ENV} must be in [0, 1], not {rate}")
    return LieSettings(LieKind(kind), rate, int(env.get(SEED_ENV, "0")))


def flip_high_bit(rows: F32, row: int) -> None:
    """Flip the high exponent bit of the largest value below 2 in `row` (in place): the
    value is multiplied by 2^128, so it becomes infinite or NaN-like huge; a row with no
    such value gets its first value's bit flipped."""
    magnitudes = np.abs(rows[row])
    small = np.where((magnitudes < 2.0) & (magnitudes > 0.0), magnitudes, -1.0)
    column = int(np.argmax(small)) if small.max() > 0.0 else 0
    rows.view(np.uint32)[row, column] ^= _HIGH_EXPONENT_BIT


class Liar:
    """Changes a seeded random share of the steps a stage sends on (`tamper`)."""

    def __init__(self, settings: LieSettings) -> None:
        self.settings = settings
        self._rng = np.random.default_rng(settings.seed)
        self._latest: OrderedDict[str, F32] = OrderedDict()
        """Per session, its latest honest rows (for `swap`), the newest last."""
        self.lies = 0
        """Steps changed so far."""

    def tamper(self, step: wire.Step) -> wire.Step:
        """`step` as this stage sends it on: changed where the seeded draw says so."""
        if step.hidden is None or step.n_rows == 0:
            return step
        dtype = WireDtype(step.wire_dtype)
        honest = decode_rows(step.hidden, dtype, step.n_rows, step.width)
        lie = bool(self._rng.random() < self.settings.rate)
        told = self._lie(step.session, honest.copy()) if lie else None
        self._keep(step.session, honest)
        if told is None:
            return step
        self.lies += 1
        return replace(step, hidden=encode_rows(told, dtype))

    def _lie(self, session: str, rows: F32) -> F32 | None:
        kind = self.settings.kind
        if kind is LieKind.ZEROS:
            return np.zeros_like(rows)
        if kind is LieKind.FLIP:
            flip_high_bit(rows, int(self._rng.integers(rows.shape[0])))
            return rows
        if kind is LieKind.NOISE:
            rms = np.sqrt(np.mean(np.square(rows, dtype=np.float64), axis=1, keepdims=True))
            noise = self._rng.normal(0.0, 1.0, rows.shape) * rms * NOISE_SCALE
            noisy: F32 = (rows + noise).astype(np.float32)
            return noisy
        others = [s for s in self._latest if s != session]
        if not others:
            return None  # swap: no other session's rows to send
        theirs = self._latest[others[int(self._rng.integers(len(others)))]]
        n = rows.shape[0]
        if theirs.shape[0] >= n:
            return theirs[-n:].copy()
        repeated: F32 = np.repeat(theirs[-1:], n, axis=0)
        return repeated

    def _keep(self, session: str, rows: F32) -> None:
        self._latest[session] = rows
        self._latest.move_to_end(session)
        while len(self._latest) > KEPT_SESSIONS:
            self._latest.popitem(last=False)
