"""What the coordinator does, without HTTP: the one object the API calls. It hears
heartbeats, re-places the workers, hands out assignments and routes, carries signals and
tells the operator's timeline; the pieces of state it keeps each have an owner of their
own (node_identity, reachability, node_memory, plan_keeper, piece_peers, spot_service,
timeline), and nothing here knows about requests or responses.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence

from coordinator.contract import (
    Assignment,
    Heartbeat,
    JoinAnswer,
    ModelsAnswer,
    PieceSource,
    RouteAnswer,
    Signal,
    SignalPost,
    TurnAnswer,
)
from coordinator.errors import AccessDenied, CoordinatorError, NotFound
from coordinator.server.answer_probe import AnswerState, Chain
from coordinator.server.events import Report, clean_name, forgettable, health_of, node_state
from coordinator.server.fleet_view import FleetForecast, StageCapacity, StageReport, forecast
from coordinator.server.invite_book import InviteRecord, create_invite, list_invites, revoke_invite
from coordinator.server.liveness import nothing_listens
from coordinator.server.models import (
    HostedModel as HostedModel,  # importers name it from here
)
from coordinator.server.models import ModelPlan, check_names, models_answer
from coordinator.server.node_claims import BeatLimiter, TooFast, check_address
from coordinator.server.node_identity import Identities, relay_credentials
from coordinator.server.node_memory import NodeMemory
from coordinator.server.piece_peers import PieceBook
from coordinator.server.placement import Plan
from coordinator.server.plan_inputs import (
    TRUSTED_NODES,
    node_infos,
    placeable,
    rules_of,
    trusted_from,
    trusted_text,
)
from coordinator.server.plan_inputs import (
    placement_capacity as placement_capacity,  # importers name it from here
)
from coordinator.server.plan_keeper import Plans
from coordinator.server.reachability import Reachability, is_loopback_url, probe_address
from coordinator.server.routing import (
    DeadStageReports,
    assignment_for,
    probe_chain,
    route_answer,
    stage_load,
)
from coordinator.server.secret_hashes import check_password, hash_password
from coordinator.server.service_settings import (
    CoordinatorSettings as CoordinatorSettings,  # importers name it from here
)
from coordinator.server.signalling import SignalBoxes, planned_peers
from coordinator.server.spare_policy import Standby
from coordinator.server.spot_service import SpotChecks
from coordinator.server.standby import standby_assignment, standby_of, warm_layers
from coordinator.server.store import Node, Store, as_utc, utcnow
from coordinator.server.timeline import StoredEvent, Timeline
from net import auth

ADMIN_PASSWORD = "admin_password_hash"
CA_CERT = "ca_certificate_pem"
SAMPLES_KEPT = dt.timedelta(hours=1)
"""Throughput samples older than this are deleted (the operator's plot shows 30 min)."""
PRUNE_EVERY_S = 60.0
INCIDENTS_PER_S = 1 / 60
INCIDENT_BURST = 5.0
"""What each node's reports of bad sources may add to the timeline (its 500 events are
the operator's; one node must not push the rest out)."""


_DEFAULT_SETTINGS = CoordinatorSettings()


class NodeAlive(CoordinatorError):
    """The operator asked to forget a node that is alive, stale or paused."""


class Coordinator:
    def __init__(
        self,
        store: Store,
        ca: auth.CertifiedKey,
        public_url: str,
        model: HostedModel,
        settings: CoordinatorSettings = _DEFAULT_SETTINGS,
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
        self.answer = AnswerState()
        """Whether the planned chain answered the last probe (answer_prober.py sets it)."""
        self._plans = Plans(store, self.models)
        """Each hosted model's chains, the default first (models.py)."""
        self._main = self._plans.main
        self._lock = threading.Lock()
        """Guards the signal boxes, the heartbeat limiter and the pruning clock."""
        self._signals = SignalBoxes()
        self._reach = Reachability(
            reachable or (lambda address: probe_address(address, self.settings.probe_timeout_s))
        )
        self.loopback_ok = is_loopback_url(self.public_url)
        """Nodes may advertise loopback addresses only to a coordinator on loopback."""
        self._memory = NodeMemory()
        self._beats = BeatLimiter()
        self._incidents = BeatLimiter(INCIDENTS_PER_S, INCIDENT_BURST)
        self._pruned_at = 0.0
        self.liveness_probe: Callable[[str], bool] = nothing_listens
        """Whether nothing listens at a reported stage's address (liveness.py)."""
        self.started_at = utcnow()
        self.pieces = PieceBook()
        """Nodes' piece servers and where downloads were pointed (piece_peers.py)."""
        self.timeline = Timeline(store)
        """The operator's event timeline (timeline.py; the rules in events.py)."""
        self._dead_stages = DeadStageReports(self._plans, self._memory, self.timeline)
        self._identities = Identities(store, ca, self.timeline)
        self.ca_pem = self._identities.ca_pem
        self.ca_fingerprint = self._identities.ca_fingerprint
        store.set_setting(CA_CERT, self.ca_pem)
        self.spot = SpotChecks(settings.spot, store, self.timeline, lambda: self.replan(True))
        """Spot checks, and the nodes they found faulty (spot_service.py)."""
        names = ", ".join(m.name for m in self.models)
        self.timeline.record(
            "started", "", f"serving model{'s' if len(self.models) > 1 else ''} {names}"
        )
        kept = self._plans.kept_nodes()
        if kept:  # probed by the run that planned them: no re-plan storm
            self._reach.trust({n.node_id: n.address for n in self.nodes() if n.node_id in kept})

    def hosted(self, name: str = "default") -> ModelPlan:
        """The hosted model called `name` ("default": the first); NotFound otherwise."""
        return self._plans.find(name)

    @property
    def hosted_models(self) -> tuple[ModelPlan, ...]:
        """Every hosted model with its chains, the default first."""
        return tuple(self._plans.hosted)

    def models_answer(self) -> ModelsAnswer:
        """Every hosted model with its chains now (GET MODELS)."""
        return models_answer(self._plans.hosted)

    @property
    def _suspects(self) -> set[str]:
        """Nodes a client could not reach that have not beaten since (a copy)."""
        return self._memory.suspects()

    @property
    def _gone(self) -> set[str]:
        """Reported nodes whose port refused our probe, until they beat (a copy)."""
        return self._memory.gone()

    # ------------------------------------------------------------ invites and identity

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

    def join(self, secret: str, csr_pem: str) -> JoinAnswer:
        return self._identities.join(secret, csr_pem)

    def authenticate_node(self, node_id: str, token: str) -> Node:
        return self._identities.authenticate(node_id, token)

    def renew(self, node_id: str, token: str, csr_pem: str) -> JoinAnswer:
        node = self._identities.authenticate(node_id, token)
        if self.spot.is_faulty(node_id):
            raise AccessDenied(
                f"node {node_id} was found faulty by a spot check: its certificate is "
                "renewed once the operator clears it"
            )
        return self._identities.renew(node, token, csr_pem)

    def revoke_node(self, node_id: str) -> None:
        self._identities.revoke(node_id)
        with self._lock:
            self._signals.forget([node_id])
        self._reach.forget(node_id)
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
            self._reach.check(node_id, address)
        held = beat.pieces_address
        pieces_at = check_address(held, self.loopback_ok) if held and not beat.paused else ""
        self.pieces.beat(node_id, pieces_at, (beat.pieces_layers[0], beat.pieces_layers[1]))
        now = utcnow()
        self._memory.heard(node_id, beat.available_until, self.settings.dead_after_s)
        if beat.paused:
            self._paused_beat(node_id, beat, now)
            return None  # out of the plan: no stage
        self._memory.resume(node_id)
        heard = self.store.record_beat(node_id, beat, address, now)
        steps = tuple((int(r), float(ms)) for r, ms in beat.step_ms)
        self._memory.report(node_id, StageReport(steps, beat.row_budget, beat.compute_ms))
        self._plans.heard_from(node_id)
        self._note_served(node_id, beat.n_layers)
        self._prune(time.monotonic())
        self.replan()
        self._tell_beat(node_id, beat, heard, now)
        self.spot.beat(node_id, beat, self._plans.hosted)
        return self.assignment(node_id)

    def _paused_beat(self, node_id: str, beat: Heartbeat, now: dt.datetime) -> None:
        """A paused node says only that it is there and why it serves nothing: what it
        reported while serving stays on the operator page; placement leaves it out."""
        heard = self.store.mark_seen(node_id, now)
        self._memory.pause(node_id, beat.paused[:100])
        self._tell_beat(node_id, beat, heard, now)  # the pause, then the plan it changes
        self.replan()

    def paused_reason(self, node_id: str) -> str:
        """Why the node said it is paused; "" when it offers to serve."""
        return self._memory.paused_reason(node_id)

    def piece_sources(self, asker: str, file: str, model: str = "default") -> list[PieceSource]:
        """Where `asker` gets piece `file` of `model`, best first (piece_peers.rank_sources):
        peers whose heartbeat serves it for their own stage or standby stage, the mirror,
        us. The first peer listed counts as pointed at."""
        hosted = self.hosted(model)
        stages = self._plans.stages_of(hosted)
        if hosted is self._main:  # warm spares stand by for the default model
            for spare, layers in self.standby().by_spare.items():
                stages.setdefault(spare, []).append(layers)
        paused = self._memory.paused()
        healthy = {
            n.node_id
            for n in self.nodes()
            if n.node_id not in paused and self.health(n) == "healthy"
        }
        manifest = hosted.model.manifest
        return self.pieces.sources(asker, file, manifest, stages, healthy, self.store.rtt_map())

    def _note_served(self, node_id: str, n_layers: int) -> None:
        """A node that reports serving its whole stage has shown it holds that much."""
        stage = self._plans.stage_of(node_id)
        if stage is None or n_layers <= 0 or n_layers != stage.layers.stop - stage.layers.start:
            return
        self._memory.prove(node_id, stage.bytes_needed)

    def _prune(self, now: float) -> None:
        """Now and then: old throughput samples, probe records of the past, and
        forgotten nodes whose certificates all expired."""
        with self._lock:
            if now - self._pruned_at < PRUNE_EVERY_S:
                return
            self._pruned_at = now
        self._reach.prune(now)
        self.store.prune(samples_before=utcnow() - SAMPLES_KEPT)

    def standby(self) -> Standby:
        """Which spare keeps which stage ready, and the stages none does (standby.py)."""
        capacities = {n.node_id: placement_capacity(n) for n in self.nodes()}
        up_since, until = self._memory.uptimes()
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

    def health(self, node: Node, now: dt.datetime | None = None) -> str:
        silent = None if node.last_seen is None else self._silent_s(node.last_seen, now)
        s = self.settings
        return health_of(node.revoked, silent, s.stale_after_s, s.dead_after_s)

    def _silent_s(self, heard: dt.datetime, now: dt.datetime | None = None) -> float:
        """Seconds since a node was heard. Silence counts from when this process could
        hear it: after a restart every node gets a full timeout to heartbeat again,
        instead of all looking gone and the plan being torn down (a re-plan storm)."""
        return ((now or utcnow()) - max(as_utc(heard), self.started_at)).total_seconds()

    def nodes(self) -> list[Node]:
        with self.store.session() as s:
            return self.store.nodes(s)

    def _addresses(self) -> dict[str, str]:
        return {n.node_id: n.address for n in self.nodes()}

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
        old = self.store.rename_node(node_id, kept)
        if old is None:
            raise NotFound(f"no node {node_id}")
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
            self.store.revoke_certificates(s, node_id)
        with self._lock:
            self._signals.forget([node_id])
        self._reach.forget(node_id)
        self._memory.forget(node_id)
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
            silent = self._silent_s(n.last_seen, now) if n.last_seen else 0.0
            states[n.node_id] = (self.node_state(n, now), silent)
        self.timeline.sweep(states)

    def _tell_beat(
        self, node_id: str, beat: Heartbeat, heard: dt.datetime | None, now: dt.datetime
    ) -> None:
        """The timeline hears what a heartbeat said (after the node was silent since
        `heard`), then looks at every node's silence."""
        silent = 0.0 if heard is None else self._silent_s(heard, now)
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
        stage = self._plans.stage_of(node_id)
        return None if stage is None else (stage.layers.start, stage.layers.stop)

    def _names(self) -> dict[str, str]:
        return {n.node_id: n.name for n in self.nodes() if n.name}

    # ------------------------------------------------------------ placement

    def replan(self, force: bool = False) -> Plan | None:
        """Place the healthy, reachable, unpaused workers (when what placement sees
        changed, or `force`); the timeline hears of a plan that changed."""
        before = self._main.plan
        plan = self._replan(force)
        if plan is not before:  # a node gone silent is told before the plan without it
            self.sweep(due=True)
        for model_name, view, error in self._plans.views():
            self.timeline.plan_now(view, error, self._names, model=model_name)
        return plan

    def _replan(self, force: bool) -> Plan | None:
        now = utcnow()
        facts = self._memory.for_placement()
        verified = self._reach.verified()
        faulty = self.spot.faulty()  # caught by a spot check: out until the operator clears it
        workers = placeable(self.nodes(), lambda n: self.health(n, now), facts, verified, faulty)
        infos, claims = node_infos(workers, facts.proven)
        trusted = self.trusted_nodes()
        inputs = (infos, claims, self.settings, trusted)
        # Computed from the last plan, before this one: the spare warm for a stage that
        # just died is the one its repair should take (it serves without loading).
        warm = warm_layers(self.standby()) if self.settings.warm_spares else {}
        rules = rules_of(self.settings)
        return self._plans.place(infos, claims, inputs, rules, warm, trusted, force)

    def trusted_nodes(self) -> frozenset[str]:
        """The nodes the operator marked trusted (for the first and last stage)."""
        return trusted_from(self.store.get_setting(TRUSTED_NODES))

    def set_trusted(self, node_id: str, trusted: bool) -> None:
        """Mark a joined node trusted (or not); NotFound for an unknown node."""
        if self.store.node(node_id) is None:
            raise NotFound(f"no node {node_id}")
        ids = set(self.trusted_nodes())
        ids = ids | {node_id} if trusted else ids - {node_id}
        self.store.set_setting(TRUSTED_NODES, trusted_text(ids))
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

    # ------------------------------------------------------------ assignments and routes

    def answer_chain(self) -> tuple[Chain, str]:
        """The main chain as the answer probe dials it ((node id, address) per stage), or
        none and why there is none."""
        plan = self._main.plan
        addresses = {} if plan is None else self._addresses()
        return probe_chain(plan, self._main.error or "", addresses)

    def assignment(self, node_id: str) -> Assignment | None:
        # While no plan can be made (too few healthy workers for a moment: late heartbeats
        # on a loaded machine, a dead stage not yet replaced), the others keep the last
        # good plan's stages: answering "nothing" would make every worker drop and reload
        # its stage, a re-plan storm that outlasts the gap itself.
        if node_id in self._memory.paused():
            return None
        serving = self._plans.serving(node_id)
        if serving is None:
            return None
        s = self.settings
        return assignment_for(
            node_id, serving, self._addresses(), s.sessions_per_stage, s.context_tokens
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
            self._dead_stages.hear(hosted, avoid, asker, self._addresses, self.liveness_probe)
        self.replan()
        current = hosted.plan
        if current is None:
            raise NotFound(f"no route yet: {hosted.error or 'no plan'}")
        nodes = {n.node_id: n for n in self.nodes()}
        chain = self._plans.hand_out(hosted, current, avoid, lambda n: stage_load(nodes.get(n)))
        addresses = {k: n.address for k, n in nodes.items()}
        return route_answer(hosted.name, chain, addresses, self.spot.faulty())

    def fleet_forecast(self) -> FleetForecast:
        """The main chain's predicted tokens/s, alone and at 1..N requests at once, from
        the stages' reported step times and the links' measured round trips."""
        plan = self._main.plan
        nodes = self.nodes()
        loads = {n.node_id: StageCapacity(n.max_sessions, n.kv_budget_bytes) for n in nodes}
        reports = self._memory.reports()
        return forecast(
            plan,
            self.model.spec,
            reports,
            loads,
            self.store.rtt_map(),
            self.settings.context_tokens,
        )

    # ------------------------------------------------------------ relay and signalling

    def turn_credentials(self, node_id: str) -> TurnAnswer | None:
        """coturn REST credentials for a joined node, or None where there is no relay."""
        s = self.settings
        return relay_credentials(s.turn_server, s.turn_secret, s.turn_ttl_s, node_id, time.time())

    def post_signal(self, src: str, dst: str, message: SignalPost) -> None:
        """Carry an ICE offer/answer from one joined node to another (WebRTC-style),
        only along a link the plan has (signalling.py); SignalRefused otherwise."""
        peer, sender = self.store.node(dst), self.store.node(src)
        if peer is None or peer.revoked or sender is None:
            raise NotFound(f"no node {dst!r} to signal")
        allowed = planned_peers(self._plans.placed(), src, sender.role)
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
        return self.store.throughput(since=utcnow() - dt.timedelta(minutes=minutes))
