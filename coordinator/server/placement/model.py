"""What placement reasons about: the model's per-layer sizes, the nodes on offer, and the
plan it returns (a chain of stages plus spares). Frozen values checked on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from core.model_sizes import RECURRENT_SNAPSHOTS
from core.types import LayerRange, ModelFacts

MIB = 1 << 20
PROCESS_OVERHEAD_BYTES = 300 * MIB
"""Per worker process beyond weights and KV: CUDA context, compute buffers, runtime."""
DEFAULT_RTT_MS = 20.0
"""Assumed for a pair of nodes nobody has measured yet."""
DEFAULT_COMPUTE_MS_PER_LAYER = 0.4


@dataclass(frozen=True)
class ModelSpec:
    """Sizes placement needs, per layer; bytes are what a stage loads into its memory."""

    n_layer: int
    bytes_per_layer: tuple[int, ...]
    kv_bytes_per_token_per_layer: tuple[int, ...]
    """K+V bytes one cached position costs in each layer (0 for recurrent layers)."""
    embedding_bytes: int
    head_bytes: int
    tied_output: bool = False
    """Informational: the last stage always loads the embedding too (see `stage_weight_bytes`)."""
    mtp_bytes: int = 0
    """Extra weights the last stage holds, e.g. Qwen3.5's MTP layer (~5.7 GB)."""
    compute_ms_per_layer: float = DEFAULT_COMPUTE_MS_PER_LAYER
    """Estimated GPU time of one layer for one token on a node of compute_speed 1.0."""
    allowed_cuts: tuple[int, ...] | None = None
    """Boundaries a stage may start or end at (0 and n_layer included), from the manifest;
    None: every boundary."""
    state_bytes_per_session_per_layer: tuple[int, ...] = ()
    """Recurrent state one admitted session holds in each layer, every copy the engine
    keeps included (live state plus snapshots); () when the model has none."""
    mtp_kv_bytes_per_token: int = 0
    """K+V per cached position of the last stage's MTP context, which is as deep
    as the trunk's KV pool."""

    def __post_init__(self) -> None:
        if self.n_layer < 1:
            raise ValueError("a model has at least one layer")
        if len(self.bytes_per_layer) != self.n_layer:
            raise ValueError(f"bytes_per_layer has {len(self.bytes_per_layer)} entries")
        if len(self.kv_bytes_per_token_per_layer) != self.n_layer:
            raise ValueError(
                f"kv_bytes_per_token_per_layer has {len(self.kv_bytes_per_token_per_layer)} entries"
            )
        state = self.state_bytes_per_session_per_layer
        if state and len(state) != self.n_layer:
            raise ValueError(f"state_bytes_per_session_per_layer has {len(state)} entries")
        sizes = (*self.bytes_per_layer, *self.kv_bytes_per_token_per_layer, *state)
        ends = (self.embedding_bytes, self.head_bytes, self.mtp_bytes)
        if min(sizes) < 0 or min(*ends, self.mtp_kv_bytes_per_token) < 0:
            raise ValueError("sizes must be >= 0")
        if not (math.isfinite(self.compute_ms_per_layer) and self.compute_ms_per_layer >= 0):
            raise ValueError("compute_ms_per_layer must be finite and >= 0")
        cuts = self.allowed_cuts
        if cuts is not None and (
            not cuts
            or cuts[0] != 0
            or cuts[-1] != self.n_layer
            or any(b <= a for a, b in pairwise(cuts))
        ):
            raise ValueError("allowed_cuts must increase strictly from 0 to n_layer")

    @property
    def cut_points(self) -> tuple[int, ...]:
        """Every boundary a stage may start or end at, 0 and n_layer included."""
        return self.allowed_cuts or tuple(range(self.n_layer + 1))

    @classmethod
    def from_facts(
        cls,
        facts: ModelFacts,
        mtp_bytes: int = 0,
        compute_ms_per_layer: float = DEFAULT_COMPUTE_MS_PER_LAYER,
        recurrent_snapshots: int = RECURRENT_SNAPSHOTS,
    ) -> ModelSpec:
        """`recurrent_snapshots`: per-token snapshots of recurrent state the workers keep
        per session (the engine's n_rs_seq); each costs one more state per session."""
        if recurrent_snapshots < 0:
            raise ValueError("recurrent_snapshots must be >= 0")
        copies = 1 + recurrent_snapshots
        return cls(
            n_layer=facts.n_layer,
            bytes_per_layer=tuple(facts.bytes_per_layer),
            kv_bytes_per_token_per_layer=tuple(facts.kv_bytes_per_token_per_layer),
            embedding_bytes=facts.embedding_bytes,
            head_bytes=facts.head_bytes,
            tied_output=facts.tied_output,
            mtp_bytes=mtp_bytes,
            compute_ms_per_layer=compute_ms_per_layer,
            allowed_cuts=facts.allowed_cuts,
            state_bytes_per_session_per_layer=tuple(
                copies * b for b in facts.recurrent_state_bytes_per_session_per_layer
            ),
            mtp_kv_bytes_per_token=facts.mtp_kv_bytes_per_token,
        )

    def stage_weight_bytes(self, layers: LayerRange) -> int:
        """Blocks, plus the embedding on the first stage, plus head, embedding and MTP layer on
        the last (embedding once if one stage is both). The last stage loads token_embd
        too, as `Manifest.pieces_for` ships it: tied heads use it, the MTP layer embeds
        its guesses, and llama.cpp sizes the vocabulary from it."""
        total = sum(self.bytes_per_layer[layers.start : layers.stop])
        if layers.start == 0:
            total += self.embedding_bytes
        if layers.stop == self.n_layer:
            total += self.head_bytes + self.mtp_bytes
            total += 0 if layers.start == 0 else self.embedding_bytes
        return total

    def stage_bytes(self, layers: LayerRange, sessions: int, context_tokens: int) -> int:
        """Memory a stage needs: weights + KV for `sessions` x `context_tokens` (and the
        MTP context's on the last stage) + recurrent state for `sessions` + overhead."""
        return (
            self.stage_weight_bytes(layers)
            + self.stage_session_bytes(layers, sessions, context_tokens)
            + PROCESS_OVERHEAD_BYTES
        )

    def stage_session_bytes(self, layers: LayerRange, sessions: int, context_tokens: int) -> int:
        """What the planned sessions cost a stage beyond its weights: the KV pool of
        `sessions` x `context_tokens` positions, the MTP context's pool on the last
        stage, and every session's recurrent state."""
        positions = sessions * context_tokens
        kv = positions * sum(self.kv_bytes_per_token_per_layer[layers.start : layers.stop])
        if layers.stop == self.n_layer:
            kv += positions * self.mtp_kv_bytes_per_token
        state = sessions * sum(self.state_bytes_per_session_per_layer[layers.start : layers.stop])
        return kv + state


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    capacity_bytes: int
    """min(the volunteer's VRAM cap, free VRAM): the caller decides, placement trusts it."""
    healthy: bool = True
    address: str = ""
    compute_speed: float = 1.0
    """Relative to the reference GPU behind `ModelSpec.compute_ms_per_layer`."""

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id must not be empty")
        if self.capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if not (math.isfinite(self.compute_speed) and self.compute_speed > 0):
            raise ValueError("compute_speed must be finite and > 0")


@dataclass(frozen=True)
class StageAssignment:
    node_id: str
    layers: LayerRange
    bytes_needed: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        return self.bytes_needed <= self.capacity_bytes


@dataclass(frozen=True)
class Plan:
    stages: tuple[StageAssignment, ...]
    """In token order: stages[0] holds layer 0."""
    spares: tuple[str, ...]
    """Healthy nodes outside the chain, by node_id."""
    estimated_trip_ms: float
    """Compute of every stage plus the RTTs between consecutive stages (client hops not
    included: the client's position is not an input)."""
    moves: int
    """Healthy nodes whose assignment (layers or none) differs from the previous plan."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a plan has at least one stage")
        if self.stages[0].layers.start != 0:
            raise ValueError("the first stage must start at layer 0")
        for s, t in pairwise(self.stages):
            if t.layers.start != s.layers.stop:
                raise ValueError(f"stages {s.layers} and {t.layers} are not contiguous")
        ids = [s.node_id for s in self.stages]
        if len(set(ids)) != len(ids) or len(set(self.spares)) != len(self.spares):
            raise ValueError("a node appears twice in the plan")
        if set(ids) & set(self.spares):
            raise ValueError("a spare is also in the chain")
        if self.moves < 0:
            raise ValueError("moves must be >= 0")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)

    def _position(self, node_id: str) -> int | None:
        return next((i for i, s in enumerate(self.stages) if s.node_id == node_id), None)

    def stage_of(self, node_id: str) -> StageAssignment | None:
        """The node's stage, or None for a spare or unknown node."""
        i = self._position(node_id)
        return None if i is None else self.stages[i]

    def next_hop(self, node_id: str) -> StageAssignment | None:
        """The stage after `node_id`'s (where it sends its hidden states); None for the last
        stage or a node outside the chain."""
        i = self._position(node_id)
        return None if i is None or i + 1 == len(self.stages) else self.stages[i + 1]

    def covers(self, n_layer: int) -> bool:
        """Every layer of an `n_layer` model exactly once (stages are contiguous by
        construction, so the ends decide)."""
        return self.stages[0].layers.start == 0 and self.stages[-1].layers.stop == n_layer
