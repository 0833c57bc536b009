"""The soak's chaos policy (bench/soak_chaos.py): seeded and pure, it never kills a worker
the swarm could not do without, and it spreads its faults over every kind it may kill."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.soak_chaos import ChaosPolicy, Situation, Target, next_fault, plan

pytestmark = pytest.mark.unit

FULL = Situation(chain=("w0", "w1", "w2"), spares=("w3", "w4"), relay_up=True)
POLICY = ChaosPolicy()


def test_the_same_seed_and_situation_give_the_same_faults() -> None:
    assert plan(7, 50, FULL, POLICY) == plan(7, 50, FULL, POLICY)
    assert plan(7, 50, FULL, POLICY) != plan(8, 50, FULL, POLICY)
    assert next_fault(7, 12, FULL, POLICY) == plan(7, 50, FULL, POLICY)[12]


def test_every_kind_is_hit_and_chain_workers_most() -> None:
    faults = [f for f in plan(1, 400, FULL, POLICY) if f is not None]
    kinds = Counter(f.kind for f in faults)
    assert set(kinds) == set(Target)
    assert kinds[Target.CHAIN_WORKER] > kinds[Target.COORDINATOR] > 0
    assert {f.name for f in faults if f.kind is Target.CHAIN_WORKER} == set(FULL.chain)
    for f in faults:
        assert POLICY.down_s[0] <= f.down_s <= POLICY.down_s[1]
        assert POLICY.gap_s[0] <= f.gap_s <= POLICY.gap_s[1]


def test_no_worker_is_killed_when_the_rest_could_not_form_a_chain() -> None:
    thin = Situation(chain=("w0", "w1", "w2"), spares=())  # 3 workers, 3 stages
    faults = [f for f in plan(2, 100, thin, POLICY) if f is not None]
    assert faults and all(f.kind is Target.COORDINATOR for f in faults)
    assert next_fault(2, 0, Situation(("w0", "w1", "w2"), (), coordinator_up=False), POLICY) is None


def test_no_relay_fault_without_a_relay() -> None:
    faults = plan(3, 200, Situation(FULL.chain, FULL.spares), POLICY)
    assert all(f is not None and f.kind is not Target.RELAY for f in faults)


def test_coordinator_every_n_rounds_kills_it_then_and_only_when_up() -> None:
    policy = ChaosPolicy(coordinator_every=4)
    faults = plan(5, 12, FULL, policy)
    for r in (3, 7, 11):
        fault = faults[r]
        assert fault is not None and fault.kind is Target.COORDINATOR
    down = Situation(FULL.chain, FULL.spares, coordinator_up=False)
    fault = next_fault(5, 3, down, policy)
    assert fault is not None and fault.kind is not Target.COORDINATOR


def test_relay_every_kills_the_relay_on_its_rounds_and_only_while_it_is_up() -> None:
    policy = ChaosPolicy(relay_every=3, relay_down_s=(0.5, 1.0))
    faults = plan(1, 9, FULL, policy)
    for r in (2, 5, 8):
        fault = faults[r]
        assert fault is not None and fault.kind is Target.RELAY
        assert 0.5 <= fault.down_s <= 1.0  # a supervisor's quick restart, not down_s
    down = Situation(chain=FULL.chain, spares=FULL.spares, relay_up=False)
    assert all(f is None or f.kind is not Target.RELAY for f in plan(1, 30, down, policy))
