"""The coordinator API's request and answer bodies (pydantic models) and the error
answers its routes document. Shapes only: the api*.py modules route them."""

from __future__ import annotations

import datetime as dt
import math
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from coordinator.contract import (
    RouteAnswerStage,
)
from coordinator.server.events import MAX_NAME
from coordinator.server.invite_book import MAX_USES
from coordinator.server.node_claims import check_report
from coordinator.spot_checks import MAX_CHECK_STEPS, MAX_SESSION_CHARS
from net.ice.values import IceOffer

MAX_BODY_BYTES = 1 << 20
MAX_LAYERS = 100_000
"""Bound on reported layer counts: far above any model, well inside a 32-bit column."""
MAX_ROWS = 1 << 16
"""Bound on rows per engine step (a stage's n_batch is far below)."""
MAX_STEP_POINTS = 16
"""Points of a step-time profile (core.step_profile.MAX_POINTS)."""
MAX_RTT_PEERS = 64
"""Round trips one heartbeat may report: its next hop and the first stages it loops to."""
MAX_SIGNAL_CANDIDATES = 64
"""Candidates in one ICE offer (net.ice.values.MAX_CANDIDATES)."""
MAX_MS = 600_000.0
"""Bound on a reported step time or round trip: ten minutes is no longer a measurement."""


def _storable(value: Any) -> Any:
    """Refuse what a database column cannot hold: NUL in text (PostgreSQL), NaN or
    infinity in JSON or float columns. Walks nested dicts and lists without recursion."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str) and "\x00" in v:
            raise ValueError("text must not contain NUL characters")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("numbers must be finite (no NaN or Infinity)")
        if isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list | tuple):
            todo.extend(v)
    return value


class _In(BaseModel):
    """A request body: every field must be storable (see `_storable`); else 422."""

    @field_validator("*")
    @classmethod
    def _storable_fields(cls, value: Any) -> Any:
        return _storable(value)


class InviteIn(_In):
    role: str = Field(pattern="^(worker|client)$")
    uses: int = Field(default=1, ge=1, le=MAX_USES)
    expires: str = Field(
        default="7d", pattern=r"^[1-9][0-9]{0,5}[dhms]$", description="e.g. 7d, 12h"
    )
    note: str = Field(default="", max_length=200)


class InviteOut(BaseModel):
    id: int
    role: str
    uses_left: int
    max_uses: int
    expires_at: dt.datetime
    revoked: bool
    note: str
    code: str | None = None


class JoinIn(_In):
    secret: str = Field(min_length=1, max_length=200)
    csr_pem: str = Field(min_length=1, max_length=8000)


class InviteCheckIn(_In):
    secret: str = Field(min_length=1, max_length=200)


class RenewIn(_In):
    csr_pem: str = Field(min_length=1, max_length=8000)


CheckSession = Annotated[str, Field(min_length=1, max_length=MAX_SESSION_CHARS)]
CheckSteps = Annotated[int, Field(ge=0, le=MAX_CHECK_STEPS)]


class HeartbeatIn(_In):
    """contract.Heartbeat, with the bounds the database needs (same field names)."""

    address: str = Field(default="", max_length=200)
    capacity_bytes: int = Field(default=0, ge=0, le=1 << 50)
    vram_cap_bytes: int = Field(default=0, ge=0, le=1 << 50)
    hardware: dict[str, Any] = Field(default_factory=dict)
    rtt_ms: dict[str, float] = Field(default_factory=dict)
    tokens: int = Field(default=0, ge=0, le=2**31 - 1)  # samples.tokens is 32-bit
    compute_ms: float = Field(default=0.0, ge=0.0, le=1e9)
    stats: dict[str, Any] = Field(default_factory=dict)
    path: str = Field(default="direct", pattern="^(direct|punched|relayed)$")
    # What runs the node's stage (app.compute.StageCompute); empty while it serves none.
    backend: str = Field(default="", max_length=200, description='e.g. "CPU (zen4)"')
    device_bytes_used: int = Field(default=0, ge=0, le=1 << 50)
    device_cap_bytes: int = Field(default=0, ge=0, le=1 << 50)
    gpu_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    n_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    paused: str = Field(default="", max_length=100, description='e.g. "on battery"')
    # Sessions and KV reserved against the stage's budget (core.admission.Capacity).
    sessions: int = Field(default=0, ge=0, le=1 << 16)
    max_sessions: int = Field(default=0, ge=0, le=1 << 16)
    kv_budget_bytes: int = Field(default=0, ge=0, le=1 << 50)
    kv_reserved_bytes: int = Field(default=0, ge=0, le=1 << 50)
    available_until: float = Field(default=0.0, ge=0.0, le=1e11, description="Unix seconds")
    # The stage's step time by rows (core.step_profile), for the fleet prediction.
    step_ms: tuple[tuple[int, float], ...] = Field(
        default=(), max_length=MAX_STEP_POINTS, description="[rows, ms] pairs"
    )
    row_budget: int = Field(default=0, ge=0, le=MAX_ROWS)
    # What the node does now, and its download's progress (the operator's timeline).
    activity: str = Field(default="", pattern="^(|waiting|standby|downloading|loading|serving)$")
    download_done_bytes: int = Field(default=0, ge=0, le=1 << 50)
    download_total_bytes: int = Field(default=0, ge=0, le=1 << 50)
    # Its piece server (app/serving/piece_server.py), checked like `address`, and the
    # layers whose pieces it serves there.
    pieces_address: str = Field(default="", max_length=200)
    pieces_layers: tuple[int, int] = (0, 0)
    # Spot checks (coordinator/spot_checks.py): whether its steps recompute bit for bit,
    # and the sessions it keeps records of, with their steps.
    checkable: bool = False
    check_sessions: tuple[tuple[CheckSession, CheckSteps], ...] = Field(default=(), max_length=16)

    @model_validator(mode="after")
    def _layers_within_stage(self) -> HeartbeatIn:
        start, stop = self.pieces_layers
        if not (0 <= start <= stop <= MAX_LAYERS):
            raise ValueError("pieces_layers must be [start, stop] within the model's layers")
        if self.gpu_layers > self.n_layers:
            raise ValueError("gpu_layers cannot exceed the stage's n_layers")
        if self.download_done_bytes > self.download_total_bytes:
            raise ValueError("download_done_bytes cannot exceed download_total_bytes")
        return self

    @field_validator("hardware", "stats")
    @classmethod
    def _reports(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Stored and shown on the operator page: bounded in depth and size here.
        return dict(check_report(str(info.field_name), value))

    @field_validator("rtt_ms")
    @classmethod
    def _rtts(cls, value: dict[str, float]) -> dict[str, float]:
        if len(value) > MAX_RTT_PEERS:
            raise ValueError(f"at most {MAX_RTT_PEERS} round trips")
        for peer, ms in value.items():
            if not 1 <= len(peer) <= 64:
                raise ValueError("a peer's node id has 1 to 64 characters")
            if not 0 <= ms <= MAX_MS:
                raise ValueError(f"a round trip lies in 0..{MAX_MS:.0f} ms")
        return value

    @field_validator("step_ms")
    @classmethod
    def _steps(cls, value: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        rows = [r for r, _ in value]
        if any(not 1 <= r <= MAX_ROWS for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"step rows increase strictly within 1..{MAX_ROWS}")
        if any(not 0 <= ms <= MAX_MS for _, ms in value):
            raise ValueError(f"a step time lies in 0..{MAX_MS:.0f} ms")
        return value


class NodeOut(BaseModel):
    node_id: str
    role: str
    health: str
    address: str
    capacity_bytes: int
    vram_cap_bytes: int
    hardware: dict[str, Any]
    stats: dict[str, Any]
    path: str
    layers: tuple[int, int] | None
    last_seen: dt.datetime | None
    backend: str
    device_bytes_used: int
    device_cap_bytes: int
    gpu_layers: int
    n_layers: int
    paused: str = ""
    """Why the node said it pauses ("on battery", ...); "" when it offers to serve."""
    sessions: int
    max_sessions: int
    kv_budget_bytes: int
    kv_reserved_bytes: int
    trusted: bool = False
    """Marked trusted by the operator (for the first and last stage)."""
    name: str = ""
    """The operator's name for it (its invite's note at first); "" for none."""
    state: str = ""
    """health, but "paused" for a node that said it pauses and is not yet gone."""
    activity: str = ""
    """What it last said it does: waiting, standby, downloading, loading, serving."""
    download_done_bytes: int = 0
    download_total_bytes: int = 0
    forgettable: bool = False
    """Gone or revoked: the operator may forget it (DELETE on the node)."""
    model: str = ""
    """The model whose stage it serves ("" for none: a spare, or not placed)."""


class LevelOut(BaseModel):
    """Predicted tokens/s at `requests` requests at once (coordinator.server.prediction)."""

    requests: int
    tokens_per_s: float
    per_request_tokens_per_s: float
    round_ms: float
    rows_per_step: int
    groups: int
    bound: str


class PredictionOut(BaseModel):
    """What the main chain should deliver, from its measured step times and links."""

    one_request_tokens_per_s: float
    trip_ms: float
    compute_ms: float
    links_ms: float
    hops_ms: float
    slowest_node: str
    admission_limit: int
    assumed_links: int
    levels: list[LevelOut] = Field(max_length=32)
    peak: LevelOut


class AnswerOut(BaseModel):
    """Whether the planned chain answered the coordinator's last probe (two tokens)."""

    can_answer: bool | None
    """None: not probed yet."""
    since: float
    """Unix time since when it has been so."""
    checked_at: float
    """Unix time of the last probe (0: none yet)."""
    reason: str
    """Why it cannot answer: which stage or link failed; empty when it can."""
    chain: list[str]
    answer_ms: float
    """How long the last successful probe took."""


class ModelOut(BaseModel):
    """One hosted model with its main chain (the first listed is the default)."""

    name: str
    n_layer: int
    default: bool
    plan: list[RouteAnswerStage]
    chains: int
    """Complete chains serving it (0: none now)."""
    plan_error: str | None


class SwarmOut(BaseModel):
    model: str
    n_layer: int
    nodes: list[NodeOut]
    plan: list[RouteAnswerStage]
    spares: list[str]
    no_spare: list[tuple[int, int]] = []
    """Layer ranges of stages no spare stands by for."""
    standby: dict[str, tuple[int, int]] = {}
    """Spare node id -> the layers it keeps ready."""
    plan_error: str | None
    throughput: list[tuple[str, int]]
    prediction: PredictionOut | None = None
    """Predicted decode tokens/s of the main chain; None until every stage reported."""
    prediction_note: str = ""
    """Why there is no prediction, or what it assumed."""
    answer: AnswerOut | None = None
    """Whether the swarm can answer (the coordinator's end-to-end probe)."""
    models: list[ModelOut] = []
    """Every hosted model with its chain; `model`, `plan` and the rest above are the
    default model's (the first)."""
    piece_bytes_served: int = 0
    """Bytes the coordinator's piece endpoint answered with since it started (peers
    and the mirror serve the rest)."""
    pieces_served_at: dict[str, str] = {}
    """Node id -> where its piece server answers swarm members (its heartbeat's word)."""


class IncidentIn(_In):
    """contract.SourceIncident, checked."""

    source: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=300)


class SignalIn(_In):
    """contract.SignalPost, checked."""

    kind: str = Field(pattern="^(offer|answer)$")
    link: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,32}\.[1-9]$",
        description="id both ends use for this link, then the round: LINK.1, LINK.2",
    )
    payload: dict[str, Any] = Field(description="ICE ufrag, pwd and candidates")

    @field_validator("payload")
    @classmethod
    def _ice_offer(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Exactly an ICE offer (net.ice.values: ufrag, pwd, at most 64 parsed UDP
        # candidates), as the receiving node will parse it; nothing else is carried.
        candidates = value.get("candidates")
        if isinstance(candidates, list):
            if len(candidates) > MAX_SIGNAL_CANDIDATES:
                raise ValueError(f"at most {MAX_SIGNAL_CANDIDATES} candidates")
            if any(not isinstance(c, str) or len(c) > 256 for c in candidates):
                raise ValueError("a candidate is a text of at most 256 characters")
        return IceOffer.from_dict(value).to_dict()


class TrustIn(_In):
    trusted: bool = True


class NameIn(_In):
    name: str = Field(max_length=MAX_NAME, description="the operator's name for it; empty: none")


class EventOut(BaseModel):
    """One line of the operator's timeline (coordinator/server/events.py: KINDS)."""

    id: int
    at: dt.datetime
    kind: str
    label: str
    """The kind as the page words it."""
    tone: str
    """ok, info, warn or bad."""
    node_id: str
    detail: str


class LoginIn(_In):
    password: str = Field(min_length=1, max_length=200)


class ErrorOut(BaseModel):
    detail: str


ERROR_REASONS = {
    400: "A body that cannot be parsed, or a request that cannot be done (a bad value)",
    401: "Missing or wrong credentials",
    403: "Not allowed (an unusable invite, another node's resource)",
    404: "No such thing",
    409: "Not in this state (forgetting a node that is alive, stale or paused)",
    413: f"Request body larger than {MAX_BODY_BYTES} bytes",
    426: "The node's Sangama release is older than this swarm admits: update it",
    429: "Too many attempts or requests from this caller; the answer says when to try again",
}


def documented_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route documents: each a JSON object with a `detail` message."""
    return {code: {"model": ErrorOut, "description": ERROR_REASONS[code]} for code in codes}
