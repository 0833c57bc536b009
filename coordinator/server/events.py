"""The swarm's story for the operator: which change makes which event, and what state a
node is in. Pure rules: no clock, database or network. They compare what the coordinator
knew before (a node's last report, its liveness, the last plan) with what it knows now
and return the events to record; coordinator/server/timeline.py keeps them.

Every event kind is in `KINDS`, with the words the operator page shows and its tone;
whoever records an event (`Coordinator.record_event`) names one of these.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Mapping
from dataclasses import dataclass

MAX_DETAIL = 300
"""Characters of an event's detail (the events table's column)."""
MAX_NAME = 64
"""Characters of a node's name (the nodes table's column)."""

LIVE, STALE, GONE = "live", "stale", "gone"
"""What the timeline last said about a node's liveness ("" before anything)."""

ACTIVITIES = ("", "waiting", "standby", "downloading", "loading", "serving")
"""What a heartbeat may say the node is doing ("": a node that does not say)."""


@dataclass(frozen=True)
class Kind:
    label: str
    """What the page shows for the event."""
    tone: str
    """ok, info, warn or bad: the page's colour."""
    liveness: str = ""
    """What the event says about the node's liveness (LIVE, STALE, GONE), if anything:
    a restarted coordinator reads it back, so a node already told gone is not told
    gone again."""


KINDS: Mapping[str, Kind] = {
    "started": Kind("coordinator started", "info"),
    "joined": Kind("joined", "info"),
    "standby": Kind("standing by", "info"),
    "downloading": Kind("downloading", "info"),
    "loading": Kind("loading", "info"),
    "serving": Kind("serving", "ok"),
    "paused": Kind("paused", "warn"),
    "resumed": Kind("resumed", "ok"),
    "stale": Kind("silent", "warn", STALE),
    "gone": Kind("gone", "bad", GONE),
    "back": Kind("back", "ok", LIVE),
    "reported_dead": Kind("reported dead", "bad", GONE),
    "promoted": Kind("spare promoted", "ok"),
    "replanned": Kind("re-planned", "info"),
    "no_plan": Kind("no plan", "bad"),
    "probe_failed": Kind("end-to-end probe failed", "bad"),
    "bad_source": Kind("bad source of pieces", "warn"),
    "renamed": Kind("renamed", "info"),
    "revoked": Kind("revoked", "bad"),
    "forgotten": Kind("forgotten", "info"),
    "faulty": Kind("faulty: a spot check caught it", "bad"),
    "fault_cleared": Kind("fault cleared", "ok"),
    "check_undecided": Kind("spot check undecided", "warn"),
    "check_disputed": Kind("spot check: a stage's input disputed", "warn"),
}


@dataclass(frozen=True)
class PendingEvent:
    """An event to record: its kind (a key of KINDS), the node it is about ("" for the
    swarm as a whole) and a line for the operator."""

    kind: str
    node_id: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Report:
    """What one heartbeat said the node is doing: the parts events are made of."""

    activity: str = ""
    paused: str = ""
    layers: tuple[int, int] | None = None
    """The stage it works on (from the plan, or the standby it gets ready)."""
    done_bytes: int = 0
    total_bytes: int = 0
    """Its stage's pieces downloaded, of all, while downloading."""


@dataclass(frozen=True)
class PlanView:
    """A plan as the timeline compares it: stages in order, and spares."""

    stages: tuple[tuple[str, tuple[int, int]], ...]
    spares: tuple[str, ...] = ()


# ---------------------------------------------------------------- words


def layer_text(layers: tuple[int, int]) -> str:
    """Half-open [start, stop) as the inclusive range a person reads: "20-29", "20"
    (the notation of the CLI and the page)."""
    start, stop = layers
    return f"{start}" if stop - start == 1 else f"{start}-{stop - 1}"


def layers_text(layers: tuple[int, int]) -> str:
    """ "layers 20-29", or "layer 20" alone."""
    return f"layer{'' if layers[1] - layers[0] == 1 else 's'} {layer_text(layers)}"


def size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def who(node_id: str, names: Mapping[str, str]) -> str:
    """A node as a person reads it: its name and id, or the id alone."""
    name = names.get(node_id, "")
    return f"{name} ({node_id})" if name else node_id


def bounded(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 1] + "…"


# ---------------------------------------------------------------- node names


def clean_name(text: str) -> str:
    """A name as it is kept: control characters dropped, runs of white space made one
    space, at most MAX_NAME characters."""
    kept = "".join(" " if ch.isspace() else ch for ch in text)
    kept = "".join(ch for ch in kept if not unicodedata.category(ch).startswith("C"))
    return " ".join(kept.split())[:MAX_NAME].strip()


def name_from_note(note: str, taken: Collection[str]) -> str:
    """A joining node's name: its invite's note ("" for none); a second node joining
    with the same note is "NOTE #2", and so on, so the page can tell them apart."""
    base = clean_name(note)
    if not base or base not in taken:
        return base
    n = 2
    while True:
        suffix = f" #{n}"
        name = base[: MAX_NAME - len(suffix)].rstrip() + suffix
        if name not in taken:
            return name
        n += 1


# ---------------------------------------------------------------- node state


def health_of(
    revoked: bool, silent_s: float | None, stale_after_s: float, dead_after_s: float
) -> str:
    """A node's health: revoked, joined (never heard from; `silent_s` None), then by how
    long it has been silent: healthy, stale past `stale_after_s`, gone past
    `dead_after_s`."""
    if revoked:
        return "revoked"
    if silent_s is None:
        return "joined"
    if silent_s > dead_after_s:
        return "gone"
    if silent_s > stale_after_s:
        return "stale"
    return "healthy"


def node_state(health: str, paused: str) -> str:
    """What the page shows for a node: its health (healthy, stale, gone, revoked,
    joined), but "paused" for a node that said it pauses and is not yet gone: a paused
    node heartbeats slowly, and silence under `dead_after_s` is its pause, not death."""
    if health in ("revoked", "gone", "joined") or not paused:
        return health
    return "paused"


def forgettable(state: str, role: str, joined_s_ago: float, dead_after_s: float) -> bool:
    """Whether the operator may forget a node: gone or revoked ones, and workers that
    joined long ago and never heartbeat; never a node that is alive, stale or paused,
    nor a client that never revoked (clients never heartbeat: one may be chatting now)."""
    if state in ("gone", "revoked"):
        return True
    return state == "joined" and role == "worker" and joined_s_ago > dead_after_s


# ---------------------------------------------------------------- rules


def download_quarter(done: int, total: int) -> int:
    """0 to 4: which quarter of its download a node has reached (events at each)."""
    if total <= 0:
        return 0
    return min(4, max(0, done) * 4 // total)


def _stage(report: Report) -> str:
    return "" if report.layers is None else layers_text(report.layers)


def beat_events(
    node_id: str, before: Report | None, now: Report, liveness: str, silent_s: float
) -> tuple[PendingEvent, ...]:
    """The events one heartbeat makes, from the node's last report (`before`; None when
    this coordinator has heard none since it started) and what the timeline last said
    about its liveness; `silent_s`: how long it was silent before this beat.

    Beyond coming back, pausing and resuming, the activities make events when they
    change (a spare standing by for other layers, a new stage), and a download at
    its start and at each quarter. A first report after a restart makes events only
    for a pause, a download or a load: the rest was told before the restart."""
    out: list[PendingEvent] = []
    if liveness in (STALE, GONE):
        out.append(
            PendingEvent("back", node_id, f"heartbeats again after {silent_s:.0f} s of silence")
        )
    if now.paused:
        if before is None or before.paused != now.paused:
            out.append(PendingEvent("paused", node_id, bounded(now.paused)))
        return tuple(out)
    if before is not None and before.paused:
        out.append(PendingEvent("resumed", node_id, "offers to serve again"))
    stage = _stage(now)
    if now.activity == "downloading":
        quarter = download_quarter(now.done_bytes, now.total_bytes)
        same = before is not None and before.activity == "downloading"
        same = same and before is not None and before.layers == now.layers
        last = download_quarter(before.done_bytes, before.total_bytes) if same and before else -1
        if quarter > last:
            pct = 100 * max(0, now.done_bytes) // max(1, now.total_bytes)
            sizes = f"{pct}% of {size_text(now.total_bytes)}" if now.total_bytes else "starting"
            out.append(
                PendingEvent("downloading", node_id, f"{stage}: {sizes}" if stage else sizes)
            )
        return tuple(out)
    changed = before is None or (before.activity, before.layers) != (now.activity, now.layers)
    if not changed:
        return tuple(out)
    if now.activity == "loading":
        out.append(PendingEvent("loading", node_id, stage))
    elif before is None:
        pass  # told before this coordinator restarted
    elif now.activity == "serving":
        out.append(PendingEvent("serving", node_id, stage))
    elif now.activity == "standby" and now.layers is not None:
        out.append(PendingEvent("standby", node_id, f"a spare getting {stage} ready"))
    return tuple(out)


def silence_events(
    node_id: str, liveness: str, state: str, silent_s: float
) -> tuple[PendingEvent, ...]:
    """A node's silence as events: stale once, gone once (until it heartbeats again).
    `state` is node_state's; a paused node's slow heartbeats are no silence."""
    if state == "gone" and liveness != GONE:
        return (PendingEvent("gone", node_id, f"silent for {silent_s:.0f} s: out of the plan"),)
    if state == "stale" and liveness not in (STALE, GONE):
        return (PendingEvent("stale", node_id, f"silent for {silent_s:.0f} s"),)
    return ()


def liveness_after(liveness: str, pending: tuple[PendingEvent, ...]) -> str:
    """What the timeline says about a node's liveness once `pending` are recorded."""
    for d in pending:
        liveness = KINDS[d.kind].liveness or liveness
    return liveness


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def plan_events(
    before: PlanView | None, after: PlanView | None, error: str, names: Mapping[str, str]
) -> tuple[PendingEvent, ...]:
    """The events of a new plan: the plan lost (and why), or re-planned (its stages, and
    the nodes that left it), and each spare promoted to a stage (whose layers it took).
    Nothing when the stages stay as they were (spares coming and going are no re-plan)."""
    if after is None:
        if before is None:
            return ()
        return (PendingEvent("no_plan", "", bounded(error or "no chain can be formed")),)
    if before is not None and before.stages == after.stages:
        return ()
    stages = ", ".join(f"{who(n, names)} {layer_text(lay)}" for n, lay in after.stages)
    count = len(after.stages)
    detail = f"{count} stage{'' if count == 1 else 's'}: {stages}"
    kept = {n for n, _ in after.stages}
    left = [n for n, _ in (before.stages if before else ()) if n not in kept]
    if left:
        detail += "; left the plan: " + ", ".join(who(n, names) for n in left)
    out = [PendingEvent("replanned", "", bounded(detail))]
    spares = set(before.spares) if before is not None else set()
    for node, layers in after.stages:
        if node not in spares or before is None:
            continue
        replaced = [
            who(n, names) for n, old in before.stages if n != node and _overlaps(old, layers)
        ]
        whom = f" from {', '.join(replaced)}" if replaced else ""
        out.append(PendingEvent("promoted", node, bounded(f"takes {layers_text(layers)}{whom}")))
    return tuple(out)
