"""The first-run walk-through's decisions, without Qt: which page comes next, what stops
the volunteer from going on (and why, in words), what gets saved, how the download's
speed and time left read, what the notification says when serving starts, and when Quit
should ask first. The wizard (app.ui.first_run) only draws these and gathers the facts.

Pages: what Sangama does with this PC -> the memory cap (with what the GPU has) -> the
invite (joining happens on Next) -> the download of this PC's pieces -> serving.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field, replace

from app.node_status import NodeStatus, ServeState
from app.ui.settings import Settings, default_cap_bytes

__all__ = [
    "CapRange",
    "DownloadMeter",
    "DownloadView",
    "FlowFacts",
    "Page",
    "blocker",
    "cap_range",
    "download_line",
    "download_text",
    "finished_settings",
    "needs_first_run",
    "next_page",
    "quit_question",
    "serving_notice",
]

GIB = 1024**3
MIB = 1024**2
MIN_CAP_BYTES = GIB // 10
"""The smallest offer the cap accepts (0.1 GiB): below it no stage of any model fits."""

WHAT_SANGAMA_DOES = (
    "Sangama runs one large language model across many volunteers' PCs. While the app "
    "runs, this PC serves a few consecutive layers of the swarm's model: it downloads "
    "only those layers once, keeps them in memory (on the GPU when there is one), and "
    "passes numbers on to the next PC for each word someone's chat produces.",
    "What passes through depends on the layers it gets. A stage in the middle sees only "
    "the hidden numbers between layers (which can still be decoded back to much of the "
    "text); the first stage reads each prompt's words and the last stage chooses every "
    "word of the answers, so a PC there sees the conversations that run through it. "
    "It uses at most the memory you allow on the next page, and you "
    "can pause it from the tray icon at any time.",
    "Closing a window never stops serving; Quit in the tray menu does.",
)


class Page(enum.IntEnum):
    WELCOME = 0
    MEMORY = 1
    INVITE = 2
    DOWNLOAD = 3
    SERVING = 4


@dataclass(frozen=True)
class CapRange:
    low: int
    high: int
    default: int


def cap_range(usable_bytes: int) -> CapRange:
    """What the cap may be: from 0.1 GiB to all this PC can offer; by default, that
    less headroom for the volunteer's own programs (the join dialog's default)."""
    high = max(MIN_CAP_BYTES, usable_bytes)
    default = min(high, max(MIN_CAP_BYTES, default_cap_bytes(usable_bytes)))
    return CapRange(MIN_CAP_BYTES, high, default)


@dataclass(frozen=True)
class FlowFacts:
    """What the pages know now: gathered by the wizard from its widgets and the node."""

    usable_bytes: int
    cap_bytes: int
    code_problem: str | None
    """app.ui.controllers.validate_code of what is pasted (None: the form is right)."""
    joined: bool = False
    """The coordinator accepted the code (this run of the wizard)."""
    joining: bool = False
    status: NodeStatus = field(default_factory=NodeStatus)


def blocker(page: Page, facts: FlowFacts) -> str | None:
    """Why the volunteer cannot go on from `page` yet, or None when Next may be pressed."""
    if page is Page.MEMORY:
        r = cap_range(facts.usable_bytes)
        if not r.low <= facts.cap_bytes <= r.high:
            return (
                f"Choose between {r.low / GIB:.1f} and {r.high / GIB:.1f} GiB: "
                "that is what this PC can offer."
            )
    if page is Page.INVITE:
        if facts.joining:
            return "Joining… asking the coordinator."
        if facts.code_problem is not None:
            return facts.code_problem
    if page is Page.DOWNLOAD:
        state = facts.status.state
        if state is ServeState.ERROR:
            return f"Serving stopped: {facts.status.error}"
        if state is not ServeState.SERVING:
            return "Waiting until this PC serves its layers…"
    return None


def next_page(page: Page, facts: FlowFacts) -> Page:
    """Where Next leads. The invite page leads on only once joined (Next asks the
    coordinator first); the download page once serving; the last page is the last."""
    if blocker(page, facts) is not None:
        return page
    if page is Page.INVITE and not facts.joined:
        return page
    return Page(min(page + 1, Page.SERVING))


def needs_first_run(settings: Settings, joined: bool) -> bool:
    """Show the walk-through on the first start: never finished, and not joined some
    other way (the join dialog, `sangama worker --join` with the same identity)."""
    return not settings.first_run_done and not joined


def finished_settings(settings: Settings, cap_bytes: int | None) -> Settings:
    """What the wizard saves when Finish is pressed: done (it does not come back), and
    the cap chosen. Cancelled before joining, nothing is saved and it comes back on the
    next start; joined, `needs_first_run` is False anyway."""
    out = replace(settings, first_run_done=True)
    if cap_bytes is not None and cap_bytes > 0:
        out = replace(out, vram_cap_bytes=cap_bytes)
    return out


# --- the download page --------------------------------------------------------------


@dataclass(frozen=True)
class DownloadView:
    fraction: float
    speed_bps: float | None
    """None until two samples far enough apart were seen."""
    eta_s: float | None


class DownloadMeter:
    """Speed over the last few seconds of samples (not since the start, so a stall or a
    resumed .part reads right), and the time left at that speed. The clock is passed in."""

    def __init__(self, window_s: float = 5.0, min_span_s: float = 0.5) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._samples: deque[tuple[float, int]] = deque()
        self.done_bytes = 0
        self.total_bytes = 0

    def observe(self, now: float, done_bytes: int, total_bytes: int) -> DownloadView:
        if self._samples and done_bytes < self._samples[-1][1]:
            self._samples.clear()  # a piece restarted from zero: old samples mislead
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        self.done_bytes, self.total_bytes = done_bytes, total_bytes
        return self.view()

    def view(self) -> DownloadView:
        total, done = self.total_bytes, self.done_bytes
        fraction = 1.0 if total <= 0 else min(max(done / total, 0.0), 1.0)
        speed = eta = None
        if len(self._samples) >= 2:
            (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
            if t1 - t0 >= self.min_span_s:
                speed = max(0.0, (b1 - b0) / (t1 - t0))
                if speed > 0:
                    eta = max(0.0, (total - done) / speed)
        return DownloadView(fraction, speed, eta)


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def _duration(s: float) -> str:
    if s < 1.5:
        return "a moment"
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def download_text(v: DownloadView) -> str:
    """e.g. '42% · 12.5 MiB/s · about 6 s left'."""
    parts = [f"{v.fraction * 100:.0f}%"]
    if v.speed_bps is None:
        parts.append("measuring speed…")
    else:
        parts.append(f"{_size(v.speed_bps)}/s")
        if v.eta_s is not None and v.fraction < 1.0:
            parts.append(f"about {_duration(v.eta_s)} left")
    return " · ".join(parts)


def download_line(meter: DownloadMeter) -> str:
    """'31.0 of 98.0 MiB · 32% · 12.5 MiB/s · about 5 s left'."""
    v = meter.view()
    return f"{_size(meter.done_bytes)} of {_size(meter.total_bytes)} · {download_text(v)}"


# --- serving, and quitting -----------------------------------------------------------


def serving_notice(status: NodeStatus) -> tuple[str, str]:
    """The notification's title and text when this PC starts serving."""
    where = ""
    if status.layers is not None:
        a, b = status.layers
        where = f" layers {a}-{b - 1}"
    model = f" of {status.model}" if status.model else ""
    return (
        "Sangama is serving",
        f"This PC now serves{where}{model} for the swarm. It keeps serving while the app "
        "runs, also with every window closed; pause or quit from the tray icon.",
    )


def quit_question(status: NodeStatus) -> str | None:
    """What Quit should ask first, or None to quit at once: quitting ends the stage, so
    people's conversations running through it would break off."""
    n = status.running if status.state is ServeState.SERVING else status.finishing
    if n <= 0:
        return None
    who = "1 conversation runs" if n == 1 else f"{n} conversations run"
    return (
        f"{who} through this PC right now. Quitting stops serving at once and breaks "
        f"{'it' if n == 1 else 'them'} off. Pausing instead lets "
        f"{'it' if n == 1 else 'them'} finish first. Quit anyway?"
    )
