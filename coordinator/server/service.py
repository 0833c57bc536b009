"""What the coordinator does, without HTTP: invites, joining, the registry, placement,
routes. The API module parses requests and calls these methods; nothing here knows
about requests or responses.
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from coordinator import contract
from coordinator import invites as inv
from coordinator.contract import (
    Assignment,
    Heartbeat,
    JoinAnswer,
    NextHop,
    RouteAnswer,
    RouteStage,
    Signal,
    SignalPost,
    TurnCredentials,
)
from coordinator.errors import AccessDenied, JoinRefused, NotFound, PlacementError
from coordinator.server.fleet_view import FleetForecast, StageReport, forecast
from coordinator.server.fleet_view import StageLoad as FleetLoad
from coordinator.server.invite_book import (
    InviteRecord,
    create_invite,
    list_invites,
    revoke_invite,
)
from coordinator.server.liveness import confirmed_gone, nothing_listens
from coordinator.server.placement import ModelSpec, NodeInfo, Plan
from coordinator.server.plan_store import PLAN_SETTING, plan_from_json, plan_to_json
from coordinator.server.remote_model import RemotePieces
from coordinator.server.routes import StageLoad, pick_chain, plan_chains
from coordinator.server.secret_hashes import check_password, hash_password, hash_token
from coordinator.server.spare_policy import Standby
from coordinator.server.standby import standby_assignment, standby_of, warm_layers
from coordinator.server.store import Certificate, Invite, Node, Rtt, Sample, Store, as_utc, utcnow
from core.manifest import Manifest
from net import auth
from net.turn import DEFAULT_NODE_TTL_S, node_credentials, stun_uri, turn_uri

log = logging.getLogger(__name__)

NODE_CERT_HOURS = 24
MAX_PENDING_SIGNALS = 64
ADMIN_PASSWORD = "admin_password_hash"
CA_CERT = "ca_certificate_pem"


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


@dataclass(frozen=True)
class Settings:
    stale_after_s: float = 15.0
    """A node silent this long is shown as stale."""
    dead_after_s: float = 45.0
    """A node silent this long is dropped from the plan (its spare takes over)."""
    min_stages: int = 1
    spares: int = 0
    warm_spares: bool = True
    """Spares download the pieces of the stage most at risk in advance (spare_policy)."""
    sessions_per_stage: int = 256
    """Sessions each stage is planned for; llama.cpp allows 256 sequences per context."""
    context_tokens: int = 256
    """Positions of KV per session. A worker's KV cache is one shared pool (llama.cpp's
    unified cache) of max_sessions x this; the assignment tells the worker both, so
    placement counts exactly the memory the stage allocates."""
    max_chains: int = 1
    """Complete chains to form when nodes beyond the main chain (and its spares) can
    hold the model again; new routes go to the one with the most room by measured load
    (coordinator/server/routes.py). 1: one chain, every other node a spare."""
    turn_server: tuple[str, int] | None = None
    """The swarm's relay (coturn), if any: nodes get short-lived credentials for it."""
    turn_secret: str = field(default="", repr=False)
    turn_ttl_s: int = DEFAULT_NODE_TTL_S
    """One username per node per window this long (net.turn.node_credentials)."""
    metrics_public: bool = False
    """Serve /metrics to anyone; by default only to the operator and to loopback."""


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


class Coordinator:
    def __init__(
        self,
        store: Store,
        ca: auth.CertifiedKey,
        public_url: str,
        model: HostedModel,
        settings: Settings = Settings(),
    ) -> None:
        self.store = store
        self.ca = ca
        self.public_url = public_url.rstrip("/")
        self.model = model
        self.settings = settings
        self.ca_pem = auth.certificate_pem(ca.certificate).decode()
        self.ca_fingerprint = auth.fingerprint(ca.certificate)
        self._lock = threading.Lock()
        self._plan: Plan | None = None
        self._chains: list[Plan] = []
        """The main chain (`_plan`) and any more complete chains, in placement order."""
        self._handed: list[int] = []
        """Routes handed out per chain since its first stage's last heartbeat."""
        self._kept: Plan | None = plan_from_json(store.get_setting(PLAN_SETTING))
        """The last good main chain: where the next re-plan starts, after a failed one or
        a restart, so that assignments stay put (coordinator/server/plan_store.py)."""
        self._plan_error: str | None = None
        self._plan_inputs: tuple[Any, ...] = ()
        self._signals: dict[str, list[Signal]] = {}
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
        self._reports: dict[str, StageReport] = {}
        """Node id -> its stage's step times from its latest heartbeat. Kept in memory:
        every heartbeat says them again (fleet_view.py predicts from them)."""
        """Nodes a client found unreachable mid-answer (cleared by their next heartbeat)."""
        store.set_setting(CA_CERT, self.ca_pem)

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
        with self.store.session() as s:
            row = s.scalars(
                select(Invite).where(Invite.secret_hash == inv.hash_secret(secret))
            ).first()
            state = (
                None
                if row is None
                else inv.InviteState(row.role, row.uses_left, as_utc(row.expires_at), row.revoked)
            )
            inv.check_usable(state, now)  # raises the InviteError a person should read
            assert row is not None
            row.uses_left -= 1
            node_id = f"{row.role}-{secrets.token_hex(3)}"
            cert = auth.issue_from_csr(self.ca, csr, node_id, row.role, hours=NODE_CERT_HOURS)
            token = secrets.token_urlsafe(24)
            s.add(
                Node(
                    node_id=node_id,
                    role=row.role,
                    token_hash=hash_token(token),
                    invite_id=row.id,
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
            if node.revoked:
                raise AccessDenied(f"node {node_id} was revoked by the operator")
            return node

    def renew(self, node_id: str, token: str, csr_pem: str) -> JoinAnswer:
        node = self.authenticate_node(node_id, token)
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
        self.replan(force=True)

    def revoked_serials(self) -> list[str]:
        return self.store.revoked_serials()

    # ------------------------------------------------------------ registry

    def heartbeat(self, node_id: str, beat: Heartbeat) -> Assignment | None:
        """Record what an (already authenticated) node reports; return its assignment."""
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
            node.address = beat.address[:200]
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
            for i, chain in enumerate(self._chains):
                if chain.stages[0].node_id == node_id and i < len(self._handed):
                    self._handed[i] = 0
        self.replan()
        return self.assignment(node_id)

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
        return standby_of(self._plan, up_since, until, capacities)

    def standby_assignment(self, node_id: str) -> Assignment | None:
        """The stage a spare should get ready for (its pieces downloaded), else None."""
        plan = self._plan
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
            node.last_seen = now
        with self._lock:
            self._paused[node_id] = beat.paused[:100]
        self.replan()

    def paused_reason(self, node_id: str) -> str:
        """Why the node said it is paused; "" when it offers to serve."""
        with self._lock:
            return self._paused.get(node_id, "")

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
        now = utcnow()
        with self._lock:
            paused = set(self._paused)
            suspects = set(self._suspects)
            gone = set(self._gone)
        workers = [
            n
            for n in self.nodes()
            if n.role == "worker"
            and n.address
            and n.node_id not in paused
            and n.node_id not in gone
            and (
                self.health(n, now) == "healthy"
                or (self.health(n, now) == "stale" and n.node_id not in suspects)
            )
        ]
        infos = tuple(
            NodeInfo(n.node_id, placement_capacity(n), healthy=True, address=n.address)
            for n in workers
        )
        inputs = (infos, self.settings)
        # Computed from the last plan, before this one: the spare warm for a stage that
        # just died is the one its repair should take (it serves without loading).
        warm = warm_layers(self.standby()) if self.settings.warm_spares else {}
        with self._lock:
            if not force and inputs == self._plan_inputs:
                return self._plan
            self._plan_inputs = inputs
            if len(infos) < self.settings.min_stages:
                self._plan, self._plan_error = (
                    None,
                    (f"waiting for workers: {len(infos)} of {self.settings.min_stages} joined"),
                )
                self._chains, self._handed = [], []
                return None
            try:
                chains = plan_chains(
                    self.model.spec,
                    infos,
                    max_chains=self.settings.max_chains,
                    rtt_ms=self.store.rtt_map(),
                    previous=self._chains or ([self._kept] if self._kept else []),
                    sessions_per_stage=self.settings.sessions_per_stage,
                    context_tokens=self.settings.context_tokens,
                    spares=self.settings.spares,
                    min_stages=self.settings.min_stages,
                    warm=warm,
                )
                if [c.node_ids for c in chains] != [c.node_ids for c in self._chains]:
                    self._handed = [0] * len(chains)
                self._chains, self._plan, self._plan_error = chains, chains[0], None
                if self._kept is None or self._kept.stages != self._plan.stages:
                    self.store.set_setting(PLAN_SETTING, plan_to_json(self._plan))
                self._kept = self._plan
            except PlacementError as exc:
                self._plan, self._plan_error = None, str(exc)
                self._chains, self._handed = [], []
            return self._plan

    @property
    def chains(self) -> list[Plan]:
        """Every complete chain, the main one first."""
        return list(self._chains)

    @property
    def current_plan(self) -> Plan | None:
        return self._plan

    @property
    def plan_error(self) -> str | None:
        return self._plan_error

    def assignment(self, node_id: str) -> Assignment | None:
        # While no plan can be made (too few healthy workers for a moment: late heartbeats
        # on a loaded machine, a dead stage not yet replaced), the others keep the last
        # good plan's stages: answering "nothing" would make every worker drop and reload
        # its stage, a re-plan storm that outlasts the gap itself.
        chains = self._chains or ([self._kept] if self._kept is not None else [])
        with self._lock:
            if node_id in self._paused:
                return None
        current = next((c for c in chains if c.stage_of(node_id) is not None), None)
        if current is None:
            return None
        stage = current.stage_of(node_id)
        if stage is None:
            return None
        nxt = current.next_hop(node_id)
        addresses = {n.node_id: n.address for n in self.nodes()}
        return Assignment(
            self.model.name,
            (stage.layers.start, stage.layers.stop),
            None if nxt is None else NextHop(nxt.node_id, addresses.get(nxt.node_id, "")),
            contract.manifest_path(self.model.name),
            contract.pieces_path(self.model.name),
            max_sessions=self.settings.sessions_per_stage,
            context_tokens=self.settings.context_tokens,
        )

    def route(self, model: str, avoid: tuple[str, ...] = ()) -> RouteAnswer:
        """The current chain; with `avoid` (stages a client found dead mid-answer), only
        a chain without them. A reported node already silent past `stale_after_s` leaves
        the plan at once instead of at `dead_after_s`: its spare takes over sooner, and
        a node that still heartbeats cannot be pushed out by a client's report."""
        if model not in (self.model.name, "default"):
            raise NotFound(f"this swarm serves {self.model.name!r}, not {model!r}")
        if avoid:
            # Outside the lock: a refusal at the node's own address drops it now, not
            # once silent past stale_after_s (the spare then waits for nothing more).
            staged = {st.node_id for c in self._chains for st in c.stages} - self._gone
            addresses = {n.node_id: n.address for n in self.nodes() if n.node_id in staged}
            gone = confirmed_gone(avoid, addresses.get, nothing_listens)
            with self._lock:
                self._suspects.update(avoid)
                self._gone.update(gone)
        current = self.replan()
        if current is None:
            raise NotFound(f"no route yet: {self._plan_error or 'no plan'}")
        nodes = {n.node_id: n for n in self.nodes()}
        addresses = {k: n.address for k, n in nodes.items()}
        with self._lock:
            chains = self._chains or [current]
            # Only chains without a stage the client found dead.
            usable = [i for i, c in enumerate(chains) if not set(c.node_ids) & set(avoid)]
            if not usable:
                blocked = sorted({st.node_id for st in current.stages} & set(avoid))
                raise NotFound(f"no route avoiding {', '.join(blocked)} yet: waiting for a re-plan")
            pick = usable[0]
            if len(usable) > 1 and len(self._handed) == len(chains):
                loads = [
                    [_stage_load(nodes.get(st.node_id)) for st in chains[i].stages] for i in usable
                ]
                pick = usable[pick_chain(loads, [self._handed[i] for i in usable])]
            if len(self._handed) == len(chains):
                self._handed[pick] += 1
            current = chains[pick]
        stages = tuple(
            RouteStage(st.node_id, addresses.get(st.node_id, ""), (st.layers.start, st.layers.stop))
            for st in current.stages
        )
        return RouteAnswer(self.model.name, stages)

    def fleet_forecast(self) -> FleetForecast:
        """The main chain's predicted tokens/s, alone and at 1..N requests at once, from
        the stages' reported step times and the links' measured round trips."""
        plan = self._plan
        nodes = self.nodes()
        loads = {n.node_id: FleetLoad(n.max_sessions, n.kv_budget_bytes) for n in nodes}
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

    def turn_credentials(self, node_id: str) -> TurnCredentials | None:
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
        return TurnCredentials(
            host, port, creds.username, creds.password, creds.ttl_s, tuple(creds.uris)
        )

    # ------------------------------------------------------------ signalling

    def post_signal(self, src: str, dst: str, message: SignalPost) -> None:
        """Carry an ICE offer/answer from one joined node to another (WebRTC-style)."""
        with self.store.session() as s:
            peer = s.get(Node, dst)
            if peer is None or peer.revoked:
                raise NotFound(f"no node {dst!r} to signal")
        with self._lock:
            box = self._signals.setdefault(dst, [])
            if len(box) >= MAX_PENDING_SIGNALS:
                raise ValueError(f"{dst} has too many unread signals")
            box.append(Signal(src, message.kind, message.link, message.payload))

    def take_signals(self, node_id: str) -> list[Signal]:
        with self._lock:
            return self._signals.pop(node_id, [])

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
