"""app.session.rows_refusal: the head of an ERROR that refused a step's rows."""

from __future__ import annotations

import pytest

from app.session.rows_refusal import RowsRefusal, rows_refusal, rows_refused_message

pytestmark = pytest.mark.unit


def test_the_refusal_reads_back_from_its_message() -> None:
    message = rows_refused_message(RowsRefusal("zero-row", 12), "step 3: row 0 is all zeros")
    assert rows_refusal(message) == (RowsRefusal("zero-row", 12), "step 3: row 0 is all zeros")


@pytest.mark.parametrize(
    "message",
    [
        "next stage replaced",
        "[retry-after-ms=5 another-route=1] busy",
        "[rows-refused check=Zero from-layer=1] x",
        "[rows-refused check=zero-row from-layer=-1] x",
        "see [rows-refused check=zero-row from-layer=1]",
    ],
)
def test_other_messages_carry_no_refusal(message: str) -> None:
    assert rows_refusal(message) == (None, message)


def test_a_name_that_would_not_read_back_is_refused() -> None:
    with pytest.raises(ValueError):
        rows_refused_message(RowsRefusal("bad name]", 1), "why")
