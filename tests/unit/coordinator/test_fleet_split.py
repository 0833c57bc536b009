"""One fleet, several models: placement/fleet_split.py's pure split, and each model's
chains from its share (coordinator/server/models.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from coordinator.errors import NotFound
from coordinator.server.models import ModelPlan, Rules, find, place_models, plan_setting
from coordinator.server.placement import ModelSpec, NodeInfo
from coordinator.server.placement.fleet_split import ChainOf, split_fleet

pytestmark = pytest.mark.unit

UNIT = 100 * 2**20


def first_k(k: list[int]) -> ChainOf:
    """A stand-in for placement: each model's chain is the first k[m] workers offered."""

    def chain_of(m: int, workers: tuple[str, ...]) -> tuple[str, ...] | None:
        return workers[: k[m]] if len(workers) >= k[m] else None

    return chain_of


def test_each_model_in_turn_takes_its_chain_and_the_spares_go_to_the_first() -> None:
    workers = [f"w{i}" for i in range(7)]
    shares = split_fleet(workers, 2, first_k([2, 3]))
    assert shares == (("w0", "w1", "w5", "w6"), ("w2", "w3", "w4"))
    # One model: the whole fleet, as a coordinator with one model always placed.
    assert split_fleet(workers, 1, first_k([2])) == (tuple(workers),)


def test_the_first_model_is_served_first_when_the_fleet_is_short() -> None:
    shares = split_fleet(["a", "b", "c"], 2, first_k([2, 2]))
    assert shares == (("a", "b", "c"), ())  # the second waits; c is a spare meanwhile
    # Nor does a model the fleet cannot hold keep the next from being served.
    assert split_fleet(["a", "b"], 2, first_k([5, 2])) == ((), ("a", "b"))


def test_a_replan_leaves_another_models_chain_alone_while_free_workers_do() -> None:
    # Model 1 serves on a, b; model 0 lost its stage and c, d are free: it takes those.
    held = {"a": 1, "b": 1, "x": 0}
    shares = split_fleet(["a", "b", "c", "d", "x"], 2, first_k([2, 2]), held)
    assert shares == (("c", "d", "x"), ("a", "b"))
    # Without free workers the first model takes what it needs (it is served first).
    shares = split_fleet(["a", "b", "x"], 2, first_k([2, 2]), held)
    assert "a" in shares[0] and shares[1] == ()


def test_a_model_losing_a_stage_takes_a_shared_spare() -> None:
    held = {"a": 0, "b": 0, "c": 1}  # d was the first model's spare; c's partner died
    shares = split_fleet(["a", "b", "c", "d"], 2, first_k([2, 2]), held)
    assert set(shares[0]) == {"a", "b"} and set(shares[1]) == {"c", "d"}


def test_no_model_is_refused() -> None:
    with pytest.raises(ValueError):
        split_fleet(["a"], 0, first_k([1]))


# ---------------------------------------------------------------- with real placement


def spec(n_layer: int) -> ModelSpec:
    return ModelSpec(
        n_layer=n_layer,
        bytes_per_layer=(UNIT,) * n_layer,
        kv_bytes_per_token_per_layer=(0,) * n_layer,
        embedding_bytes=UNIT,
        head_bytes=UNIT,
    )


@dataclass(frozen=True)
class _Model:
    name: str
    spec: ModelSpec


def hosted(*models: tuple[str, int]) -> list[ModelPlan]:
    return [ModelPlan(_Model(name, spec(n)), kept=None) for name, n in models]  # type: ignore[arg-type]


RULES = Rules(min_stages=2, sessions_per_stage=1, context_tokens=16)


def place(plans: list[ModelPlan], infos: list[NodeInfo], rules: Rules = RULES) -> list[Any]:
    return place_models(plans, infos, infos, rules, {}, {}, frozenset())


def test_two_models_get_disjoint_chains_and_the_first_the_spares() -> None:
    infos = [NodeInfo(f"n{i}", 12 * UNIT) for i in range(5)]
    a, b = place(hosted(("a", 8), ("b", 4)), infos)
    assert isinstance(a, list) and isinstance(b, list)
    assert len(a[0].stages) == 2 and len(b[0].stages) == 2
    assert not set(a[0].node_ids) & set(b[0].node_ids)
    assert b[0].stages[-1].layers.stop == 4 and a[0].stages[-1].layers.stop == 8
    assert len(a[0].spares) == 1 and b[0].spares == ()


def test_a_second_model_without_workers_says_why_and_the_first_keeps_its_chain() -> None:
    infos = [NodeInfo(f"n{i}", 12 * UNIT) for i in range(3)]
    a, b = place(hosted(("a", 8), ("b", 4)), infos)
    assert isinstance(a, list) and len(a[0].stages) == 2
    assert isinstance(b, str) and b


def test_one_model_places_as_before() -> None:
    infos = [NodeInfo(f"n{i}", 12 * UNIT) for i in range(4)]
    (alone,) = place(hosted(("a", 8)), infos, Rules(max_chains=2, min_stages=2))
    assert isinstance(alone, list) and len(alone) == 2  # both chains: every worker is its


def test_a_replan_keeps_both_chains_where_they_are() -> None:
    infos = [NodeInfo(f"n{i}", 12 * UNIT) for i in range(5)]
    plans = hosted(("a", 8), ("b", 4))
    first = place(plans, infos)
    for h, chains in zip(plans, first, strict=True):
        assert isinstance(chains, list)
        h.adopt(chains)
    again = place(plans, list(reversed(infos)))
    assert [[c.node_ids for c in x] for x in again] == [[c.node_ids for c in x] for x in first]


def test_names_default_and_plan_keys() -> None:
    plans = hosted(("a", 8), ("b", 4))
    assert find(plans, "default") is plans[0] and find(plans, "b") is plans[1]
    with pytest.raises(NotFound, match="serves 'a', 'b', not 'c'"):
        find(plans, "c")
    assert plan_setting("b") == "last_plan:b"
    long = plan_setting("x" * 128)
    assert len(long) <= 64 and long != plan_setting("y" * 128)


def test_a_failed_model_keeps_its_last_good_chain_for_its_workers() -> None:
    (h,) = hosted(("a", 8))
    assert h.placed() == []
    infos = [NodeInfo(f"n{i}", 12 * UNIT) for i in range(2)]
    (chains,) = place([h], infos)
    assert isinstance(chains, list) and h.adopt(chains)
    h.fail("waiting for workers")
    assert h.plan is None and h.placed() == [chains[0]]
