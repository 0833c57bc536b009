"""Coverage-guided fuzzing of the frame decoder with atheris (libFuzzer), bounded:

    python tests/fuzz/frames_atheris.py -runs=20000 -max_total_time=20 [CORPUS_DIR]

Each input is one stream: its first byte picks how the rest is cut into `feed` calls on a
`FrameDecoder` (or decoded whole with `decode`). Every outcome must be a frame or a typed
`FrameError`; a decoded frame must encode to bytes that decode and encode to the same bytes
(bytes, not frames, are compared: a NaN timing is not equal to itself); what the
decoder holds back stays under one frame's cap. Anything else is a crash (libFuzzer
stops and writes the input as crash-*). tests/unit/net/wire/test_atheris.py runs this in
CI from a seed corpus of valid frames.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy  # noqa: F401  (imported before instrumenting: only the project's net is)

with atheris.instrument_imports(include=["net"]):
    from net.errors import ErrorCode, FrameError
    from net.wire import (
        Close,
        Error,
        Frame,
        FrameDecoder,
        Hello,
        Limits,
        Open,
        Ping,
        SamplingSpec,
        Step,
        Tokens,
        decode,
        encode,
    )
    from net.wire.tensors import WireDtype

LIMITS = Limits(max_frame_bytes=4096)


def seeds() -> list[bytes]:
    """Valid frames of several types, alone and back to back: where mutation starts."""
    frames: list[Frame] = [
        Hello(),
        Ping(7),
        Open("s1", "model", WireDtype.F32, SamplingSpec(0.0, 0, 1.0, 0.0, 1.0, 0, 0), "", 0, 0),
        Step("s1", 1, 0, (1, 2, 3), None, 3, 0, WireDtype.F32, (), None, (), 0),
        Step("s1", 2, 3, (), bytes(2 * 4 * 2), 2, 4, WireDtype.BF16, (), 1, (), 0),
        Tokens("s1", 1, (5,), (), 0, False, (), b""),
        Close("s1", "done"),
        Error("s1", ErrorCode.MISSING_POSITIONS, "restarted"),
    ]
    single = [encode(f, LIMITS) for f in frames]
    return [bytes([i]) + s for i, s in enumerate(single)] + [b"\x03" + b"".join(single)]


def pieces(data: bytes, how: int) -> list[bytes]:
    if how == 0:
        return [data]
    step = how % 13 + 1
    return [data[i : i + step] for i in range(0, len(data), step)]


def round_trip(frame: Frame) -> None:
    data = encode(frame, LIMITS)
    assert encode(decode(data, LIMITS), LIMITS) == data, frame


def one_input(data: bytes) -> None:
    if not data:
        return
    how, stream = data[0], data[1:]
    if how == 255:
        try:
            frame = decode(stream, LIMITS)
        except FrameError:
            return
        round_trip(frame)
        return
    decoder = FrameDecoder(LIMITS)
    try:
        for part in pieces(stream, how):
            for frame in decoder.feed(part):
                round_trip(frame)
            assert decoder.buffered <= LIMITS.max_frame_bytes
        decoder.end_of_stream()
    except FrameError:
        try:
            decoder.feed(b"")
        except FrameError:
            return  # a failed stream stays failed
        raise AssertionError("the decoder accepted bytes after refusing the stream") from None


def write_seeds(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds()):
        (directory / f"seed-{i}").write_bytes(seed)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--write-seeds":
        write_seeds(Path(sys.argv[2]))
        sys.exit(0)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
