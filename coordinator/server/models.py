"""The models one coordinator hosts (`sangama coordinator --model A --model B`), and each
one's placement state: its chains, the last good one kept, the routes handed to each.

The first model is the default: a route, manifest or piece asked for model "default"
means it, and a coordinator with one model behaves as it always did. Which workers each
model's placement may use is placement/fleet_split.py's pure policy; plan_keeper.Plans
owns these objects and changes them under its lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from coordinator.contract import ModelsAnswer, SwarmModel
from coordinator.errors import NotFound, PlacementError
from coordinator.server.placement import ModelSpec, NodeInfo, Plan
from coordinator.server.placement.fleet_split import split_fleet
from coordinator.server.placement.trusted_ends import with_trusted_ends
from coordinator.server.plan_store import PLAN_SETTING
from coordinator.server.remote_model import RemotePieces
from coordinator.server.routes import plan_chains
from core.manifest import Manifest

DEFAULT = "default"
"""The name that means the first hosted model."""


@dataclass(frozen=True)
class HostedModel:
    name: str
    directory: Path
    manifest: Manifest
    remote: RemotePieces | None = None
    """A model registered by URL: serves the pieces that are not in `directory` from
    their headers and the mirror (coordinator.server.remote_model)."""

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec.from_facts(self.manifest.facts)


def plan_setting(name: str) -> str:
    """The settings key that keeps `name`'s last good plan (the key column holds 64
    characters: a longer name is kept under its digest)."""
    key = f"{PLAN_SETTING}:{name}"
    if len(key) <= 64:
        return key
    return f"{PLAN_SETTING}:{hashlib.sha256(name.encode()).hexdigest()[:48]}"


@dataclass
class ModelPlan:
    """One hosted model's placement: owned by plan_keeper.Plans, changed under its lock."""

    model: HostedModel
    kept: Plan | None = None
    """The last good main chain: where the next re-plan starts, after a failed one or a
    restart, so that assignments stay put (coordinator/server/plan_store.py)."""
    plan: Plan | None = None
    """The main chain now (chains[0]); None while none can be formed."""
    chains: list[Plan] = field(default_factory=list)
    """The main chain and any more complete chains, in placement order."""
    handed: list[int] = field(default_factory=list)
    """Routes handed out per chain since its first stage's last heartbeat."""
    error: str | None = None
    """Why there is no chain."""

    @property
    def name(self) -> str:
        return self.model.name

    def placed(self) -> list[Plan]:
        """Its chains, or while none can be formed (too few healthy workers for a moment),
        the last good one: its workers keep their stages meanwhile."""
        return self.chains or ([self.kept] if self.kept is not None else [])

    def fail(self, error: str) -> None:
        self.plan, self.error, self.chains, self.handed = None, error, [], []

    def adopt(self, chains: list[Plan]) -> bool:
        """Take a re-plan's chains; True when the main chain changed and is to be kept
        in the database."""
        if [c.node_ids for c in chains] != [c.node_ids for c in self.chains]:
            self.handed = [0] * len(chains)
        self.chains, self.plan, self.error = chains, chains[0], None
        changed = self.kept is None or self.kept.stages != self.plan.stages
        self.kept = self.plan
        return changed


def models_answer(hosted: Sequence[ModelPlan]) -> ModelsAnswer:
    """GET MODELS: every hosted model, the default first, with its chains now."""
    return ModelsAnswer(
        tuple(
            SwarmModel(
                h.name,
                h.model.manifest.facts.n_layer,
                default=i == 0,
                chains=len(h.chains),
                stages=0 if h.plan is None else len(h.plan.stages),
                reason="" if h.plan is not None else (h.error or "no plan yet")[:1000],
            )
            for i, h in enumerate(hosted)
        )
    )


def check_names(models: Sequence[HostedModel]) -> None:
    """ValueError unless there is at least one model and no two share a name (or are
    called "default", which means the first)."""
    if not models:
        raise ValueError("a coordinator hosts at least one model")
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two models are called {twice[0]!r}: each --model needs its own name")
    if DEFAULT in names[1:]:
        raise ValueError(f"only the first model may be called {DEFAULT!r}")


def find(hosted: Sequence[ModelPlan], name: str) -> ModelPlan:
    """The hosted model called `name` ("default": the first); NotFound otherwise."""
    if name == DEFAULT:
        return hosted[0]
    for h in hosted:
        if h.name == name:
            return h
    served = ", ".join(repr(h.name) for h in hosted)
    raise NotFound(f"this swarm serves {served}, not {name!r}")


@dataclass(frozen=True)
class Rules:
    """The operator's placement settings (CoordinatorSettings), as placement takes them."""

    max_chains: int = 1
    spares: int = 0
    min_stages: int = 2
    sessions_per_stage: int = 64
    context_tokens: int = 1024
    trusted_ends: str = "off"


def model_chains(
    spec: ModelSpec,
    infos: Sequence[NodeInfo],
    claims: Sequence[NodeInfo],
    previous: Sequence[Plan],
    rules: Rules,
    rtt_ms: Mapping[tuple[str, str], float],
    warm: Mapping[tuple[int, int], str],
    trusted: frozenset[str],
) -> list[Plan]:
    """One model's chains on these workers (PlacementError when none fits): from their
    capacities bounded by their peers', else from their claims held to hardware (the
    model cannot be served without believing someone), with trusted ends as the
    operator asked (the main chain raises where `require` cannot be met; a further
    chain is then left out)."""

    def chains_of(nodes: Sequence[NodeInfo]) -> list[Plan]:
        chains = plan_chains(
            spec,
            nodes,
            max_chains=rules.max_chains,
            rtt_ms=rtt_ms,
            previous=previous,
            sessions_per_stage=rules.sessions_per_stage,
            context_tokens=rules.context_tokens,
            spares=rules.spares,
            min_stages=rules.min_stages,
            warm=warm,
        )
        if rules.trusted_ends == "off":
            return chains
        capacity = {i.node_id: i.capacity_bytes for i in nodes}
        kept = [with_trusted_ends(chains[0], trusted, capacity, rules.trusted_ends)]
        for extra in chains[1:]:
            try:
                kept.append(with_trusted_ends(extra, trusted, capacity, rules.trusted_ends))
            except PlacementError:
                continue
        return kept

    try:
        return chains_of(infos)
    except PlacementError:
        if list(claims) == list(infos):
            raise
        return chains_of(claims)


def place_models(
    hosted: Sequence[ModelPlan],
    infos: Sequence[NodeInfo],
    claims: Sequence[NodeInfo],
    rules: Rules,
    rtt_ms: Mapping[tuple[str, str], float],
    warm: Mapping[tuple[int, int], str],
    trusted: frozenset[str],
) -> list[list[Plan] | str]:
    """Each hosted model's chains, or why it has none: one model places on every worker
    as it always did; several split the workers first (placement/fleet_split.py), the
    spares, `warm` and further chains going to the first. Pure: reads `hosted` only."""

    Warm = Mapping[tuple[int, int], str]

    def place(h: ModelPlan, nodes: Sequence[NodeInfo], r: Rules, w: Warm) -> list[Plan] | str:
        ids = {n.node_id for n in nodes}
        mine = [c for c in claims if c.node_id in ids]
        try:
            return model_chains(h.model.spec, nodes, mine, h.placed(), r, rtt_ms, w, trusted)
        except PlacementError as exc:
            return str(exc)

    if len(hosted) == 1:
        return [place(hosted[0], infos, rules, warm)]
    by_id = {n.node_id: n for n in infos}
    held = {n: i for i, h in enumerate(hosted) for c in h.placed() for n in c.node_ids}
    one_chain = replace(rules, max_chains=1, spares=0)
    tried: dict[int, list[Plan] | str] = {}

    def chain_of(m: int, workers: tuple[str, ...]) -> tuple[str, ...] | None:
        nodes = [by_id[w] for w in workers]
        tried[m] = place(hosted[m], nodes, one_chain, warm if m == 0 else {})
        found = tried[m]
        return None if isinstance(found, str) else found[0].node_ids

    shares = split_fleet([n.node_id for n in infos], len(hosted), chain_of, held)
    out: list[list[Plan] | str] = [place(hosted[0], [by_id[w] for w in shares[0]], rules, warm)]
    for m in range(1, len(hosted)):
        # Its chain as the split found it; the spares seen beside it are the first's.
        found = tried.get(m, "no worker is left for this model")
        out.append(found if isinstance(found, str) else [replace(found[0], spares=())])
    return out
