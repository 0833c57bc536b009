"""What crosses HTTP between the coordinator and its nodes, written once for both ends.

The URL layout and one frozen dataclass per message: the server (coordinator/server)
answers with these (FastAPI serialises them and derives the OpenAPI description from
them) and the volunteers' client (coordinator/client) reads its answers into them, so a
field renamed on one end is renamed on the other. Request bodies the server must
validate field by field stay pydantic models in coordinator/server/api.py; a test holds
their field names equal to the dataclasses here.

Standard library only: this module runs on volunteer PCs as well as on the server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from coordinator.errors import MalformedAnswer

# ---------------------------------------------------------------- the URL layout
# Templates in FastAPI's syntax: the server routes them as they are, the client fills
# them in with `str.format`.

API = "/api/v1"
CA = f"{API}/ca"
JOIN = f"{API}/join"
HEALTH = f"{API}/health"
METRICS = "/metrics"
HEARTBEAT = f"{API}/nodes/{{node_id}}/heartbeat"
ASSIGNMENT = f"{API}/nodes/{{node_id}}/assignment"
RENEW = f"{API}/nodes/{{node_id}}/renew"
REVOKE_NODE = f"{API}/nodes/{{node_id}}/revoke"
TURN = f"{API}/turn"
SIGNALS = f"{API}/signal"
SIGNAL_TO = f"{API}/signal/{{peer_id}}"
REVOKED = f"{API}/revoked"
ROUTE = f"{API}/route"
MANIFEST = f"{API}/models/{{name}}/manifest"
PIECES = f"{API}/models/{{name}}/pieces"
PIECE = f"{PIECES}/{{file}}"
LOGIN = f"{API}/login"
LOGOUT = f"{API}/logout"
INVITES = f"{API}/invites"
INVITE = f"{API}/invites/{{invite_id}}"
SWARM = f"{API}/swarm"


def manifest_path(model: str) -> str:
    return MANIFEST.format(name=model)


def pieces_path(model: str) -> str:
    """Where a model's pieces are, one file below it each (downloads append the name)."""
    return PIECES.format(name=model)


# ---------------------------------------------------------------- reading answers

T = TypeVar("T")


def _read(what: str, build: Callable[[dict[str, Any]], T], doc: Any) -> T:
    """`build(doc)`, with whatever a malformed answer raises turned into MalformedAnswer:
    a coordinator (or something in between) sending nonsense is a coordinator problem."""
    if not isinstance(doc, dict):
        raise MalformedAnswer(f"the coordinator's {what} is not a JSON object")
    try:
        return build(doc)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise MalformedAnswer(f"the coordinator's {what} is malformed: {exc!r}") from exc


def _layers(value: Any) -> tuple[int, int]:
    start, stop = value
    return int(start), int(stop)


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class CaAnswer:
    """GET CA: the swarm CA, fetched unverified and accepted only if it matches the pin."""

    certificate_pem: str
    fingerprint: str

    @staticmethod
    def from_json(doc: Any) -> CaAnswer:
        return _read(
            "CA answer", lambda d: CaAnswer(str(d["certificate_pem"]), str(d["fingerprint"])), doc
        )


@dataclass(frozen=True)
class JoinRequest:
    """POST JOIN: the invite's secret and a signing request for the node certificate."""

    secret: str
    csr_pem: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RenewRequest:
    """POST RENEW (with the node token): a new signing request for the same node."""

    csr_pem: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JoinAnswer:
    """The answer to JOIN and to RENEW: who the node now is and its credentials."""

    node_id: str
    role: str
    certificate_pem: str
    ca_certificate_pem: str
    token: str
    expires_at: dt.datetime
    """When the node certificate expires (UTC)."""

    @staticmethod
    def from_json(doc: Any) -> JoinAnswer:
        return _read(
            "join answer",
            lambda d: JoinAnswer(
                str(d["node_id"]),
                str(d["role"]),
                str(d["certificate_pem"]),
                str(d["ca_certificate_pem"]),
                str(d["token"]),
                dt.datetime.fromisoformat(str(d["expires_at"])),
            ),
            doc,
        )


@dataclass(frozen=True)
class Heartbeat:
    """POST HEARTBEAT: what a node reports about itself every few seconds."""

    address: str = ""
    capacity_bytes: int = 0
    vram_cap_bytes: int = 0
    hardware: dict[str, Any] = field(default_factory=dict)
    rtt_ms: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    """Tokens generated since the previous heartbeat (the coordinator sums them)."""
    compute_ms: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    path: str = "direct"
    """How this node reaches its next hop: direct, punched or relayed."""
    backend: str = ""
    """What runs its stage's layers, e.g. "CPU (zen4)"; "" while it serves no stage."""
    device_bytes_used: int = 0
    device_cap_bytes: int = 0
    gpu_layers: int = 0
    n_layers: int = 0
    paused: str = ""
    """Why the node serves nothing now ("on battery", "paused by you", ...); "" while it
    offers to serve. A paused node is left out of placement, so routes avoid it."""
    sessions: int = 0
    """Sessions running on the node's stage now."""
    max_sessions: int = 0
    """Sessions its stage admits at most (sequence slots); 0 while it serves none."""
    kv_budget_bytes: int = 0
    """KV memory sessions may reserve on its stage (core.admission)."""
    kv_reserved_bytes: int = 0
    """KV memory the running sessions reserved: the free capacity is the difference."""
    available_until: float = 0.0
    """When the volunteer said this PC stops serving (Unix seconds; 0: not said). The
    coordinator keeps a spare ready for the stages of nodes leaving soonest."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NextHop:
    node_id: str
    address: str


@dataclass(frozen=True)
class Assignment:
    """The stage placement gave a worker, and where to fetch what it needs to serve it."""

    model: str
    layers: tuple[int, int]
    next_hop: NextHop | None
    """Where this stage sends its hidden states; None on the last stage."""
    manifest_url: str
    """A path on the coordinator (MANIFEST filled in)."""
    pieces_url: str
    """A path on the coordinator (PIECES filled in): each piece is one file below it."""
    max_sessions: int = 8
    """Sessions the stage is planned for (its sequence slots, llama.cpp allows 256)."""
    context_tokens: int = 256
    """KV positions planned per session: the stage's cache holds max_sessions x this,
    the memory placement counted for it. Defaults: what coordinators that send neither
    planned."""

    @staticmethod
    def from_json(doc: Any) -> Assignment:
        def build(d: dict[str, Any]) -> Assignment:
            hop = d["next_hop"]
            return Assignment(
                str(d["model"]),
                _layers(d["layers"]),
                None if hop is None else NextHop(str(hop["node_id"]), str(hop["address"])),
                str(d["manifest_url"]),
                str(d["pieces_url"]),
                int(d.get("max_sessions", 8)),
                int(d.get("context_tokens", 256)),
            )

        return _read("assignment", build, doc)


@dataclass(frozen=True)
class HeartbeatAnswer:
    """The answer to HEARTBEAT: the node's stage (None: wait, or stay a spare) and the
    certificate serials its peers must no longer be trusted with."""

    assignment: Assignment | None
    revoked_serials: tuple[str, ...]
    standby: Assignment | None = None
    """For a spare: the stage it should get ready for (download its pieces now), the
    one most at risk of losing its node (coordinator/server/spare_policy.py)."""

    @staticmethod
    def from_json(doc: Any) -> HeartbeatAnswer:
        def build(d: dict[str, Any]) -> HeartbeatAnswer:
            found = d.get("assignment")
            ready = d.get("standby")
            return HeartbeatAnswer(
                None if not found else Assignment.from_json(found),
                tuple(str(s) for s in d.get("revoked_serials", [])),
                None if not ready else Assignment.from_json(ready),
            )

        return _read("heartbeat answer", build, doc)


@dataclass(frozen=True)
class RouteStage:
    node_id: str
    address: str
    layers: tuple[int, int]


@dataclass(frozen=True)
class RouteAnswer:
    """GET ROUTE: the chain a client sends its tokens through, in token order."""

    model: str
    stages: tuple[RouteStage, ...]

    @staticmethod
    def from_json(doc: Any) -> RouteAnswer:
        return _read(
            "route",
            lambda d: RouteAnswer(
                str(d["model"]),
                tuple(
                    RouteStage(str(s["node_id"]), str(s["address"]), _layers(s["layers"]))
                    for s in d["stages"]
                ),
            ),
            doc,
        )


@dataclass(frozen=True)
class TurnCredentials:
    """GET TURN: short-lived credentials for the swarm's relay (404: it has none)."""

    host: str
    port: int
    username: str
    password: str = field(repr=False)
    ttl_s: int
    uris: tuple[str, ...]

    @staticmethod
    def from_json(doc: Any) -> TurnCredentials:
        return _read(
            "relay credentials",
            lambda d: TurnCredentials(
                str(d["host"]),
                int(d["port"]),
                str(d["username"]),
                str(d["password"]),
                int(d["ttl_s"]),
                tuple(str(u) for u in d["uris"]),
            ),
            doc,
        )


@dataclass(frozen=True)
class SignalPost:
    """POST SIGNAL_TO: an ICE offer or answer for a peer, carried by the coordinator."""

    kind: str
    """"offer" or "answer"."""
    link: str
    """The id both ends use for this link."""
    payload: dict[str, Any]
    """ICE ufrag, pwd and candidates (net.ice.IceOffer.to_dict)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Signal:
    """One message from GET SIGNALS: a SignalPost and who sent it."""

    sender: str
    kind: str
    link: str
    payload: dict[str, Any]

    @staticmethod
    def from_json(doc: Any) -> Signal:
        return _read(
            "signal",
            lambda d: Signal(str(d["sender"]), str(d["kind"]), str(d["link"]), dict(d["payload"])),
            doc,
        )
