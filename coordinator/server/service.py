"""What the coordinator does, without HTTP: invites, joining, the registry, placement,
routes. The API module parses requests and calls these methods; nothing here knows
about requests or responses.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, select, update

from coordinator import contract
from coordinator import invites as inv
from coordinator.contract import (
    MAX_FAULTY_LISTED,
    Assignment,
    Heartbeat,
    JoinAnswer,
    ModelsAnswer,
    NextHop,
    PieceSource,
    RouteAnswer,
    RouteAnswerStage,
    Signal,
    SignalPost,
    TurnAnswer,
)
from coordinator.errors import (
    AccessDenied,
    CoordinatorError,
    JoinRefused,
    NotFound,
)
from coordinator.releases import DEFAULT_MIN_RELEASE
from coordinator.server.answer_probe import AnswerState, Chain
from coordinator.server.events import (
    PlanView,
    Report,
    clean_name,
    forgettable,
    name_from_note,
    node_state,
)
from coordinator.server.fleet_view import FleetForecast, StageCapacity, StageReport, forecast
from coordinator.server.invite_book import (
    InviteRecord,
    create_invite,
    list_invites,
    revoke_invite,
)
from coordinator.server.liveness import confirmed_gone, nothing_listens
from coordinator.server.models import (
    HostedModel as HostedModel,  # where callers have always found it
)
from coordinator.server.models import (
    ModelPlan,
    Rules,
    check_names,
    find,
    models_answer,
    place_models,
    plan_setting,
)
from coordinator.server.node_claims import (
    BeatLimiter,
    TooFast,
    check_address,
    hardware_bytes,
    is_lan_address,
    peer_bound_capacities,
    split_address,
)
from coordinator.server.piece_peers import PieceBook, holders_of, rank_sources
from coordinator.server.placement import NodeInfo, Plan
from coordinator.server.plan_store import PLAN_SETTING, plan_from_json, plan_to_json
from coordinator.server.routes import StageLoad, pick_chain
from coordinator.server.secret_hashes import check_password, hash_password, hash_token
from coordinator.server.signalling import SignalBoxes, planned_peers
from coordinator.server.spare_policy import Standby
from coordinator.server.spot_policy import SpotSettings
from coordinator.server.spot_service import SpotChecks
from coordinator.server.standby import standby_assignment, standby_of, warm_layers
from coordinator.server.store import Certificate, Invite, Node, Rtt, Sample, Store, as_utc, utcnow
from coordinator.server.timeline import StoredEvent, Timeline
from net import auth, reach_probe
from net.ice.turn import DEFAULT_NODE_TTL_S, node_credentials, stun_uri, turn_uri

log = logging.getLogger(__name__)

NODE_CERT_HOURS = 24
ADMIN_PASSWORD = "admin_password_hash"
CA_CERT = "ca_certificate_pem"
TRUSTED_NODES = "trusted_nodes"
"""Setting: the JSON list of node ids the operator marked trusted (for trusted ends)."""
MAX_TRUSTED_CHARS = 4000
"""The settings column's width."""
PROBE_RETRY_S = 5.0
"""An address that did not answer the reachability probe is probed again after this."""
SAMPLES_KEPT = dt.timedelta(hours=1)
"""Throughput samples older than this are deleted (the operator's plot shows 30 min)."""
PRUNE_EVERY_S = 60.0
MAX_AVOID_PROBES = 2
"""Stages one route request may have probed (each probe waits up to 0.3 s)."""
AVOID_PROBES_PER_S = 0.5
AVOID_PROBE_BURST = 4.0
INCIDENTS_PER_S = 1 / 60
INCIDENT_BURST = 5.0
"""One client's reports may have 4 stages probed at once, then one every 2 s: a client
recovering from a dead stage reports one or two."""


class NodeAlive(CoordinatorError):
    """The operator asked to forget a node that is alive, stale or paused."""


def _plan_view(plan: Plan) -> PlanView:
    return PlanView(
        tuple((st.node_id, (st.layers.start, st.layers.stop)) for st in plan.stages),
        tuple(plan.spares),
    )


@dataclass(frozen=True)
class CoordinatorSettings:
    stale_after_s: float = 15.0
    """A node silent this long is shown as stale."""
    dead_after_s: float = 45.0
    """A node silent this long is dropped from the plan (its spare takes over)."""
    min_stages: int = 2
    """At least two stages: with one, a single node (whose claims may be false) would
    see every prompt and choose every answer."""
    spares: int = 0
    warm_spares: bool = True
    """Spares download the pieces of the stage most at risk in advance (spare_policy)."""
    sessions_per_stage: int = 64
    """Sessions each stage is planned for (llama.cpp allows 256 sequences per context;
    a stage's batched throughput stops rising well before that)."""
    context_tokens: int = 1024
    """Positions of KV per session: prompt, history and answer. Every session has a KV
    stream of its own of this size (the same numbers alone and batched); the assignment
    tells the worker both, so placement counts exactly the memory the stage allocates."""
    max_chains: int = 1
    """Complete chains to form when nodes beyond the main chain (and its spares) can
    hold the model again; new routes go to the one with the most room by measured load
    (coordinator/server/routes.py). 1: one chain, every other node a spare."""
    turn_server: tuple[str, int] | None = None
    """The swarm's relay (coturn), if any: nodes get short-lived credentials for it."""
    turn_secret: str = field(default="", repr=False)
    turn_ttl_s: int = DEFAULT_NODE_TTL_S
    """One username per node per window this long (net.ice.turn.node_credentials)."""
    metrics_public: bool = False
    """Serve /metrics to anyone; by default only to the operator and to loopback."""
    trusted_proxies: tuple[str, ...] = ()
    """Reverse proxies (IPs or networks) whose X-Forwarded-For header names the real
    caller (api.py); by default no header is believed."""
    trusted_ends: str = "off"
    """off, prefer or require: the first and last stage on nodes the operator marked
    trusted (placement/trusted_ends.py)."""
    probe_timeout_s: float = 0.5
    """How long the reachability probe of a node's address waits for its answer."""
    min_release: str = DEFAULT_MIN_RELEASE
    """The oldest Sangama release admitted at join and heartbeat (coordinator.releases);
    "": every release."""
    latest_release: str = ""
    """The newest release the operator knows of: nodes are told, the tray offers the
    update (the coordinator never looks it up itself). "": none announced."""
    spot: SpotSettings = field(default_factory=SpotSettings)
    """Spot checks of stages' steps (spot_policy.py); rate 0: none in this swarm."""


def placement_capacity(node: Node) -> int:
    """What placement may put on a node: its offer, never more than the volunteer's VRAM
    cap (a worker that reports a larger offer than its cap is held to the cap)."""
    capacity = max(0, int(node.capacity_bytes))
    cap = int(node.vram_cap_bytes or 0)
    return min(capacity, cap) if cap > 0 else capacity


def _stage_load(node: Node | None) -> StageLoad:
    if node is None:
        return StageLoad()
    return StageLoad(node.sessions, node.max_sessions, node.kv_budget_bytes, node.kv_reserved_bytes)


def _rowcount(result: Any) -> int:
    """Rows an UPDATE changed (a CursorResult's rowcount; typed loosely by SQLAlchemy)."""
    return int(getattr(result, "rowcount", 0))


def _is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Coordinator:
    def __init__(
        self,
        store: Store,
        ca: auth.CertifiedKey,
        public_url: str,
        model: HostedModel,
        settings: CoordinatorSettings = CoordinatorSettings(),
        reachable: Callable[[str], bool] | None = None,
        *,
        more_models: Sequence[HostedModel] = (),
    ) -> None:
        """`reachable`: whether an advertised address answers the coordinator's probe
        (net/reach_probe.py by default; tests of the API alone pass their own).
        `more_models`: models hosted beside `model`, the default (models.py); the
        workers are split between them (placement/fleet_split.py)."""
        self.store = store
        self.ca = ca
        self.public_url = public_url.rstrip("/")
        self.model = model
        self.models = (model, *more_models)
        check_names(self.models)
        self.settings = settings
        self.ca_pem = auth.certificate_pem(ca.certificate).decode()
        self.ca_fingerprint = auth.fingerprint(ca.certificate)
        self._lock = threading.Lock()
        self.answer = AnswerState()
        """Whether the planned chain answered the last probe (answer_prober.py sets it)."""
        self._hosted = [
            ModelPlan(m, kept=self._stored_plan(m, i)) for i, m in enumerate(self.models)
        ]
        """Each hosted model's chains, the default first (models.py)."""
        self._main = self._hosted[0]
        self._plan_inputs: tuple[Any, ...] = ()
        self._signals = SignalBoxes()
        self._reachable = reachable or self._probe
        self.loopback_ok = _is_loopback_url(self.public_url)
        """Nodes may advertise loopback addresses only to a coordinator on loopback."""
        self._verified: dict[str, str] = {}
        """Node id -> the address that answered our probe (placement needs one)."""
        self._probe_failed: dict[str, tuple[str, float]] = {}
        """Node id -> (address, when) of its last unanswered probe."""
        self._proven: dict[str, int] = {}
        """Node id -> bytes of the largest stage it reported serving (node_claims.py)."""
        self._beats = BeatLimiter()
        self._avoid_probes = BeatLimiter(AVOID_PROBES_PER_S, AVOID_PROBE_BURST)
        self._incidents = BeatLimiter(INCIDENTS_PER_S, INCIDENT_BURST)
        """What each node's reports of bad sources may add to the timeline (its 500 events
        are the operator's; one node must not push the rest out)."""
        """Probes each asker's reports of dead stages may cost (route's avoid)."""
        self._pruned_at = 0.0
        self.liveness_probe: Callable[[str], bool] = nothing_listens
        """Whether nothing listens at a reported stage's address (liveness.py)."""
        self._paused: dict[str, str] = {}
        """Nodes that said they are paused, and why. Kept in memory: a paused node says so
        in every heartbeat, so a restarted coordinator learns it again within seconds."""
        self.started_at = utcnow()
        self._suspects: set[str] = set()
        self._gone: set[str] = set()
        """Reported, and their port refused our probe (liveness.py): out until they beat."""
        self._up_since: dict[str, float] = {}
        """Node id -> when its current run of heartbeats began (time.time())."""
        self._last_beat: dict[str, float] = {}
        self._until: dict[str, float] = {}
        """Node id -> the volunteer's declared end of availability (Unix seconds)."""
        self.pieces = PieceBook()
        """Nodes' piece servers and where downloads were pointed (piece_peers.py)."""
        self._reports: dict[str, StageReport] = {}
        """Node id -> its stage's step times from its latest heartbeat. Kept in memory:
        every heartbeat says them again (fleet_view.py predicts from them)."""
        """Nodes a client found unreachable mid-answer (cleared by their next heartbeat)."""
        store.set_setting(CA_CERT, self.ca_pem)
        self.timeline = Timeline(store)
        """The operator's event timeline (timeline.py; the rules in events.py)."""
        self.spot = SpotChecks(settings.spot, store, self.timeline, lambda: self.replan(True))
        """Spot checks, and the nodes they found faulty (spot_service.py)."""
        names = ", ".join(m.name for m in self.models)
        self.timeline.record(
            "started", "", f"serving model{'s' if len(self.models) > 1 else ''} {names}"
        )
        kept = {n for h in self._hosted if h.kept is not None for n in h.kept.node_ids}
        if kept:  # probed by the run that planned them: no re-plan storm
            self._verified = {n.node_id: n.address for n in self.nodes() if n.node_id in kept}

    def _stored_plan(self, model: HostedModel, index: int) -> Plan | None:
        """The model's last good plan from the database; for the first model, the plan a
        coordinator hosting one model kept before plans were kept per model."""
        stored = self.store.get_setting(plan_setting(model.name))
        if stored is None and index == 0:
            stored = self.store.get_setting(PLAN_SETTING)
        return plan_from_json(stored)

    def hosted(self, name: str = "default") -> ModelPlan:
        """The hosted model called `name` ("default": the first); NotFound otherwise."""
        return find(self._hosted, name)

    @property
    def hosted_models(self) -> tuple[ModelPlan, ...]:
        """Every hosted model with its chains, the default first."""
        return tuple(self._hosted)

    def models_answer(self) -> ModelsAnswer:
        """Every hosted model with its chains now (GET MODELS)."""
        return models_answer(self._hosted)

    def _placed(self) -> list[Plan]:
        """Every model's chains (or kept chain while it has none)."""
        return [c for h in self._hosted for c in h.placed()]

    # ------------------------------------------------------------ invites

    def create_invite(
        self, role: str, uses: int, expires: dt.timedelta, note: str = ""
    ) -> tuple[int, str]:
        return create_invite(
            self.store, self.public_url, self.ca_fingerprint, role, uses, expires, note
        )

    def list_invites(self) -> list[InviteRecord]:
        return list_invites(self.store)

    def revoke_invite(self, invite_id: int) -> None:
        revoke_invite(self.store, invite_id)

    # ------------------------------------------------------------ joining

    def join(self, secret: str, csr_pem: str) -> JoinAnswer:
        now = utcnow()
        try:
            csr = auth.load_csr(csr_pem.encode())
        except auth.AuthError as exc:
            raise JoinRefused(f"bad signing request: {exc}") from exc
        secret_hash = inv.hash_secret(secret)
        with self.store.session() as s:
            # One conditional UPDATE takes the use, first: the database serialises
            # concurrent joins with one code, and only one that found a use left gets
            # it. Every later refusal raises inside this transaction, which undoes it.
            taken = s.execute(
                update(Invite)
                .where(
                    Invite.secret_hash == secret_hash,
                    Invite.uses_left > 0,
                    Invite.revoked.is_(False),
                )
                .values(uses_left=Invite.uses_left - 1)
                .execution_options(synchronize_session=False)
            )
            row = s.scalars(select(Invite).where(Invite.secret_hash == secret_hash)).first()
            state = (
                None
                if row is None
                else inv.InviteState(
                    row.role,
                    row.uses_left + (1 if _rowcount(taken) == 1 else 0),
                    as_utc(row.expires_at),
                    row.revoked,
                )
            )
            inv.check_usable(state, now)  # raises the InviteError a person should read
            if row is None or _rowcount(taken) != 1:  # checked usable, yet another took it
                raise inv.InviteUsedUp("this invite has already been used as many times as allowed")
            node_id = f"{row.role}-{secrets.token_hex(3)}"
            base = clean_name(row.note)
            similar = select(Node.name).where(Node.name.startswith(base, autoescape=True))
            name = name_from_note(row.note, set(s.scalars(similar)) if base else set())
            cert = auth.issue_from_csr(self.ca, csr, node_id, row.role, hours=NODE_CERT_HOURS)
            token = secrets.token_urlsafe(24)
            s.add(
                Node(
                    node_id=node_id,
                    role=row.role,
                    token_hash=hash_token(token),
                    invite_id=row.id,
                    name=name,
                    hardware={},
                    stats={},
                )
            )
            s.flush()  # the certificate row refers to the node row
            s.add(
                Certificate(
                    serial=str(cert.serial_number),
                    node_id=node_id,
                    not_after=cert.not_valid_after_utc,
                    revoked=False,
                )
            )
        log.info("node %s joined as %s", node_id, state.role if state else "?")
        named = f" ({name})" if name else ""
        self.timeline.record("joined", node_id, f"as {row.role} with invite #{row.id}{named}")
        return JoinAnswer(
            node_id,
            row.role,
            auth.certificate_pem(cert).decode(),
            self.ca_pem,
            token,
            cert.not_valid_after_utc,
        )

    def authenticate_node(self, node_id: str, token: str) -> Node:
        with self.store.session() as s:
            node = s.get(Node, node_id)
            if node is None or not hmac.compare_digest(node.token_hash, hash_token(token)):
                raise AccessDenied("unknown node or wrong node token")
            if node.forgotten_at is not None:
                raise AccessDenied(
                    f"node {node_id} was forgotten by the operator: join again with a new invite"
                )
            if node.revoked:
                raise AccessDenied(f"node {node_id} was revoked by the operator")
            return node

    def renew(self, node_id: str, token: str, csr_pem: str) -> JoinAnswer:
        node = self.authenticate_node(node_id, token)
        if self.spot.is_faulty(node_id):
            raise AccessDenied(
                f"node {node_id} was found faulty by a spot check: its certificate is "
                "renewed once the operator clears it"
            )
        try:
            csr = auth.load_csr(csr_pem.encode())
        except auth.AuthError as exc:
            raise JoinRefused(f"bad signing request: {exc}") from exc
        cert = auth.issue_from_csr(self.ca, csr, node_id, node.role, hours=NODE_CERT_HOURS)
        with self.store.session() as s:
            s.add(
                Certificate(
                    serial=str(cert.serial_number),
                    node_id=node_id,
                    not_after=cert.not_valid_after_utc,
                    revoked=False,
                )
            )
        return JoinAnswer(
            node_id,
            node.role,
            auth.certificate_pem(cert).decode(),
            self.ca_pem,
            token,
            cert.not_valid_after_utc,
        )

    def revoke_node(self, node_id: str) -> None:
        with self.store.session() as s:
            node = s.get(Node, node_id)
            if node is None:
                raise NotFound(f"no node {node_id}")
            node.revoked = True
            for cert in s.scalars(select(Certificate).where(Certificate.node_id == node_id)):
                cert.revoked = True
        with self._lock:
            self._signals.forget([node_id])
            self._verified.pop(node_id, None)
        self.timeline.record("revoked", node_id, "by the operator: its certificate no longer works")
        self.replan(force=True)

    def revoked_serials(self) -> list[str]:
        return self.store.revoked_serials()

    # ------------------------------------------------------------ registry

    def heartbeat(self, node_id: str, beat: Heartbeat) -> Assignment | None:
        """Record what an (already authenticated) node reports; return its assignment.
        TooFast past its heartbeat rate, ClaimRefused for an address peers must not be
        sent to; an address that does not answer the reachability probe is stored but
        not placed."""
        with self._lock:
            wait = self._beats.take(node_id, time.monotonic())
        if wait > 0:
            raise TooFast(f"{node_id} beats too often", wait)
        address = check_address(beat.address, self.loopback_ok) if beat.address else ""
        if address and not beat.paused:
            self._check_reachable(node_id, address)
        held = beat.pieces_address
        pieces_at = check_address(held, self.loopback_ok) if held and not beat.paused else ""
        self.pieces.beat(node_id, pieces_at, (beat.pieces_layers[0], beat.pieces_layers[1]))
        now = utcnow()
        with self._lock:
            self._suspects.discard(node_id)  # it speaks: whoever could not reach it, it lives
            self._gone.discard(node_id)
            self._note_uptime(node_id, beat.available_until)
        if beat.paused:
            self._paused_beat(node_id, beat, now)
            return None  # out of the plan: no stage
        with self.store.session() as s:
            node = s.get(Node, node_id)
            assert node is not None
            heard = node.last_seen
            node.address = address
            node.capacity_bytes = max(0, beat.capacity_bytes)
            node.vram_cap_bytes = max(0, beat.vram_cap_bytes)
            node.hardware = beat.hardware
            node.stats = beat.stats
            node.path = beat.path[:32]
            node.backend = beat.backend[:200]
            node.device_bytes_used = max(0, beat.device_bytes_used)
            node.device_cap_bytes = max(0, beat.device_cap_bytes)
            node.gpu_layers = max(0, beat.gpu_layers)
            node.n_layers = max(0, beat.n_layers)
            node.sessions = max(0, beat.sessions)
            node.max_sessions = max(0, beat.max_sessions)
            node.kv_budget_bytes = max(0, beat.kv_budget_bytes)
            node.kv_reserved_bytes = max(0, beat.kv_reserved_bytes)
            node.last_seen = now
            with self._lock:
                self._paused.pop(node_id, None)
            s.execute(delete(Rtt).where(Rtt.src == node_id))
            for peer, ms in list(beat.rtt_ms.items())[:256]:
                s.add(Rtt(src=node_id, dst=peer[:64], ms=float(ms), measured_at=now))
            if beat.tokens or beat.compute_ms:
                s.add(
                    Sample(at=now, node_id=node_id, tokens=beat.tokens, compute_ms=beat.compute_ms)
                )
        with self._lock:  # its beat counts the routes handed to its chain since the last
            self._reports[node_id] = StageReport(
                tuple((int(r), float(ms)) for r, ms in beat.step_ms),
                beat.row_budget,
                beat.compute_ms,
            )
            for h in self._hosted:
                for i, chain in enumerate(h.chains):
                    if chain.stages[0].node_id == node_id and i < len(h.handed):
                        h.handed[i] = 0
        self._note_served(node_id, beat.n_layers)
        self._prune(time.monotonic())
        self.replan()
        self._tell_beat(node_id, beat, heard, now)
        self.spot.beat(node_id, beat, self._hosted)
        return self.assignment(node_id)

    def piece_sources(self, asker: str, file: str, model: str = "default") -> list[PieceSource]:
        """Where `asker` gets piece `file` of `model`, best first (piece_peers.rank_sources):
        peers whose heartbeat serves it for their own stage or standby stage, the mirror,
        us. The first peer listed counts as pointed at."""
        hosted = self.hosted(model)
        stages: dict[str, list[tuple[int, int]]] = {}
        for chain in hosted.placed():
            for stage in chain.stages:
                stages.setdefault(stage.node_id, []).append((stage.layers.start, stage.layers.stop))
        if hosted is self._hosted[0]:  # warm spares stand by for the default model
            for spare, layers in self.standby().by_spare.items():
                stages.setdefault(spare, []).append(layers)
        with self._lock:
            paused = set(self._paused)
        healthy = {
            n.node_id
            for n in self.nodes()
            if n.node_id not in paused and self.health(n) == "healthy"
        }
        manifest = hosted.model.manifest
        holders = holders_of(file, manifest, self.pieces.holders(), stages, healthy)
        piece = next(p for p in manifest.pieces if p.file == file)
        has_mirror = manifest.mirror is not None and manifest.mirror.ranges(piece.name) is not None
        ranked = rank_sources(
            asker, holders, self.store.rtt_map(), self.pieces.pointed(), has_mirror
        )
        if ranked[0].kind == "peer":
            self.pieces.point(ranked[0].node_id)
        return ranked

    def _check_reachable(self, node_id: str, address: str) -> None:
        """Probe a node's address once (again after PROBE_RETRY_S while it does not
        answer): placement takes only nodes whose public address answered."""
        with self._lock:
            if self._verified.get(node_id) == address:
                return
            failed = self._probe_failed.get(node_id)
            recent = failed is not None and time.monotonic() - failed[1] < PROBE_RETRY_S
            if recent and failed is not None and failed[0] == address:
                return
        ok = self._reachable(address)  # outside the lock: it waits for an answer
        with self._lock:
            if ok:
                self._verified[node_id] = address
                self._probe_failed.pop(node_id, None)
            else:
                self._verified.pop(node_id, None)
                self._probe_failed[node_id] = (address, time.monotonic())
                # Expected of a node behind a home router (ICE reaches it); a public
                # address that does not answer keeps its node out of placement.
                level = logging.INFO if is_lan_address(address) else logging.WARNING
                log.log(level, "%s: %s did not answer the reachability probe", node_id, address)

    def _probe(self, address: str) -> bool:
        host, port = split_address(address)
        return reach_probe.probe(host, port, self.settings.probe_timeout_s)

    def _note_served(self, node_id: str, n_layers: int) -> None:
        """A node that reports serving its whole stage has shown it holds that much."""
        chains = self._placed()
        stage = next((st for c in chains if (st := c.stage_of(node_id)) is not None), None)
        if stage is None or n_layers <= 0 or n_layers != stage.layers.stop - stage.layers.start:
            return
        with self._lock:
            self._proven[node_id] = max(self._proven.get(node_id, 0), stage.bytes_needed)

    def _prune(self, now: float) -> None:
        """Now and then: old throughput samples, and probe records of the past."""
        with self._lock:
            if now - self._pruned_at < PRUNE_EVERY_S:
                return
            self._pruned_at = now
            for key, (_a, at) in list(self._probe_failed.items()):
                if now - at > PROBE_RETRY_S:
                    del self._probe_failed[key]
        with self.store.session() as s:
            s.execute(delete(Sample).where(Sample.at < utcnow() - SAMPLES_KEPT))
            # Forgotten nodes are kept (revoked) while a certificate of theirs could
            # still open links; then they go for good.
            live_certs = select(Certificate.node_id).where(Certificate.not_after > utcnow())
            done = select(Node.node_id).where(
                Node.forgotten_at.is_not(None), Node.node_id.not_in(live_certs)
            )
            ids = list(s.scalars(done))
            if ids:
                s.execute(delete(Certificate).where(Certificate.node_id.in_(ids)))
                s.execute(delete(Rtt).where(Rtt.src.in_(ids)))
                s.execute(delete(Node).where(Node.node_id.in_(ids)))

    def _note_uptime(self, node_id: str, until: float) -> None:
        """Measured uptime: a beat after a silence past `dead_after_s` starts a new run."""
        now = time.time()
        last = self._last_beat.get(node_id)
        if last is None or now - last > self.settings.dead_after_s:
            self._up_since[node_id] = now
        self._last_beat[node_id] = now
        if until > 0:
            self._until[node_id] = until
        else:
            self._until.pop(node_id, None)

    def standby(self) -> Standby:
        """Which spare keeps which stage ready, and the stages none does (standby.py)."""
        capacities = {n.node_id: placement_capacity(n) for n in self.nodes()}
        with self._lock:
            up_since, until = dict(self._up_since), dict(self._until)
        return standby_of(self._main.plan, up_since, until, capacities)

    def standby_assignment(self, node_id: str) -> Assignment | None:
        """The stage a spare should get ready for (its pieces downloaded), else None."""
        plan = self._main.plan  # the spares are the default model's (fleet_split.py)
        if plan is None or node_id not in plan.spares or not self.settings.warm_spares:
            return None
        layers = self.standby().by_spare.get(node_id)
        if layers is None:
            return None
        s = self.settings
        return standby_assignment(self.model.name, layers, s.sessions_per_stage, s.context_tokens)

    def _paused_beat(self, node_id: str, beat: Heartbeat, now: dt.datetime) -> None:
        """A paused node says only that it is there and why it serves nothing: what it
        reported while serving stays on the operator page; placement leaves it out."""
        with self.store.session() as s:
            node = s.get(Node, node_id)
            assert node is not None
            heard = node.last_seen
            node.last_seen = now
        with self._lock:
            self._paused[node_id] = beat.paused[:100]
        self._tell_beat(node_id, beat, heard, now)  # the pause, then the plan it changes
        self.replan()

    def paused_reason(self, node_id: str) -> str:
        """Why the node said it is paused; "" when it offers to serve."""
        with self._lock:
            return self._paused.get(node_id, "")

    # ------------------------------------------------------------ the operator's story

    def report_incident(self, node_id: str, source: str, reason: str) -> None:
        """A node gave up on a source of pieces (wrong bytes, a stall, a short body): a
        "bad_source" event on the timeline, the reporter named; TooFast past five at
        once and one a minute after."""
        wait = self._incidents.take(node_id, time.monotonic())
        if wait:
            raise TooFast(f"{node_id} reports incidents too often", wait)
        self.record_event("bad_source", node_id, f"{source[:64]}: {reason}")

    def record_event(self, kind: str, node_id: str = "", detail: str = "") -> None:
        """Add an event to the operator's timeline: `kind` one of events.KINDS (e.g.
        "probe_failed"), `node_id` the node it is about ("" for the swarm), `detail` a
        line for the operator. UnknownEventKind for any other kind."""
        self.timeline.record(kind, node_id, detail)

    def events(self, after: int = 0, limit: int = 200) -> list[StoredEvent]:
        """The timeline's newest events (after silences were looked at), oldest first."""
        self.sweep()
        return self.timeline.events(after, limit)

    def node_state(self, node: Node, now: dt.datetime | None = None) -> str:
        """What the page shows: health, or "paused" for a paused node not yet gone."""
        return node_state(self.health(node, now), self.paused_reason(node.node_id))

    def activity(self, node_id: str) -> Report:
        """What the node last said it is doing (downloading with its bytes, loading...)."""
        return self.timeline.report_of(node_id) or Report()

    def can_forget(self, node: Node, now: dt.datetime | None = None) -> bool:
        at = now or utcnow()
        joined_s = (at - as_utc(node.created_at)).total_seconds()
        state = self.node_state(node, at)
        return forgettable(state, node.role, joined_s, self.settings.dead_after_s)

    def rename_node(self, node_id: str, name: str) -> str:
        """Give a node the operator's name for it ("" for none); the name as kept."""
        kept = clean_name(name)
        with self.store.session() as s:
            node = s.get(Node, node_id)
            if node is None or node.forgotten_at is not None:
                raise NotFound(f"no node {node_id}")
            old, node.name = node.name, kept
        if old != kept:
            self.timeline.record("renamed", node_id, f"{old or node_id!r} -> {kept or node_id!r}")
        return kept

    def forget_node(self, node_id: str) -> None:
        """Take a gone (or revoked) node out of the registry and off the page, for good:
        its certificates are revoked and its token stops working. NodeAlive for a node
        that is alive, stale or paused (it might come back), NotFound for none."""
        now = utcnow()
        with self.store.session() as s:
            node = s.get(Node, node_id)
            if node is None or node.forgotten_at is not None:
                raise NotFound(f"no node {node_id}")
            if not self.can_forget(node, now):
                state = self.node_state(node, now)
                raise NodeAlive(f"{node_id} is {state}: only a gone or revoked node is forgotten")
            node.forgotten_at = now
            node.revoked = True
            for cert in s.scalars(select(Certificate).where(Certificate.node_id == node_id)):
                cert.revoked = True
        with self._lock:
            self._signals.forget([node_id])
            for memory in (self._verified, self._paused, self._reports, self._proven):
                memory.pop(node_id, None)
            for times in (self._up_since, self._last_beat, self._until):
                times.pop(node_id, None)
        self.timeline.forget(node_id)
        self.timeline.record("forgotten", node_id, "by the operator: out of the registry")
        self.replan(force=True)

    def sweep(self, due: bool = False) -> None:
        """Now and then (or now, when `due`): events for nodes gone silent (stale, then
        gone)."""
        if not self.timeline.sweep_due(time.monotonic()) and not due:
            return
        now = utcnow()
        states = {}
        for n in self.nodes():
            seen = max(as_utc(n.last_seen), self.started_at) if n.last_seen else now
            states[n.node_id] = (self.node_state(n, now), (now - seen).total_seconds())
        self.timeline.sweep(states)

    def _tell_beat(
        self, node_id: str, beat: Heartbeat, heard: dt.datetime | None, now: dt.datetime
    ) -> None:
        """The timeline hears what a heartbeat said (after the node was silent since
        `heard`), then looks at every node's silence."""
        since = None if heard is None else max(as_utc(heard), self.started_at)
        silent = 0.0 if since is None else (now - since).total_seconds()
        report = Report(
            activity=beat.activity,
            paused=beat.paused[:100],
            layers=self._layers_of(node_id, beat.activity),
            done_bytes=max(0, beat.download_done_bytes),
            total_bytes=max(0, beat.download_total_bytes),
        )
        self.timeline.beat(node_id, report, max(0.0, silent))
        self.sweep()

    def _layers_of(self, node_id: str, activity: str) -> tuple[int, int] | None:
        """The layers a node works on: those it stands by for (a spare's word that it
        stands by is about those, even just after it was promoted), or its stage."""
        if activity == "standby":
            return self.standby().by_spare.get(node_id)
        for chain in self._placed():
            stage = chain.stage_of(node_id)
            if stage is not None:
                return (stage.layers.start, stage.layers.stop)
        return None

    def _names(self) -> dict[str, str]:
        return {n.node_id: n.name for n in self.nodes() if n.name}

    def health(self, node: Node, now: dt.datetime | None = None) -> str:
        if node.revoked:
            return "revoked"
        if node.last_seen is None:
            return "joined"
        # Silence counts from when this process could hear it: after a restart every
        # node gets a full timeout to heartbeat again, instead of all looking gone and
        # the plan being torn down (a re-plan storm).
        seen = max(as_utc(node.last_seen), self.started_at)
        age = ((now or utcnow()) - seen).total_seconds()
        if age > self.settings.dead_after_s:
            return "gone"
        if age > self.settings.stale_after_s:
            return "stale"
        return "healthy"

    def nodes(self) -> list[Node]:
        with self.store.session() as s:
            return self.store.nodes(s)

    # ------------------------------------------------------------ placement

    def replan(self, force: bool = False) -> Plan | None:
        """Place the healthy, reachable, unpaused workers (when what placement sees
        changed, or `force`); the timeline hears of a plan that changed."""
        before = self._main.plan
        plan = self._replan(force)
        if plan is not before:  # a node gone silent is told before the plan without it
            self.sweep(due=True)
        view = None if plan is None else _plan_view(plan)
        self.timeline.plan_now(view, self._main.error or "", self._names)
        for h in self._hosted[1:]:  # the other models' plans, their lines named by model
            other = None if h.plan is None else _plan_view(h.plan)
            self.timeline.plan_now(other, h.error or "", self._names, model=h.name)
        return plan

    def _replan(self, force: bool) -> Plan | None:
        now = utcnow()
        with self._lock:
            paused = set(self._paused)
            suspects = set(self._suspects)
            gone = set(self._gone)
            verified = dict(self._verified)
            proven = dict(self._proven)
        faulty = self.spot.faulty()  # caught by a spot check: out until the operator clears it
        workers = [
            n
            for n in self.nodes()
            if n.role == "worker"
            and n.address
            # It answered at this address, or it sits behind a home router (ICE reaches it).
            and (verified.get(n.node_id) == n.address or is_lan_address(n.address))
            and n.node_id not in paused
            and n.node_id not in gone
            and n.node_id not in faulty
            and (
                self.health(n, now) == "healthy"
                or (self.health(n, now) == "stale" and n.node_id not in suspects)
            )
        ]
        # What a node claims, held to its hardware report; then to what its peers offer
        # unless it served more itself (node_claims.bounded_capacity).
        clamped = {
            n.node_id: min(placement_capacity(n), hardware_bytes(n.hardware)) for n in workers
        }
        bounded = peer_bound_capacities(clamped, proven)
        infos = tuple(
            NodeInfo(n.node_id, bounded[n.node_id], healthy=True, address=n.address)
            for n in workers
        )
        claims = tuple(replace(i, capacity_bytes=clamped[i.node_id]) for i in infos)
        trusted = self.trusted_nodes()
        inputs = (infos, claims, self.settings, trusted)
        # Computed from the last plan, before this one: the spare warm for a stage that
        # just died is the one its repair should take (it serves without loading).
        warm = warm_layers(self.standby()) if self.settings.warm_spares else {}
        with self._lock:
            if not force and inputs == self._plan_inputs:
                return self._main.plan
            self._plan_inputs = inputs
            if len(infos) < self.settings.min_stages:
                waiting = f"waiting for workers: {len(infos)} of {self.settings.min_stages} joined"
                for h in self._hosted:
                    h.fail(waiting)
                return None
            outcomes = place_models(
                self._hosted, infos, claims, self._rules(), self.store.rtt_map(), warm, trusted
            )
            for h, outcome in zip(self._hosted, outcomes, strict=True):
                if isinstance(outcome, str):
                    h.fail(outcome)
                elif h.adopt(outcome) and h.plan is not None:
                    self.store.set_setting(plan_setting(h.name), plan_to_json(h.plan))
            return self._main.plan

    def _rules(self) -> Rules:
        s = self.settings
        return Rules(
            max_chains=s.max_chains,
            spares=s.spares,
            min_stages=s.min_stages,
            sessions_per_stage=s.sessions_per_stage,
            context_tokens=s.context_tokens,
            trusted_ends=s.trusted_ends,
        )

    # ------------------------------------------------------------ trusted nodes

    def trusted_nodes(self) -> frozenset[str]:
        """The nodes the operator marked trusted (for the first and last stage)."""
        stored = self.store.get_setting(TRUSTED_NODES)
        try:
            ids = json.loads(stored) if stored else []
        except ValueError:
            ids = []
        return frozenset(str(i) for i in ids if isinstance(i, str))

    def set_trusted(self, node_id: str, trusted: bool) -> None:
        """Mark a joined node trusted (or not); NotFound for an unknown node."""
        with self.store.session() as s:
            if s.get(Node, node_id) is None:
                raise NotFound(f"no node {node_id}")
        ids = set(self.trusted_nodes())
        ids = ids | {node_id} if trusted else ids - {node_id}
        text = json.dumps(sorted(ids))
        if len(text) > MAX_TRUSTED_CHARS:
            raise ValueError("too many trusted nodes to store; unmark some first")
        self.store.set_setting(TRUSTED_NODES, text)
        self.replan(force=True)

    @property
    def chains(self) -> list[Plan]:
        """Every complete chain of the default model, the main one first."""
        return list(self._main.chains)

    @property
    def current_plan(self) -> Plan | None:
        """The default model's main chain."""
        return self._main.plan

    @property
    def plan_error(self) -> str | None:
        return self._main.error

    def answer_chain(self) -> tuple[Chain, str]:
        """The main chain as the answer probe dials it ((node id, address) per stage), or
        none and why there is none."""
        plan = self._main.plan
        if plan is None:
            return (), self._main.error or "no plan yet"
        addresses = {n.node_id: n.address for n in self.nodes()}
        chain = tuple((st.node_id, addresses.get(st.node_id) or "") for st in plan.stages)
        if any(not address for _, address in chain):
            return (), "a stage of the plan has no address"
        return chain, ""

    def assignment(self, node_id: str) -> Assignment | None:
        # While no plan can be made (too few healthy workers for a moment: late heartbeats
        # on a loaded machine, a dead stage not yet replaced), the others keep the last
        # good plan's stages: answering "nothing" would make every worker drop and reload
        # its stage, a re-plan storm that outlasts the gap itself.
        with self._lock:
            if node_id in self._paused:
                return None
        # A worker serves one model's stage at a time (placement/fleet_split.py).
        found = next(
            (
                (h.name, c)
                for h in self._hosted
                for c in h.placed()
                if c.stage_of(node_id) is not None
            ),
            None,
        )
        if found is None:
            return None
        model, current = found
        stage = current.stage_of(node_id)
        if stage is None:
            return None
        nxt = current.next_hop(node_id)
        addresses = {n.node_id: n.address for n in self.nodes()}
        return Assignment(
            model,
            (stage.layers.start, stage.layers.stop),
            None if nxt is None else NextHop(nxt.node_id, addresses.get(nxt.node_id, "")),
            contract.manifest_path(model),
            contract.pieces_path(model),
            max_sessions=self.settings.sessions_per_stage,
            context_tokens=self.settings.context_tokens,
        )

    def route(self, model: str, avoid: tuple[str, ...] = (), asker: str = "") -> RouteAnswer:
        """The current chain; with `avoid` (stages a client found dead mid-answer), only
        a chain without them. A reported node already silent past `stale_after_s` leaves
        the plan at once instead of at `dead_after_s`: its spare takes over sooner, and
        a node that still heartbeats cannot be pushed out by a client's report. Only
        stages are kept as reported, and `asker` has few probes to spend (a report
        naming many live stages would otherwise hold this thread 0.3 s for each)."""
        hosted = self.hosted(model)  # NotFound for a model this swarm does not serve
        if avoid:
            # Only stages of a current chain count (no other id is kept), and only a few
            # of them not probed just now are probed: a report naming many live stages
            # must not hold this thread 0.3 s for each.
            now = time.monotonic()
            with self._lock:
                staged = {st.node_id for c in hosted.chains for st in c.stages} - self._gone
                named = [a for a in dict.fromkeys(avoid) if a in staged]
                fresh = []
                for a in named[:MAX_AVOID_PROBES]:  # each probe costs the asker a token
                    if self._avoid_probes.take(asker, now) > 0:
                        break
                    fresh.append(a)
            # Outside the lock: a refusal at the node's own address drops it now, not
            # once silent past stale_after_s (the spare then waits for nothing more).
            addresses = {n.node_id: n.address for n in self.nodes() if n.node_id in fresh}
            gone = confirmed_gone(fresh, addresses.get, self.liveness_probe)
            with self._lock:
                self._suspects.update(named)
                self._gone.update(gone)
            for node_id in sorted(gone):
                detail = "a client could not reach it, and its port refused the coordinator's probe"
                self.timeline.said_gone(node_id, detail)
        self.replan()
        current = hosted.plan
        if current is None:
            raise NotFound(f"no route yet: {hosted.error or 'no plan'}")
        nodes = {n.node_id: n for n in self.nodes()}
        addresses = {k: n.address for k, n in nodes.items()}
        with self._lock:
            chains = hosted.chains or [current]
            # Only chains without a stage the client found dead.
            usable = [i for i, c in enumerate(chains) if not set(c.node_ids) & set(avoid)]
            if not usable:
                blocked = sorted({st.node_id for st in current.stages} & set(avoid))
                raise NotFound(f"no route avoiding {', '.join(blocked)} yet: waiting for a re-plan")
            pick = usable[0]
            handed = hosted.handed
            if len(usable) > 1 and len(handed) == len(chains):
                loads = [
                    [_stage_load(nodes.get(st.node_id)) for st in chains[i].stages] for i in usable
                ]
                pick = usable[pick_chain(loads, [handed[i] for i in usable])]
            if len(handed) == len(chains):
                handed[pick] += 1
            current = chains[pick]
        stages = tuple(
            RouteAnswerStage(
                st.node_id, addresses.get(st.node_id, ""), (st.layers.start, st.layers.stop)
            )
            for st in current.stages
        )
        faulty = tuple(reversed(self.spot.faulty()))[:MAX_FAULTY_LISTED]
        return RouteAnswer(hosted.name, stages, faulty)

    def fleet_forecast(self) -> FleetForecast:
        """The main chain's predicted tokens/s, alone and at 1..N requests at once, from
        the stages' reported step times and the links' measured round trips."""
        plan = self._main.plan
        nodes = self.nodes()
        loads = {n.node_id: StageCapacity(n.max_sessions, n.kv_budget_bytes) for n in nodes}
        with self._lock:
            reports = dict(self._reports)
        return forecast(
            plan,
            self.model.spec,
            reports,
            loads,
            self.store.rtt_map(),
            self.settings.context_tokens,
        )

    # ------------------------------------------------------------ relay

    def turn_credentials(self, node_id: str) -> TurnAnswer | None:
        """coturn REST credentials for a joined node, or None where there is no relay."""
        if self.settings.turn_server is None or not self.settings.turn_secret:
            return None
        host, port = self.settings.turn_server
        # One username per node and window: coturn's per-user quota holds per node.
        creds = node_credentials(
            self.settings.turn_secret,
            node_id,
            self.settings.turn_ttl_s,
            time.time(),
            (turn_uri(host, port), stun_uri(host, port)),
        )
        return TurnAnswer(
            host, port, creds.username, creds.password, creds.ttl_s, tuple(creds.uris)
        )

    # ------------------------------------------------------------ signalling

    def post_signal(self, src: str, dst: str, message: SignalPost) -> None:
        """Carry an ICE offer/answer from one joined node to another (WebRTC-style),
        only along a link the plan has (signalling.py); SignalRefused otherwise."""
        with self.store.session() as s:
            peer, sender = s.get(Node, dst), s.get(Node, src)
            if peer is None or peer.revoked or sender is None:
                raise NotFound(f"no node {dst!r} to signal")
            role = sender.role
        allowed = planned_peers(self._placed(), src, role)
        signal = Signal(src, message.kind, message.link, message.payload)
        with self._lock:
            self._signals.post(signal, dst, allowed, time.monotonic())

    def take_signals(self, node_id: str) -> list[Signal]:
        with self._lock:
            return self._signals.take(node_id, time.monotonic())

    # ------------------------------------------------------------ operator

    def set_admin_password(self, password: str) -> None:
        self.store.set_setting(ADMIN_PASSWORD, hash_password(password))

    def check_admin_password(self, password: str) -> bool:
        stored = self.store.get_setting(ADMIN_PASSWORD)
        return stored is not None and check_password(password, stored)

    def throughput(self, minutes: int = 30) -> list[tuple[str, int]]:
        """Tokens reported per 10-second bucket over the last `minutes`."""
        since = utcnow() - dt.timedelta(minutes=minutes)
        buckets: dict[str, int] = {}
        with self.store.session() as s:
            for row in s.scalars(select(Sample).where(Sample.at >= since).order_by(Sample.at)):
                at = as_utc(row.at)
                key = at.replace(second=at.second - at.second % 10, microsecond=0).isoformat()
                buckets[key] = buckets.get(key, 0) + row.tokens
        return sorted(buckets.items())
