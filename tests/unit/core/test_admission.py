"""core.admission: what a session reserves of a stage's KV, and when one is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.admission import LLAMA_MAX_SEQ, AdmissionLedger, AdmissionPolicy, kv_bytes_per_token

pytestmark = pytest.mark.unit


def test_a_stage_of_256_slots_admits_256_sessions_and_refuses_the_257th() -> None:
    # The coordinator's sizing: 256 sessions x 256 positions each, 6 KiB per position.
    policy = AdmissionPolicy(
        n_ctx=256 * 256, max_sessions=LLAMA_MAX_SEQ, kv_bytes_per_token=6144, guess_slack=0
    )
    ledger = AdmissionLedger(policy)
    for k in range(256):
        assert ledger.admit(f"s{k}", 56, 200) is None
    refusal = ledger.admit("s256", 56, 200)
    assert refusal is not None and refusal.retry_after_ms == policy.retry_after_ms
    assert refusal.try_another_route and "256 sessions" in refusal.reason
    cap = ledger.capacity()
    assert cap.sessions == 256 and cap.free_bytes == 0
    assert cap.bytes_per_session == 256 * 6144 == 1_572_864


def test_memory_full_before_slots_and_a_memory_cap_below_the_pool() -> None:
    policy = AdmissionPolicy(
        n_ctx=1000, max_sessions=8, kv_bytes_per_token=100, memory_cap_bytes=50_000
    )
    assert policy.budget_tokens == 500
    ledger = AdmissionLedger(policy)
    assert ledger.admit("a", 100, 200) is None  # 316 positions
    refusal = ledger.admit("b", 100, 200)
    assert refusal is not None and "KV memory full" in refusal.reason
    assert ledger.admit("c", 10, 100) is None  # 126: still fits beside a
    ledger.release("a")
    assert ledger.admit("b", 100, 200) is None


def test_a_prompt_that_can_never_fit_is_told_not_to_retry_here() -> None:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=128, max_sessions=4))
    refusal = ledger.admit("big", 200, 10)
    assert refusal is not None and refusal.retry_after_ms == 0 and refusal.try_another_route
    # A long answer is capped at what a session can hold: it is admitted, with the pool.
    assert ledger.admit("long", 10, 10_000) is None
    assert ledger.capacity().reserved_tokens == 128


def test_a_session_is_capped_at_its_own_stream() -> None:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=1024, max_sessions=4, session_ctx=256))
    assert ledger.admit("a", 300, 1) is not None
    assert ledger.admit("b", 100, 1000) is None
    assert ledger.capacity().reserved_tokens == 256


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionPolicy(n_ctx=10, max_sessions=257)
    with pytest.raises(ValueError):
        AdmissionPolicy(n_ctx=0, max_sessions=1)
    with pytest.raises(ValueError):
        AdmissionPolicy(n_ctx=10, max_sessions=1, kv_bytes_per_token=-1)
    assert kv_bytes_per_token([1024, 0, 2048]) == 3072


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300), st.booleans()), max_size=60))
def test_reservations_never_exceed_the_budget(ops: list[tuple[int, int, bool]]) -> None:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=2000, max_sessions=16))
    live: list[str] = []
    for k, (prompt, answer, end) in enumerate(ops):
        if end and live:
            ledger.release(live.pop(0))
        elif ledger.admit(f"s{k}", prompt, answer) is None:
            live.append(f"s{k}")
        cap = ledger.capacity()
        assert cap.reserved_tokens <= cap.budget_tokens and cap.sessions <= 16
        assert cap.sessions == len(live)
