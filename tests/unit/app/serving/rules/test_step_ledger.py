"""app.serving.rules.step_ledger and app.serving.steps.recompute: what a stage keeps of
its steps for spot checks (a chain pumped in memory, tests/support/pump.py), that a
fresh stage of the same layers recomputes the same digests from it, and the ledger's
bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.serving.rules.step_ledger import LedgerLimits, StepLedger
from app.serving.steps.batch import StageSteps
from app.serving.steps.recompute import recompute
from coordinator.spot_checks import (
    HIDDEN,
    MAX_CHECK_STEPS,
    TOKENS,
    CheckRecord,
    CheckStep,
    digest,
)
from core.stage import Stage
from core.types import LayerRange, StageSpec
from tests.support.pump import Chain, ChainEngine, prompt_of

pytestmark = pytest.mark.unit

CUTS = [0, 2, 4, 6]
MISLEADING = [1, 2, 4, 3, 3, 2, 1, 4, 1, 2, 1, 4, 1, 2]
"""A prompt whose n-grams guess wrong: some guesses are rejected and cut."""


def _answered(guesses: int = 0) -> Chain:
    chain = Chain(CUTS)
    chain.client.open("a", MISLEADING if guesses else prompt_of(12), 16, guesses=guesses)
    chain.pump()
    assert chain.client.answers["a"].finished
    return chain


def _fresh_steps(start: int, stop: int) -> StageSteps:
    """A stage of the same layers on another node: nothing in its cache."""
    spec = StageSpec(LayerRange(start, stop), CUTS[-1], n_ctx=512, n_batch=64, n_seq_max=4)
    return StageSteps(Stage(ChainEngine(spec.is_first, spec.is_last), spec), True, False)


def _whole(ledger: StepLedger, session: str) -> CheckRecord:
    ((name, steps),) = [o for o in ledger.offered() if o[0] == session]
    record = ledger.check_record(name, steps)
    assert record is not None
    return record


def test_stages_before_the_last_record_each_step_and_agree_along_the_chain() -> None:
    chain = _answered(guesses=3)
    first, middle = (_whole(h.core.ledger, "a") for h in chain.hosts[:2])
    assert chain.last.core.ledger.offered() == ()  # its answer depends on sampling too
    # ... but it counts the steps it saw, as many as the stage before it sent on: the
    # coordinator samples that stage's checks from this list, which it cannot edit.
    assert chain.last.core.ledger.witnessed() == (("a", len(middle.steps)),)
    assert first.steps[0].start == 0 and first.steps[0].kind == TOKENS
    assert middle.steps[0].kind == HIDDEN
    assert not first.lies_about_itself() and not middle.lies_about_itself()
    # What the middle stage took is what the first stage says it sent, step by step.
    sent = {s.step_id: s.output_digest for s in first.steps}
    assert [s.input_digest for s in middle.steps] == [sent[s.step_id] for s in middle.steps]
    assert any(s.guesses for s in middle.steps)
    assert any(s.keep_until >= 0 for s in middle.steps)  # rejected guesses were cut


@pytest.mark.parametrize("index", [0, 1])
def test_a_fresh_stage_of_the_same_layers_recomputes_the_same_digests(index: int) -> None:
    chain = _answered(guesses=3)
    record = _whole(chain.hosts[index].core.ledger, "a")
    steps = _fresh_steps(CUTS[index], CUTS[index + 1])
    found = recompute(steps, record, "check-1")
    assert not found.refused
    assert found.digests == tuple(s.output_digest for s in record.steps)
    assert steps.stage.sessions == []  # the check's sequence is freed


def test_rows_changed_in_a_record_change_the_recomputed_digest_from_that_step() -> None:
    chain = _answered()
    record = _whole(chain.hosts[0].core.ledger, "a")
    bad = bytearray(record.steps[1].rows)
    bad[0] ^= 1
    forged = replace(record.steps[1], rows=bytes(bad), input_digest=digest(bytes(bad)))
    lied = CheckRecord("a", (record.steps[0], forged, *record.steps[2:]))
    found = recompute(_fresh_steps(0, 2), lied, "check-1")
    claimed = tuple(s.output_digest for s in record.steps)
    assert found.digests[0] == claimed[0]
    assert found.digests[1] != claimed[1]


def test_the_last_stage_does_not_recompute() -> None:
    chain = _answered()
    record = _whole(chain.hosts[0].core.ledger, "a")
    assert recompute(_fresh_steps(4, 6), record, "check-1").refused


def _step(start: int, size: int = 8, step_id: int = 0) -> CheckStep:
    rows = bytes(size)
    return CheckStep(
        step_id, start, size // 4, -1, 0, False, TOKENS, 0, 0, 0, rows, digest(rows), digest(b"")
    )


def test_a_session_is_recorded_only_from_position_zero() -> None:
    ledger = StepLedger()
    ledger.record("late", _step(5))
    ledger.record("late", _step(7))
    ledger.record("fresh", _step(0))
    assert ledger.offered() == (("fresh", 1),)
    ledger.refuse("fresh")  # its KV was adopted: what it holds is not its own steps
    ledger.record("fresh", _step(2))
    assert ledger.offered() == ()


def test_the_oldest_session_goes_first_by_count_and_by_bytes() -> None:
    ledger = StepLedger(LedgerLimits(sessions=2, bytes=40, bytes_per_session=40))
    for name in ("a", "b", "c"):
        ledger.record(name, _step(0))
    assert [n for n, _ in ledger.offered()] == ["c", "b"]
    ledger.record("b", _step(2, size=8, step_id=1))  # b heard of last: c is the oldest now
    ledger.record("d", _step(0, size=24))
    assert [n for n, _ in ledger.offered()] == ["d", "b"]
    assert ledger.bytes <= 40


def test_a_session_past_its_cap_keeps_its_prefix_and_records_no_more() -> None:
    ledger = StepLedger(LedgerLimits(steps_per_session=2))
    for i in range(4):
        ledger.record("a", _step(2 * i, step_id=i))
    record = ledger.check_record("a", 2)
    assert record is not None and [s.step_id for s in record.steps] == [0, 1]
    assert ledger.check_record("a", 3) is None
    assert ledger.check_record("nobody", 1) is None


def test_a_witness_count_stops_where_a_check_and_a_heartbeat_do() -> None:
    ledger = StepLedger(LedgerLimits())
    ledger.witness("long", 0)
    for start in range(1, 400):
        ledger.witness("long", start)
    ledger.witness("middle", 7)  # heard of from the middle: not counted
    assert ledger.witnessed() == (("long", MAX_CHECK_STEPS),)
