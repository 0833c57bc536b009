"""What a serving node is doing, as plain data: reported by the coordinated serve loop
(`app.serving.coordinated`), shown by the tray and its status window. No Qt here, so the headless
worker reports through the same type."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.compute import StageCompute
from core.types import format_layers


class ServeState(enum.Enum):
    NOT_JOINED = "not joined"
    JOINING = "joining"
    WAITING = "waiting for a stage"
    DOWNLOADING = "downloading"
    LOADING = "loading"
    SERVING = "serving"
    PAUSING = "pausing"
    """No new sessions; the running ones finish before the stage is freed."""
    MOVING = "changing stage"
    """The coordinator assigned another stage; running sessions finish on the old one."""
    PAUSED = "paused"
    ERROR = "error"


@dataclass(frozen=True)
class NodeStatus:
    state: ServeState = ServeState.NOT_JOINED
    node_id: str = ""
    coordinator: str = ""
    progress: float = 0.0
    """0..1 while downloading."""
    downloaded_bytes: int = 0
    download_bytes: int = 0
    """Bytes of the stage's pieces on disk, and in all, while downloading (speed and
    time left are the viewer's to work out: app.ui.first_run_flow.DownloadMeter)."""
    layers: tuple[int, int] | None = None
    model: str = ""
    address: str = ""
    next_hop: str = ""
    """'node at address (path)', or '' on the last stage."""
    sessions: int = 0
    """Sessions opened since this stage started serving (a running total)."""
    running: int = 0
    """Sessions open on this stage right now (conversations going through this PC)."""
    steps: int = 0
    errors: int = 0
    throughput: float = 0.0
    """Tokens (rows) per second through this stage over the last heartbeat."""
    compute_ms: float = 0.0
    queue_ms: float = 0.0
    """How long the last batch's rows waited for the engine."""
    memory: str = ""
    """What this process holds, e.g. "3.1 GiB of VRAM" (core.hardware.memory_in_use)."""
    compute: StageCompute | None = None
    """What runs the stage (backend, device memory, layers on the GPU), once it loaded."""
    rtt_ms: float | None = None
    finishing: int = 0
    """Sessions still running while PAUSING or MOVING."""
    error: str = ""
    """Plain-words reason, in state ERROR (or WAITING when the coordinator is unreachable)."""
    paused_reason: str = ""
    """Why the node pauses by itself ("on battery", "quiet hours", ...), in PAUSED or
    PAUSING; "" when the volunteer paused it or it serves."""
    preloaded: bool = False
    """In LOADING: the stage was built ahead, as this spare's standby stage, so it starts
    without a load."""
    standby: tuple[int, int] | None = None
    """While WAITING as a spare: the layers of the standby stage it got ready (pieces
    downloaded), which it takes over without a download."""
    swarm: str = ""
    """Whether the swarm can answer, in words, as the coordinator's end-to-end probe
    found (`swarm_answer`); "" until the coordinator said."""
    update: str = ""
    """What the coordinator says of this release: a newer one exists, or this one is too
    old for the swarm (coordinator.releases.update_notice); "" when current."""
    started_at: float = field(default_factory=time.time)

    @property
    def summary(self) -> str:
        """One line: the tray tooltip."""
        s = self.state
        if s is ServeState.DOWNLOADING:
            return f"Sangama: downloading ({self.progress * 100:.0f}%)"
        if s is ServeState.SERVING and self.layers is not None:
            counts = f"{self.running} running now, {self.sessions} since start"
            return f"Sangama: serving {format_layers(*self.layers)} ({counts})"
        if s in (ServeState.PAUSING, ServeState.MOVING) and self.finishing:
            return f"Sangama: {s.value}, finishing {_sessions(self.finishing)}"
        if s is ServeState.ERROR:
            return f"Sangama: error: {self.error}"
        if s in (ServeState.PAUSED, ServeState.PAUSING) and self.paused_reason:
            return f"Sangama: {s.value} ({self.paused_reason})"
        return f"Sangama: {s.value}"


_STILL_RUNNING = (
    ServeState.WAITING,
    ServeState.DOWNLOADING,
    ServeState.LOADING,
    ServeState.SERVING,
)


def swarm_answer(can_answer: bool | None, since: float, reason: str) -> str:
    """The coordinator's last probe of the chain in words, with the time in this PC's
    clock ("" before the first probe)."""
    if can_answer is None:
        return ""
    if can_answer:
        return "can answer"
    at = time.strftime("%H:%M:%S", time.localtime(since)) if since > 0 else "?"
    return f"cannot answer since {at}, because {reason}"


def shown_while_pausing(reported: NodeStatus, shown: NodeStatus) -> NodeStatus:
    """What the UI shows of a report from the serve loop after the volunteer asked to
    pause, `shown` being what it shows now. The loop sees the stop only at its next turn,
    and a heartbeat report made before then still says SERVING; shown as it is, it would
    overwrite the UI's own PAUSING for a moment. Such a report is shown as PAUSING with
    the sessions `shown` said were finishing (the report's own count also holds sessions
    kept only for a resume, which the pause does not wait for); PAUSING, PAUSED, ERROR
    and the rest pass unchanged."""
    if reported.state not in _STILL_RUNNING:
        return reported
    return replace(reported, state=ServeState.PAUSING, finishing=shown.finishing)


def ready_line(node_id: str, address: str, layers: tuple[int, int]) -> str:
    """The line a worker prints once it serves: the demo, the lab, tests and benches wait
    for it before routing traffic there and read the node and address from it."""
    return f"READY {node_id} {address} {format_layers(*layers)}"


def announced_lines(before: NodeStatus | None, now: NodeStatus) -> tuple[str, ...]:
    """The lines a headless worker prints on stdout for a change of status (`before` the
    last status shown): READY when its stage starts serving, STANDBY when a spare's
    standby stage has its pieces, LOADING when a stage loads that was not built ahead.
    The demo, the lab, tests and benches parse them; they are only a view of the status,
    which the tray and `sangama status` show in full."""
    lines: list[str] = []
    changed = before is None or before.state is not now.state
    if changed and now.state is ServeState.LOADING and not now.preloaded and now.layers:
        lines.append(f"LOADING {format_layers(*now.layers)}")
    if changed and now.state is ServeState.SERVING and now.layers is not None:
        lines.append(ready_line(now.node_id, now.address, now.layers))
    was_standby = None if before is None else before.standby
    if now.standby is not None and now.standby != was_standby:
        lines.append(f"STANDBY {format_layers(*now.standby)}")
    return tuple(lines)


StatusReport = Callable[[NodeStatus], None]
"""Where the serve loop reports each state; may be called from any thread."""


def _sessions(n: int) -> str:
    return f"{n} session{'' if n == 1 else 's'}"


def plain_reason(exc: BaseException) -> str:
    """An exception as words for a person: the coordinator's reason, not a traceback."""
    text = str(exc).strip()
    if isinstance(exc, OSError):
        return f"System error: {text or type(exc).__name__}"
    return text[0].upper() + text[1:] if text else type(exc).__name__
