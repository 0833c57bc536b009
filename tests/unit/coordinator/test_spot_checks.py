"""Spot checks on the coordinator, without IO: the shared messages read with bounds
(coordinator/spot_checks.py), the sampling and the verdict table
(coordinator/server/spot_policy.py), and a check carried through its asks
(coordinator/server/spot_book.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coordinator.errors import MalformedAnswer
from coordinator.server.spot_book import CheckUnknown, SpotBook
from coordinator.server.spot_policy import (
    Answers,
    SpotSettings,
    Verdict,
    check_due,
    first_difference,
    judge,
    pick_holder,
    pick_prefix,
)
from coordinator.spot_checks import (
    HIDDEN,
    MAX_CHECK_ROW_BYTES,
    MAX_CHECK_STEPS,
    RECOMPUTE,
    RECORD,
    CheckAsk,
    CheckDigests,
    CheckRecord,
    CheckStep,
    digest,
    read_asks,
)

pytestmark = pytest.mark.unit

A, B, C = (digest(x) for x in (b"a", b"b", b"c"))
ZEROS = digest(b"\x00" * 16)
"""The input digest of every step `_step` makes."""


def _step(step_id: int, out: str = A, rows: bytes = b"\x00" * 16) -> CheckStep:
    shape = (step_id, 2 * step_id, 2, -1, 0, False, HIDDEN, 1, 4, 1)
    return CheckStep(*shape, rows=rows, input_digest=digest(rows), output_digest=out)


def _record(*outs: str) -> CheckRecord:
    return CheckRecord("s1", tuple(_step(i, o) for i, o in enumerate(outs)))


# ---------------------------------------------------------------- messages


def test_a_record_reads_back_as_written() -> None:
    record = _record(A, B)
    assert CheckRecord.from_json(record.to_json()) == record
    ask = CheckAsk("3-checker", RECOMPUTE, "s1", 2)
    assert read_asks([ask.to_json()]) == (ask,)
    assert read_asks(None) == ()
    digests = CheckDigests((A, B), "")
    assert CheckDigests.from_json(digests.to_json()) == digests


@pytest.mark.parametrize(
    "change",
    [
        {"input_digest": "A" * 64},
        {"output_digest": "ab"},
        {"kind": "pictures"},
        {"n_rows": 0},
        {"step_id": "1"},
        {"rows": "not base64!"},
        {"rows": "AAAA" * (MAX_CHECK_ROW_BYTES // 3 + 2)},
    ],
)
def test_a_malformed_step_is_refused(change: dict[str, Any]) -> None:
    doc = _record(A).to_json()
    doc["steps"][0].update(change)
    with pytest.raises(MalformedAnswer):
        CheckRecord.from_json(doc)


def test_the_rows_of_all_steps_together_are_bounded() -> None:
    big = b"\x00" * (MAX_CHECK_ROW_BYTES // 2 + 1)
    doc = CheckRecord("s1", (_step(0, rows=big), _step(1, rows=big))).to_json()
    with pytest.raises(MalformedAnswer):
        CheckRecord.from_json(doc)


def test_a_record_whose_rows_do_not_hash_to_its_claims_lies_about_itself() -> None:
    honest = _record(A)
    assert honest.lies_about_itself() == ""
    forged = CheckRecord("s1", (replace(honest.steps[0], rows=b"\x01" * 16),))
    assert "do not hash" in forged.lies_about_itself()


def test_asks_are_bounded_in_kind_and_count() -> None:
    with pytest.raises(MalformedAnswer):
        read_asks([{"check_id": "1", "kind": "delete", "session": "s", "steps": 1}])
    with pytest.raises(MalformedAnswer):
        read_asks([CheckAsk("1", RECORD, "s", 1).to_json()] * 9)


# ---------------------------------------------------------------- sampling


def test_a_check_is_due_at_the_rate_asked_and_never_when_off() -> None:
    assert not check_due(1000, 0.0, 0.0)
    assert check_due(1, 1.0, 0.999)
    assert not check_due(0, 0.5, 0.0)
    # 1% of 100 steps: 1 - 0.99**100, about 0.634.
    assert check_due(100, 0.01, 0.63) and not check_due(100, 0.01, 0.64)
    assert check_due(1, 0.01, 0.0099) and not check_due(1, 0.01, 0.0101)


def test_every_offered_step_may_be_the_sampled_one() -> None:
    offered = [("a", 2), ("b", 3)]
    picks = [pick_prefix(offered, i / 5) for i in range(5)]
    assert picks == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("b", 3)]
    assert pick_prefix([], 0.5) is None
    assert pick_prefix(offered, 0.99999) == ("b", 3)


def test_a_holder_is_never_the_checked_node_or_one_asked_already() -> None:
    assert pick_holder(["x", "y", "z"], frozenset({"x", "y"}), 0.0) == "z"
    assert pick_holder(["x"], frozenset({"x"}), 0.5) is None


def test_digest_lists_differ_where_they_first_do() -> None:
    assert first_difference([A, B], [A, B]) == -1
    assert first_difference([A, B], [A, C]) == 1
    assert first_difference([A, B], [A]) == 1


# ---------------------------------------------------------------- the verdict table


@pytest.mark.parametrize(
    ("answers", "verdict"),
    [
        (Answers(), Verdict.PENDING),
        (Answers(record_refused="no record"), Verdict.UNVERIFIED),
        # A session its neighbour saw: an honest stage may have forgotten it, a liar
        # would hide it; shown, not marked.
        (Answers(record_refused="no record", vouched=True), Verdict.WITHHELD),
        (Answers(expired=True, vouched=True), Verdict.UNVERIFIED),
        (Answers(expired=True), Verdict.UNVERIFIED),
        (Answers(record=_record(A, B), has_checker=False), Verdict.UNVERIFIED),
        (Answers(record=_record(A, B)), Verdict.PENDING),
        (Answers(record=_record(A, B), checker=(A, B)), Verdict.HONEST),
        (Answers(record=_record(A, B), checker=(A,), checker_refused="full"), Verdict.UNVERIFIED),
        (Answers(record=_record(A, B), checker=(A, C)), Verdict.PENDING),
        (Answers(record=_record(A, B), checker=(A, C), has_third=False), Verdict.UNDECIDED),
        (Answers(record=_record(A, B), checker=(A, C), third=(A, C)), Verdict.FAULTY),
        (Answers(record=_record(A, B), checker=(A, C), third=(A, B)), Verdict.CHECKER_FAULTY),
        (Answers(record=_record(A, B), checker=(C, C), third=(B, B)), Verdict.UNDECIDED),
        (
            Answers(record=_record(A, B), checker=(A, C), third_refused="gone", expired=True),
            Verdict.UNDECIDED,
        ),
        # Its input is not what its upstream says it sent: one of the two lies.
        (Answers(record=_record(A, B), upstream_outputs={1: C}), Verdict.PENDING),
        (Answers(record=_record(A, B), upstream_outputs={1: C}, checker=(A, B)), Verdict.DISPUTED),
        (
            Answers(record=_record(A, B), upstream_outputs={1: C}, checker=(A, C), third=(A, C)),
            Verdict.FAULTY,
        ),
        (
            Answers(record=_record(A, B), upstream_outputs={1: ZEROS}, checker=(A, B)),
            Verdict.HONEST,
        ),
    ],
)
def test_the_verdict_table(answers: Answers, verdict: Verdict) -> None:
    assert judge(answers).verdict is verdict


def test_a_record_that_lies_about_itself_is_faulty_whatever_else() -> None:
    forged = CheckRecord("s1", (replace(_step(0), rows=b"\x01" * 16),))
    finding = judge(Answers(record=forged, checker=(A,)))
    assert finding.verdict is Verdict.FAULTY and finding.step_index == 0


# ---------------------------------------------------------------- a check's asks


def _book() -> SpotBook:
    return SpotBook(SpotSettings(rate=1.0, timeout_s=10), draw=lambda: 0.0)


def _kinds(book: SpotBook, node: str) -> list[tuple[str, str]]:
    return [(a.check_id, a.kind) for a in book.asks_for(node)]


def test_an_honest_stage_is_found_honest() -> None:
    book = _book()
    check = book.maybe_start("n1", [("s1", 2)], 5, "n0", ["h1", "h2"], now=0.0)
    assert check is not None and check.steps == 1  # the first step drawn: a prefix of 1
    assert _kinds(book, "n1") == [("1-record", RECORD)]
    assert _kinds(book, "n0") == [("1-upstream", RECORD)]
    record = _record(A)
    assert book.answer("n1", "1-record", {"record": record.to_json()}) is None
    assert book.asks_for("h1") == ()  # the upstream's word on the input comes first
    sent = CheckRecord("s1", (replace(_step(0), output_digest=record.steps[0].input_digest),))
    assert book.answer("n0", "1-upstream", {"record": sent.to_json()}) is None
    assert _kinds(book, "h1") == [("1-checker", RECOMPUTE)]
    assert book.inputs("h1", "1-checker") == record
    done = book.answer("h1", "1-checker", {"digests": [A]})
    assert done is not None and done.finding.verdict is Verdict.HONEST
    assert book.in_flight == 0


def test_a_lying_stage_is_caught_by_two_holders_with_the_evidence() -> None:
    book = _book()
    book.start("n1", "s1", 2, None, ["h1", "h2", "n1"], now=0.0)
    book.asks_for("n1")
    book.answer("n1", "1-record", {"record": _record(A, B).to_json()})
    assert [a.kind for a in book.asks_for("h1")] == [RECOMPUTE]
    with pytest.raises(CheckUnknown):  # only the node asked may answer
        book.answer("h2", "1-checker", {"digests": [A, C]})
    assert book.answer("h1", "1-checker", {"digests": [A, C]}) is None
    assert [a.check_id for a in book.asks_for("h2")] == ["1-third"]
    done = book.answer("h2", "1-third", {"digests": [A, C]})
    assert done is not None and done.finding.verdict is Verdict.FAULTY
    evidence = done.evidence()
    assert evidence["node"] == "n1" and evidence["session"] == "s1"
    assert evidence["step_id"] == 1 and evidence["positions"] == [2, 4]
    assert (evidence["claimed"], evidence["checker_digest"], evidence["third_digest"]) == (B, C, C)
    with pytest.raises(CheckUnknown):  # answered once
        book.answer("h2", "1-third", {"digests": [A, C]})


def test_a_check_nobody_answers_times_out_unverified() -> None:
    book = _book()
    book.start("n1", "s1", 1, None, ["h1"], now=0.0)
    assert book.expire(5.0) == []
    (done,) = book.expire(11.0)
    assert done.finding.verdict is Verdict.UNVERIFIED and book.in_flight == 0


def test_a_record_of_other_steps_than_asked_is_refused() -> None:
    book = _book()
    book.start("n1", "s1", 2, None, ["h1"], now=0.0)
    with pytest.raises(MalformedAnswer):
        book.answer("n1", "1-record", {"record": _record(A).to_json()})


def test_no_second_check_of_a_node_and_none_beyond_the_swarms_limit() -> None:
    book = SpotBook(SpotSettings(rate=1.0, max_in_flight=1), draw=lambda: 0.0)
    assert book.maybe_start("n1", [("s", 1)], 1, None, [], now=0.0) is not None
    assert book.maybe_start("n1", [("s", 1)], 1, None, [], now=0.0) is None
    assert book.maybe_start("n2", [("s", 1)], 1, None, [], now=0.0) is None
    off = SpotBook(SpotSettings(rate=0.0), draw=lambda: 0.0)
    assert off.maybe_start("n1", [("s", 1)], 1000, None, [], now=0.0) is None


def test_an_ask_never_names_more_steps_than_a_node_reads() -> None:
    book = SpotBook(SpotSettings(rate=1.0), draw=lambda: 0.999)
    check = book.maybe_start("n1", [("s", 100_000)], 1, None, [], now=0.0)
    assert check is not None and check.steps == MAX_CHECK_STEPS
    (ask,) = book.asks_for("n1")
    assert read_asks([ask.to_json()]) == (ask,)


def test_a_session_a_neighbour_saw_and_the_stage_will_not_show_is_withheld() -> None:
    book = _book()
    check = book.maybe_start("n1", [("s1", 3)], 5, "n0", ["h1"], now=0.0, vouched=True)
    assert check is not None
    assert book.answer("n1", "1-record", {"refused": "no record of s1"}) is None
    done = book.answer("n0", "1-upstream", {"refused": "no record of s1"})
    assert done is not None and done.finding.verdict is Verdict.WITHHELD
    assert book.asks_for("h1") == ()  # nothing to recompute
