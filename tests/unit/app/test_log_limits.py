"""Warnings a person reads: the same one at most once per interval with a count of the
rest, and the QUIC library's ordinary peer closes out of sight."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from app.log_limits import RepeatFilter, limit_repeats
from net.quic.logs import QUIC_LOGGER, ExpectedClosesToDebug, quiet_expected_closes

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, Clock]]:
    """A logger writing "LEVEL message" lines to a string, through a RepeatFilter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    clock = Clock()
    handler.addFilter(RepeatFilter(60.0, clock))
    logger = logging.getLogger("test.log_limits")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out, clock
    logger.removeHandler(handler)


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_warning_every_half_second_is_shown_once_a_minute_with_its_count(
    logged: tuple[logging.Logger, io.StringIO, Clock],
) -> None:
    logger, out, clock = logged
    for i in range(240):  # two minutes of a failing heartbeat, two a second
        logger.warning("heartbeat failed: %s", f"attempt {i}")
        clock.now += 0.5
    shown = lines(out)
    assert len(shown) == 2, shown
    assert shown[0] == "WARNING heartbeat failed: attempt 0"
    assert (
        shown[1]
        == "WARNING heartbeat failed: attempt 120 (119 more like it since it was last shown)"
    )


def test_keys_are_separate_and_debug_and_info_are_never_held(
    logged: tuple[logging.Logger, io.StringIO, Clock],
) -> None:
    logger, out, _clock = logged
    for _ in range(10):
        logger.warning("heartbeat failed: %s", "x")
        logger.warning("signalling: %s", "y")
        logger.info("serving %s", "layers 0-3")
        logger.debug("step")
    shown = lines(out)
    assert shown.count("WARNING heartbeat failed: x") == 1
    assert shown.count("WARNING signalling: y") == 1
    assert shown.count("INFO serving layers 0-3") == 10 and shown.count("DEBUG step") == 10


def test_limit_repeats_puts_one_filter_on_a_handler() -> None:
    handler = logging.StreamHandler(io.StringIO())
    first = limit_repeats(handler)
    assert limit_repeats(handler) is first
    assert sum(isinstance(f, RepeatFilter) for f in handler.filters) == 1


def _record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    args = (("peer_closed", 1, 0, 0, b"probe done"),)
    return logging.LogRecord(QUIC_LOGGER, level, "qh3", 1, msg, args, None)


def test_a_peer_closing_a_probe_link_is_debug_not_a_warning() -> None:
    quic = logging.getLogger(QUIC_LOGGER)
    before = quic.level
    quiet = ExpectedClosesToDebug()
    try:
        quic.setLevel(logging.WARNING)
        close = _record("Native peer close: %r")
        assert not quiet.filter(close) and close.levelname == "DEBUG"
        quic.setLevel(logging.DEBUG)  # sangama -v
        assert quiet.filter(_record("Native peer close: %r"))
        quic.setLevel(logging.WARNING)
        error = _record("Native protocol error: %r")
        assert quiet.filter(error) and error.levelname == "WARNING"
    finally:
        quic.setLevel(before)


def test_the_quic_logger_counts_no_warning_for_closes_once_quieted() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    quic = logging.getLogger(QUIC_LOGGER)
    before = quic.level
    quic.addHandler(handler)
    quic.setLevel(logging.WARNING)
    try:
        quiet_expected_closes()
        quiet_expected_closes()  # once, however often the QUIC modules are imported
        assert sum(isinstance(f, ExpectedClosesToDebug) for f in quic.filters) == 1
        for _ in range(100):
            quic.warning("Native peer close: %r", ("peer_closed", 1, 0, 0, b"probe done"))
        quic.warning("Native protocol error: %r", ("protocol_error", 10, 0, "bad frame"))
        assert out.getvalue().count("\n") == 1 and "protocol error" in out.getvalue()
    finally:
        quic.removeHandler(handler)
        quic.setLevel(before)
