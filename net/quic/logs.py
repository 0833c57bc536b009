"""What the QUIC libraries log, at the level a person should see it.

qh3 logs every connection the peer closes as `WARNING quic: Native peer close: (...)`,
including the ordinary ones: a client's reachability probe ending ("probe done"), a
session's link closed after its answer. Nothing there asks anything of a person, and the
link's own code reports closes that matter; so those records become DEBUG, shown only
when the "quic" logger is enabled for DEBUG (`sangama -v`).
"""

from __future__ import annotations

import logging

QUIC_LOGGER = "quic"
"""The logger both qh3 and aioquic write to."""
_EXPECTED = ("Native peer close",)


class ExpectedClosesToDebug(logging.Filter):
    """A peer's close as a DEBUG record: dropped unless "quic" logs at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not str(record.msg).startswith(_EXPECTED):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # The logger's level was checked for WARNING before this filter ran; the
        # handlers take any level, so the DEBUG check is made here.
        return logging.getLogger(QUIC_LOGGER).isEnabledFor(logging.DEBUG)


def quiet_expected_closes() -> None:
    """Put the filter on the "quic" logger, once (imported QUIC modules call this)."""
    quic = logging.getLogger(QUIC_LOGGER)
    if not any(isinstance(f, ExpectedClosesToDebug) for f in quic.filters):
        quic.addFilter(ExpectedClosesToDebug())
