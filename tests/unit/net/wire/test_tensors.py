"""net.wire.tensors: f32 exact, bf16 rounding to nearest even, shapes checked."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from net.errors import ErrorCode, FrameError
from net.wire.tensors import WireDtype, decode_rows, encode_rows, rows_nbytes

pytestmark = pytest.mark.unit

F32Array = npt.NDArray[np.float32]

F32_ARRAYS = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=12),
    elements=st.floats(width=32, allow_nan=False),
)

BF16_MIN_NORMAL = 2.0**-126
BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])


def bf16(values: list[float]) -> F32Array:
    array = np.array([values], dtype=np.float32)
    data = encode_rows(array, WireDtype.BF16)
    return decode_rows(data, WireDtype.BF16, 1, len(values)).reshape(-1)


@given(F32_ARRAYS)
@settings(max_examples=200, deadline=None)
def test_f32_round_trip_is_exact(array: F32Array) -> None:
    data = encode_rows(array, WireDtype.F32)
    assert len(data) == rows_nbytes(WireDtype.F32, *array.shape) == array.size * 4
    back = decode_rows(data, WireDtype.F32, *array.shape)
    assert back.dtype == np.float32 and back.shape == array.shape
    assert back.tobytes() == array.tobytes()  # bit-exact, -0.0 included


def test_f32_wire_bytes_are_little_endian() -> None:
    assert encode_rows(np.array([[1.0]], dtype=np.float32), WireDtype.F32) == b"\x00\x00\x80\x3f"
    assert decode_rows(b"\x00\x00\x20\xc0", WireDtype.F32, 1, 1).tolist() == [[-2.5]]
    assert encode_rows(np.array([[-2.5]], dtype=np.float32), WireDtype.BF16) == b"\x20\xc0"


@given(F32_ARRAYS)
@settings(max_examples=200, deadline=None)
def test_bf16_relative_error_is_at_most_2_to_the_minus_8(array: F32Array) -> None:
    data = encode_rows(array, WireDtype.BF16)
    assert len(data) == array.size * 2
    back = decode_rows(data, WireDtype.BF16, *array.shape).astype(np.float64)
    exact = array.astype(np.float64)
    # Normal bf16 range only: subnormals lose relative precision, overflow goes to inf.
    normal = (np.abs(exact) >= BF16_MIN_NORMAL) & (np.abs(exact) <= BF16_MAX)
    err = np.abs(back[normal] - exact[normal]) / np.abs(exact[normal])
    assert np.all(err <= 2.0**-8)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1.0),
        (-2.5, -2.5),
        (0.0, 0.0),
        (65504.0, 65536.0),  # f16's max has 11 significant bits: rounds up
        (1.0 + 2.0**-8, 1.0),  # exactly halfway, 1.0 is even: down
        (1.0 + 3 * 2.0**-8, 1.0 + 2.0**-6),  # halfway, odd below: up to even
        (1.0 + 2.0**-8 + 2.0**-20, 1.0 + 2.0**-7),  # just over halfway: up
        (3.39e38, 3.3895313892515355e38),  # rounds to the largest finite bf16
        (3.4e38, float("inf")),  # past it: rounds to infinity, like every framework
        (float("inf"), float("inf")),
        (float("-inf"), float("-inf")),
        (2.0**-133, 2.0**-133),  # smallest bf16 subnormal survives
        (1.5 * 2.0**-133, 2.0**-132),  # subnormal tie, odd: up to even
        (2.5 * 2.0**-133, 2.0**-132),  # subnormal tie, even: down
        (2.0**-149, 0.0),  # smallest f32 subnormal: below half a bf16 step
        (-(2.0**-149), -0.0),
    ],
)
def test_bf16_known_values(value: float, expected: float) -> None:
    got = float(bf16([value])[0])
    assert got == expected
    assert np.signbit(got) == np.signbit(expected)


def test_bf16_nan_stays_nan_even_when_its_payload_is_in_the_dropped_half() -> None:
    payload_low = np.array([0x7F800001, 0xFF800001, 0x7FC00000], dtype=np.uint32)
    values = payload_low.view(np.float32)
    assert np.isnan(values).all()
    back = bf16(values.tolist())
    assert np.isnan(back).all()
    assert np.signbit(back).tolist() == [False, True, False]


def test_bf16_values_already_representable_are_exact() -> None:
    bits = np.arange(0, 0x7F80, 7, dtype=np.uint32) << 16  # every 7th finite positive bf16
    values = bits.view(np.float32)
    assert bf16(values.tolist()).tobytes() == values.tobytes()


@pytest.mark.parametrize("dtype", list(WireDtype))
@pytest.mark.parametrize("delta", [-1, 1, -2])
def test_wrong_length_is_bad_shape(dtype: WireDtype, delta: int) -> None:
    data = encode_rows(np.ones((3, 4), dtype=np.float32), dtype)
    bad = data[:delta] if delta < 0 else data + b"\x00" * delta
    with pytest.raises(FrameError) as info:
        decode_rows(bad, dtype, 3, 4)
    assert info.value.code is ErrorCode.BAD_SHAPE


def test_shape_must_match_the_byte_count() -> None:
    data = encode_rows(np.ones((3, 4), dtype=np.float32), WireDtype.F32)
    assert decode_rows(data, WireDtype.F32, 4, 3).shape == (4, 3)  # same count: fine
    for n_rows, width in [(3, 5), (2, 4), (-3, -4)]:
        with pytest.raises(FrameError) as info:
            decode_rows(data, WireDtype.F32, n_rows, width)
        assert info.value.code is ErrorCode.BAD_SHAPE


def test_encode_refuses_other_dtypes_and_ranks() -> None:
    with pytest.raises(FrameError) as info:
        encode_rows(np.ones((2, 2), dtype=np.float64), WireDtype.F32)
    assert info.value.code is ErrorCode.BAD_DTYPE
    with pytest.raises(FrameError) as info:
        encode_rows(np.ones(4, dtype=np.float32), WireDtype.BF16)
    assert info.value.code is ErrorCode.BAD_SHAPE


def test_decoded_rows_are_writable_copies() -> None:
    data = encode_rows(np.ones((2, 2), dtype=np.float32), WireDtype.F32)
    for dtype in WireDtype:
        payload = data if dtype is WireDtype.F32 else data[:8]
        rows = decode_rows(payload, dtype, 2, 2)
        rows[0, 0] = 5.0  # engines write into their inputs; a read-only view would raise
        assert rows.flags.c_contiguous


def test_encode_accepts_non_contiguous_views() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2]
    for dtype in WireDtype:
        back = decode_rows(encode_rows(view, dtype), dtype, 4, 3)
        assert back.tolist() == view.tolist()  # small integers are exact in bf16 too
