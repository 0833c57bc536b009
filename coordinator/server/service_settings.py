"""What the operator sets for a coordinator: timeouts, placement rules, the relay,
who may read metrics, releases admitted, spot checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.releases import DEFAULT_MIN_RELEASE
from coordinator.server.spot_policy import SpotSettings
from net.ice.turn import DEFAULT_NODE_TTL_S


@dataclass(frozen=True)
class CoordinatorSettings:
    """The coordinator's settings (`sangama coordinator` options)."""

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
    caller (api_callers.py); by default no header is believed."""
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
