"""What crosses HTTP between the coordinator and its nodes, written once for both ends.

The URL layout and one frozen dataclass per message: the server (coordinator/server)
answers with these (FastAPI serialises them and derives the OpenAPI description from
them) and the volunteers' client (coordinator/client) reads its answers into them, so a
field renamed on one end is renamed on the other. Request bodies the server must
validate field by field stay pydantic models in coordinator/server/api_models.py; a test holds
their field names equal to the dataclasses here.

Standard library only: this module runs on volunteer PCs as well as on the server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from coordinator.errors import MalformedAnswer
from coordinator.names import check_name
from coordinator.spot_checks import CheckAsk, read_asks

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
TRUST_NODE = f"{API}/nodes/{{node_id}}/trust"
NODE = f"{API}/nodes/{{node_id}}"
NAME_NODE = f"{API}/nodes/{{node_id}}/name"
EVENTS = f"{API}/events"
TURN = f"{API}/turn"
SIGNALS = f"{API}/signal"
SIGNAL_TO = f"{API}/signal/{{peer_id}}"
REVOKED = f"{API}/revoked"
ROUTE = f"{API}/route"
MODELS = f"{API}/models"
MANIFEST = f"{API}/models/{{name}}/manifest"
PIECES = f"{API}/models/{{name}}/pieces"
PIECE = f"{PIECES}/{{file}}"
PIECE_SOURCES = f"{PIECE}/sources"
INCIDENTS = f"{API}/nodes/{{node_id}}/incidents"
CHECK = f"{API}/nodes/{{node_id}}/checks/{{check_id}}"
"""A spot check (coordinator/spot_checks.py): GET, the record a checker recomputes;
POST, the node's answer to the check's ask (a record, or digests)."""
FAULTS = f"{API}/faults"
FAULT = f"{API}/faults/{{node_id}}"
PEER_PIECES = "/pieces/{model}/{file}"
"""A worker's piece server (mutual TLS, swarm members only): a piece it holds."""
LOGIN = f"{API}/login"
LOGOUT = f"{API}/logout"
INVITES = f"{API}/invites"
INVITE_CHECK = f"{API}/invites/check"
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
    except MalformedAnswer:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise MalformedAnswer(f"the coordinator's {what} is malformed: {exc!r}") from exc


# What a volunteer's PC accepts from a coordinator, checked as strictly as a wire frame
# (net/wire/checks.py): each field of its JSON type, texts and lists of bounded length,
# free-form objects of bounded depth and size. Values that come from JSON are never
# converted (`str()` of a dict, `int()` of a string): a wrong type is a malformed answer.

MAX_ID_CHARS = 256
"""Node ids, addresses, roles, kinds, link ids, hosts."""
MAX_PATH_CHARS = 1024
MAX_SECRET_CHARS = 4096
"""Tokens and passwords."""
MAX_PEM_CHARS = 64 * 1024
"""A certificate chain in PEM; real ones are a few KiB."""
MAX_LAYER = 1 << 20
MAX_STAGES = 4096
MAX_SERIALS = 1 << 16
MAX_URIS = 16
MAX_SESSIONS = 1 << 16
MAX_CONTEXT_TOKENS = 1 << 24
MAX_TTL_S = 7 * 24 * 3600
MAX_PAYLOAD_DEPTH = 8
MAX_PAYLOAD_ITEMS = 4096
"""Values in one signal's payload, all levels together (an ICE offer has a few dozen)."""


def _text(value: Any, what: str, limit: int = MAX_ID_CHARS, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise MalformedAnswer(f"{what} is a {type(value).__name__}, not text")
    if len(value) > limit or (not value and not empty):
        raise MalformedAnswer(f"{what} must be 1..{limit} characters, not {len(value)}")
    return value


def _integer(value: Any, what: str, low: int, high: int) -> int:
    # bool is an int in Python, never one in a coordinator's answer.
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedAnswer(f"{what} is a {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise MalformedAnswer(f"{what} must be within {low}..{high}, not {value}")
    return value


def _items(value: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedAnswer(f"{what} is a {type(value).__name__}, not a list")
    if len(value) > limit:
        raise MalformedAnswer(f"{what} holds {len(value)} items; at most {limit}")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{what} is a {type(value).__name__}, not an object")
    return value


def _name(value: Any, what: str) -> str:
    """A model name or node id: one safe path component (coordinator.names)."""
    return check_name(_text(value, what), what)


def _coordinator_path(value: Any, what: str) -> str:
    """A path on the coordinator, appended to its base URL: it must stay a path there
    (no `@` that would turn the base into user info, no `//`, `..` or backslashes)."""
    path = _text(value, what, MAX_PATH_CHARS)
    if (
        not path.startswith("/")
        or path.startswith("//")
        or any(bad in path for bad in ("@", "\\", "..", "?", "#"))
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path)
    ):
        raise MalformedAnswer(f"{what} {path[:80]!r} is not a path on the coordinator")
    return path


def _payload(value: Any, what: str) -> dict[str, Any]:
    """A free-form JSON object (a signal's ICE offer) of bounded depth and size, walked
    without recursion so that no depth exhausts the stack."""
    root = _object(value, what)
    pending: list[tuple[Any, int]] = [(root, 1)]
    seen = 0
    while pending:
        node, depth = pending.pop()
        seen += 1
        if seen > MAX_PAYLOAD_ITEMS:
            raise MalformedAnswer(f"{what} holds more than {MAX_PAYLOAD_ITEMS} values")
        if isinstance(node, dict):
            children: list[Any] = list(node.values())
            for key in node:
                _text(key, f"a key in {what}", empty=True)
        elif isinstance(node, list):
            children = node
        elif isinstance(node, str):
            _text(node, f"a text in {what}", MAX_SECRET_CHARS, empty=True)
            continue
        elif node is None or isinstance(node, bool | int | float):
            continue
        else:
            raise MalformedAnswer(f"{what} holds a {type(node).__name__}")
        if children and depth >= MAX_PAYLOAD_DEPTH:
            raise MalformedAnswer(f"{what} is nested deeper than {MAX_PAYLOAD_DEPTH}")
        pending.extend((child, depth + 1) for child in children)
    return root


def _layers(value: Any) -> tuple[int, int]:
    pair = _items(value, "layers", 2)
    if len(pair) != 2:
        raise MalformedAnswer(f"layers must be [start, stop], not {len(pair)} numbers")
    start = _integer(pair[0], "the first layer", 0, MAX_LAYER)
    stop = _integer(pair[1], "the layer after the last", 1, MAX_LAYER)
    if start >= stop:
        raise MalformedAnswer(f"layers [{start}, {stop}) hold no layer")
    return start, stop


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class CaAnswer:
    """GET CA: the swarm CA, fetched unverified and accepted only if it matches the pin."""

    certificate_pem: str
    fingerprint: str

    @staticmethod
    def from_json(doc: Any) -> CaAnswer:
        return _read(
            "CA answer",
            lambda d: CaAnswer(
                _text(d["certificate_pem"], "certificate_pem", MAX_PEM_CHARS),
                _text(d["fingerprint"], "fingerprint"),
            ),
            doc,
        )


@dataclass(frozen=True)
class JoinRequest:
    """POST JOIN: the invite's secret and a signing request for the node certificate."""

    secret: str
    csr_pem: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class InviteCheckRequest:
    """POST INVITE_CHECK: is this invite's secret usable? Nothing is used or changed."""

    secret: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class InviteCheck:
    """The answer to INVITE_CHECK: whether joining with it would be accepted now, the role
    it grants, and why not in words (never its uses, expiry date or id)."""

    valid: bool
    role: str = ""
    reason: str = ""

    @staticmethod
    def from_json(doc: Any) -> InviteCheck:
        def build(d: dict[str, Any]) -> InviteCheck:
            valid = d["valid"]
            if not isinstance(valid, bool):
                raise MalformedAnswer(f"valid is a {type(valid).__name__}, not true or false")
            return InviteCheck(
                valid,
                _text(d.get("role", ""), "role", empty=True),
                _text(d.get("reason", ""), "reason", 300, empty=True),
            )

        return _read("invite check", build, doc)


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
                _name(d["node_id"], "node_id"),
                _text(d["role"], "role"),
                _text(d["certificate_pem"], "certificate_pem", MAX_PEM_CHARS),
                _text(d["ca_certificate_pem"], "ca_certificate_pem", MAX_PEM_CHARS),
                _text(d["token"], "token", MAX_SECRET_CHARS),
                dt.datetime.fromisoformat(_text(d["expires_at"], "expires_at", 64)),
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
    step_ms: tuple[tuple[int, float], ...] = ()
    """The stage's step time by rows per step, (rows, ms) by increasing rows, as it
    serves (core.step_profile); the coordinator predicts the fleet's tokens/s from it."""
    row_budget: int = 0
    """Rows one engine step of its stage takes at most (0: serves none)."""
    activity: str = ""
    """What the node does now: waiting (for a stage), standby (a spare getting a stage
    ready), downloading, loading or serving; "" from a node that does not say. The
    operator's timeline and page show it."""
    download_done_bytes: int = 0
    download_total_bytes: int = 0
    """While downloading: its stage's pieces on disk, and in all."""
    pieces_address: str = ""
    """Where its piece server answers other swarm members (IP:PORT over TCP, mutual
    TLS); "" when it serves none."""
    pieces_layers: tuple[int, int] = (0, 0)
    """The layers (its stage's or its standby stage's) whose pieces it holds complete
    and verified, served at `pieces_address`; (0, 0): none."""
    checkable: bool = False
    """Its stage's steps can be recomputed bit for bit elsewhere (reproducible, and
    not the last stage): it may be spot-checked, and check others of its layers."""
    check_sessions: tuple[tuple[str, int], ...] = ()
    """Sessions whose steps it keeps for spot checks, with how many (newest first)."""

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
            if hop is not None:
                hop = _object(hop, "next_hop")
            return Assignment(
                _name(d["model"], "model"),
                _layers(d["layers"]),
                None
                if hop is None
                else NextHop(
                    _name(hop["node_id"], "next hop's node_id"),
                    _text(hop["address"], "next hop's address", empty=True),
                ),
                _coordinator_path(d["manifest_url"], "manifest_url"),
                _coordinator_path(d["pieces_url"], "pieces_url"),
                _integer(d.get("max_sessions", 8), "max_sessions", 1, MAX_SESSIONS),
                _integer(d.get("context_tokens", 256), "context_tokens", 1, MAX_CONTEXT_TOKENS),
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
    latest_release: str = ""
    """The newest Sangama release the operator announced ("": none)."""
    min_release: str = ""
    """The oldest release this swarm admits ("": every one)."""
    can_answer: bool | None = None
    """Whether the planned chain answered the coordinator's last end-to-end probe (two
    tokens; coordinator/server/answer_prober.py); None: not probed yet."""
    answer_since: int = 0
    """Unix seconds since when `can_answer` has been so."""
    answer_reason: str = ""
    """Why the swarm cannot answer: which stage or link failed ("" when it can)."""
    check_asks: tuple[CheckAsk, ...] = ()
    """Spot checks asked of this node (coordinator/spot_checks.py)."""

    @staticmethod
    def from_json(doc: Any) -> HeartbeatAnswer:
        def build(d: dict[str, Any]) -> HeartbeatAnswer:
            found = d.get("assignment")
            ready = d.get("standby")
            serials = _items(d.get("revoked_serials", []), "revoked_serials", MAX_SERIALS)
            return HeartbeatAnswer(
                None if not found else Assignment.from_json(found),
                tuple(_text(s, "a revoked serial", 128) for s in serials),
                None if not ready else Assignment.from_json(ready),
                _text(d.get("latest_release", ""), "latest_release", 64, empty=True),
                _text(d.get("min_release", ""), "min_release", 64, empty=True),
                _can_answer(d.get("can_answer")),
                _integer(d.get("answer_since", 0), "answer_since", 0, 2**40),
                _text(d.get("answer_reason", ""), "answer_reason", MAX_ANSWER_REASON, empty=True),
                read_asks(d.get("check_asks")),
            )

        return _read("heartbeat answer", build, doc)


MAX_ANSWER_REASON = 1000


def _can_answer(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise MalformedAnswer(f"can_answer is a {type(value).__name__}, not true, false or null")


@dataclass(frozen=True)
class RouteAnswerStage:
    node_id: str
    address: str
    layers: tuple[int, int]


def _route_stage(value: Any) -> RouteAnswerStage:
    s = _object(value, "a stage")
    return RouteAnswerStage(
        _name(s["node_id"], "a stage's node_id"),
        _text(s["address"], "a stage's address"),
        _layers(s["layers"]),
    )


MAX_FAULTY_LISTED = 64


@dataclass(frozen=True)
class RouteAnswer:
    """GET ROUTE: the chain a client sends its tokens through, in token order."""

    model: str
    stages: tuple[RouteAnswerStage, ...]
    faulty: tuple[str, ...] = ()
    """Nodes a spot check found computing wrong (newest first, at most MAX_FAULTY_LISTED):
    a client whose answer passed through one replays it from where that node joined."""

    @staticmethod
    def from_json(doc: Any) -> RouteAnswer:
        return _read(
            "route",
            lambda d: RouteAnswer(
                _name(d["model"], "model"),
                tuple(_route_stage(s) for s in _items(d["stages"], "stages", MAX_STAGES)),
                tuple(
                    _name(n, "a faulty node")
                    for n in _items(d.get("faulty", []), "faulty", MAX_FAULTY_LISTED)
                ),
            ),
            doc,
        )


MAX_MODELS = 256


@dataclass(frozen=True)
class SwarmModel:
    """One model a swarm serves, as GET MODELS lists it."""

    name: str
    n_layer: int
    default: bool = False
    """The model a request for "default" (or naming none) gets: the first hosted."""
    chains: int = 0
    """Complete chains serving it now (0: no route yet)."""
    stages: int = 0
    """Stages of its main chain (0: none)."""
    reason: str = ""
    """Why it has no chain ("" when it has one)."""


@dataclass(frozen=True)
class ModelsAnswer:
    """GET MODELS (a joined node): every model this swarm serves, the default first."""

    models: tuple[SwarmModel, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @staticmethod
    def from_json(doc: Any) -> ModelsAnswer:
        def model(value: Any) -> SwarmModel:
            d = _object(value, "a model")
            default = d.get("default", False)
            if not isinstance(default, bool):
                raise MalformedAnswer(f"default is a {type(default).__name__}, not true or false")
            return SwarmModel(
                _name(d["name"], "model"),
                _integer(d["n_layer"], "n_layer", 1, MAX_LAYER),
                default,
                _integer(d.get("chains", 0), "chains", 0, MAX_STAGES),
                _integer(d.get("stages", 0), "stages", 0, MAX_STAGES),
                _text(d.get("reason", ""), "reason", 1000, empty=True),
            )

        return _read(
            "models list",
            lambda d: ModelsAnswer(
                tuple(model(m) for m in _items(d["models"], "models", MAX_MODELS))
            ),
            doc,
        )


PIECE_SOURCE_KINDS = ("peer", "mirror", "coordinator")
MAX_PIECE_SOURCES = 64


@dataclass(frozen=True)
class PieceSource:
    """One place a piece can be fetched from: a peer's piece server (`node_id` at
    `address`), the model's public mirror, or the coordinator."""

    kind: str
    node_id: str = ""
    address: str = ""


def _piece_source(value: Any) -> PieceSource:
    s = _object(value, "a piece source")
    kind = _text(s["kind"], "a piece source's kind", 32)
    if kind not in PIECE_SOURCE_KINDS:
        raise MalformedAnswer(f"a piece source's kind is {kind!r}")
    if kind != "peer":
        return PieceSource(kind)
    return PieceSource(
        kind,
        _name(s["node_id"], "a peer's node_id"),
        _text(s["address"], "a peer's pieces address"),
    )


@dataclass(frozen=True)
class PieceSources:
    """GET PIECE_SOURCES: where to fetch one piece, best first (peers holding it, then
    the mirror where the model has one, then the coordinator)."""

    file: str
    sources: tuple[PieceSource, ...]

    @staticmethod
    def from_json(doc: Any) -> PieceSources:
        return _read(
            "piece sources",
            lambda d: PieceSources(
                _text(d["file"], "file", MAX_PATH_CHARS),
                tuple(_piece_source(s) for s in _items(d["sources"], "sources", MAX_PIECE_SOURCES)),
            ),
            doc,
        )


MAX_INCIDENT_SOURCE = 200
MAX_INCIDENT_REASON = 300


@dataclass(frozen=True)
class SourceIncident:
    """POST INCIDENTS: a source of pieces this node gave up on (a peer or the mirror that
    served wrong bytes, truncated or stalled), for the operator's timeline."""

    source: str
    """Which source: "mirror", or the peer's node id."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source[:MAX_INCIDENT_SOURCE],
            "reason": self.reason[:MAX_INCIDENT_REASON],
        }


@dataclass(frozen=True)
class Health:
    """GET HEALTH (public): the coordinator is up, and the releases its operator set."""

    latest_release: str = ""
    """The newest Sangama release the operator announced ("": none)."""
    min_release: str = ""
    """The oldest release this swarm admits ("": every one)."""

    @staticmethod
    def from_json(doc: Any) -> Health:
        return _read(
            "health answer",
            lambda d: Health(
                _text(d.get("latest_release", ""), "latest_release", 64, empty=True),
                _text(d.get("min_release", ""), "min_release", 64, empty=True),
            ),
            doc,
        )


@dataclass(frozen=True)
class TurnAnswer:
    """GET TURN: short-lived credentials for the swarm's relay (404: it has none)."""

    host: str
    port: int
    username: str
    password: str = field(repr=False)
    ttl_s: int
    uris: tuple[str, ...]

    @staticmethod
    def from_json(doc: Any) -> TurnAnswer:
        return _read(
            "relay credentials",
            lambda d: TurnAnswer(
                _text(d["host"], "host"),
                _integer(d["port"], "port", 1, 65535),
                _text(d["username"], "username", 512),
                _text(d["password"], "password", MAX_SECRET_CHARS),
                _integer(d["ttl_s"], "ttl_s", 1, MAX_TTL_S),
                tuple(
                    _text(u, "a relay URI", MAX_PATH_CHARS)
                    for u in _items(d["uris"], "uris", MAX_URIS)
                ),
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
    """ICE ufrag, pwd and candidates (net.ice.paths.IceOffer.to_dict)."""

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
            lambda d: Signal(
                _name(d["sender"], "sender"),
                _text(d["kind"], "kind"),
                _text(d["link"], "link"),
                _payload(d["payload"], "payload"),
            ),
            doc,
        )
