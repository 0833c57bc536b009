"""Hidden-state rows as wire bytes: f32 (exact) or bf16 (half the bytes), little-endian.

bf16 is the upper half of an f32 with the dropped half rounded to nearest, ties to even,
the rounding every major framework uses; values past bf16's range round to infinity.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import numpy.typing as npt

from net.errors import ErrorCode, FrameError

F32Array = npt.NDArray[np.float32]

_F32_LE = np.dtype("<f4")
_U16_LE = np.dtype("<u2")


class WireDtype(IntEnum):
    """How hidden states are packed; the value is the byte sent on the wire."""

    F32 = 1
    BF16 = 2

    @property
    def itemsize(self) -> int:
        return 4 if self is WireDtype.F32 else 2


def rows_nbytes(dtype: WireDtype, n_rows: int, width: int) -> int:
    """Bytes that `n_rows` rows of `width` values take on the wire."""
    return n_rows * width * dtype.itemsize


def encode_rows(array: F32Array, dtype: WireDtype) -> bytes:
    """An (n, width) float32 array as wire bytes."""
    if array.dtype != np.float32:
        raise FrameError(ErrorCode.BAD_DTYPE, f"rows must be float32, got {array.dtype}")
    if array.ndim != 2:
        raise FrameError(ErrorCode.BAD_SHAPE, f"rows must be 2-D, got shape {array.shape}")
    if dtype is WireDtype.F32:
        return array.astype(_F32_LE, copy=False).tobytes()
    return _to_bf16_bits(array).astype(_U16_LE, copy=False).tobytes()


def decode_rows(data: bytes, dtype: WireDtype, n_rows: int, width: int) -> F32Array:
    """Wire bytes back to a fresh, writable (n_rows, width) float32 array."""
    if n_rows < 0 or width < 0:
        raise FrameError(ErrorCode.BAD_SHAPE, f"negative shape ({n_rows}, {width})")
    expected = rows_nbytes(dtype, n_rows, width)
    if len(data) != expected:
        raise FrameError(
            ErrorCode.BAD_SHAPE,
            f"{len(data)} bytes for {n_rows} x {width} {dtype.name} rows (expected {expected})",
        )
    if dtype is WireDtype.F32:
        flat = np.frombuffer(data, dtype=_F32_LE).astype(np.float32)
    else:
        bits = np.frombuffer(data, dtype=_U16_LE).astype(np.uint32) << np.uint32(16)
        flat = bits.view(np.float32)
    return flat.reshape(n_rows, width)


def _to_bf16_bits(array: F32Array) -> npt.NDArray[np.uint16]:
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even, and carries
    # into the exponent when needed; uint32 cannot overflow for any non-NaN input.
    # In-place steps: each temporary of a large array costs as much as the arithmetic.
    out = bits >> np.uint32(16)
    out &= np.uint32(1)
    out += bits
    out += np.uint32(0x7FFF)
    out >>= np.uint32(16)
    nan = np.isnan(array)
    if nan.any():
        # A NaN whose payload sits in the dropped half would round to infinity (or wrap):
        # keep it a quiet NaN of the same sign instead.
        out[nan] = (bits[nan] >> np.uint32(16)) | np.uint32(0x0040)
    return out.astype(np.uint16)
