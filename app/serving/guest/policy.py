"""When a volunteer's PC should serve and when it should step aside: pure functions.

A good guest on a home PC pauses by itself while its owner needs the machine (another
program keeps the GPU busy: a game, a render), while it runs on battery, and during the
owner's quiet hours, and resumes by itself afterwards. `next_state` is the one place
these rules live: it takes what the probes saw, the settings and the time, and returns
whether to serve or why not. It reads no clock and touches no device, so every rule is
tested with plain values; `app.serving.guest.loop` samples the probes and carries it out.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

__all__ = [
    "GuestSettings",
    "GuestState",
    "Observation",
    "QuietHours",
    "SettingsError",
    "in_quiet_hours",
    "next_state",
    "parse_quiet_hours",
]

GPU_BUSY = "another program is using the GPU"
ON_BATTERY = "on battery"
QUIET_HOURS = "quiet hours"
BY_REQUEST = "paused by you"
"""What the coordinator is told when the volunteer paused (or quit), not the policy."""


class SettingsError(ValueError):
    """A good-guest setting that cannot be used (a clear reason, nothing changed)."""


@dataclass(frozen=True)
class QuietHours:
    """Minutes after midnight, local time; start > end runs over midnight (22:00-07:00).
    start == end is an empty range (use 00:00-24:00 for the whole day)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.start <= 1440 and 0 <= self.end <= 1440):
            raise SettingsError("quiet hours run between 00:00 and 24:00")

    def __str__(self) -> str:
        return f"{_hhmm(self.start)}-{_hhmm(self.end)}"


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


_RANGE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def parse_quiet_hours(text: str) -> tuple[QuietHours, ...]:
    """'22:00-07:00, 12:30-13:30' -> ranges; '' -> none. SettingsError on anything else."""
    ranges = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _RANGE.match(part)
        if m is None:
            raise SettingsError(f"quiet hours look like 22:00-07:00, not {part.strip()!r}")
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        if m1 > 59 or m2 > 59 or h1 > 24 or h2 > 24:
            raise SettingsError(f"{part.strip()!r} is not a time of day")
        ranges.append(QuietHours(h1 * 60 + m1, h2 * 60 + m2))
    return tuple(ranges)


def in_quiet_hours(now: dt.time, ranges: tuple[QuietHours, ...]) -> bool:
    """Whether the local time `now` falls in any range (start included, end excluded)."""
    minute = now.hour * 60 + now.minute
    for r in ranges:
        if r.start <= r.end:
            if r.start <= minute < r.end:
                return True
        elif minute >= r.start or minute < r.end:  # over midnight
            return True
    return False


@dataclass(frozen=True)
class GuestSettings:
    """The volunteer's good-guest settings (tray Settings, `sangama worker` flags)."""

    pause_when_gpu_busy: bool = True
    gpu_busy_percent: int = 50
    """GPU utilisation at or above which another program's use counts as heavy."""
    pause_on_battery: bool = True
    quiet_hours: tuple[QuietHours, ...] = ()
    resume_after_s: float = 60.0
    """The GPU must stay calm this long before serving resumes: a game's loading screen
    or a menu must not bring the stage back for a minute and pause it again."""
    sample_every_s: float = 5.0
    download_bytes_per_s: int = 0
    """Piece downloads cap; 0: no cap."""
    upload_bytes_per_s: int = 0
    """Everything this node's links send (hidden states, tokens, relayed or not); 0: no cap."""

    def __post_init__(self) -> None:
        if not 1 <= self.gpu_busy_percent <= 100:
            raise SettingsError("the GPU busy threshold is a percentage from 1 to 100")
        if self.resume_after_s < 0 or self.sample_every_s <= 0:
            raise SettingsError("times must be positive")
        if self.download_bytes_per_s < 0 or self.upload_bytes_per_s < 0:
            raise SettingsError("a bandwidth cap is 0 (none) or a positive number of bytes/s")


@dataclass(frozen=True)
class Observation:
    """What the probes saw at one instant."""

    gpu_utilisation: int | None = None
    """Percent over NVML's last sample period; None when NVML is absent."""
    other_gpu_processes: int = 0
    """Processes other than this one with a context on the GPU (compute or graphics)."""
    on_battery: bool = False
    local_time: dt.time = dt.time(12, 0)


@dataclass(frozen=True)
class GuestState:
    """Serve (reason '') or stay paused for `reason`; the GPU fields carry the resume
    delay from one sample to the next."""

    reason: str = ""
    gpu_calm_since: float | None = None
    """When the GPU was last seen calm after being busy (monotonic seconds)."""
    gpu_was_busy: bool = False

    @property
    def serving(self) -> bool:
        return not self.reason


def gpu_busy(seen: Observation, settings: GuestSettings) -> bool:
    """Heavy use by someone else: another process on the GPU and the GPU working hard.
    Our own stage also shows up in the utilisation, but not in `other_gpu_processes`;
    NVML absent (None) never counts as busy."""
    if seen.gpu_utilisation is None or seen.other_gpu_processes == 0:
        return False
    return seen.gpu_utilisation >= settings.gpu_busy_percent


def next_state(
    state: GuestState, seen: Observation, settings: GuestSettings, now: float
) -> GuestState:
    """What to do after this sample. The reason shown is the first that holds, in the
    order a person would look for it: battery, quiet hours, then the GPU. (The
    volunteer's own pause is not a reason here: it stops the loop that asks.)"""
    busy = settings.pause_when_gpu_busy and gpu_busy(seen, settings)
    if busy:
        calm_since, was_busy = None, True
    elif state.gpu_was_busy:
        calm_since = state.gpu_calm_since if state.gpu_calm_since is not None else now
        was_busy = now - calm_since < settings.resume_after_s
        calm_since = calm_since if was_busy else None
    else:
        calm_since, was_busy = None, False
    if settings.pause_on_battery and seen.on_battery:
        reason = ON_BATTERY
    elif in_quiet_hours(seen.local_time, settings.quiet_hours):
        reason = QUIET_HOURS
    elif was_busy:
        reason = GPU_BUSY
    else:
        reason = ""
    return GuestState(reason, calm_since, was_busy)
