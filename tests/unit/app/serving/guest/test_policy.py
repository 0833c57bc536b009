"""The good guest's decisions: GPU, battery, quiet hours, with plain values (no probes)."""

from __future__ import annotations

import datetime as dt

import pytest

from app.serving.guest.policy import (
    GPU_BUSY,
    ON_BATTERY,
    QUIET_HOURS,
    GuestSettings,
    GuestState,
    Observation,
    QuietHours,
    SettingsError,
    in_quiet_hours,
    next_state,
    parse_quiet_hours,
)

S = GuestSettings(resume_after_s=60)
BUSY = Observation(gpu_utilisation=95, other_gpu_processes=1)
CALM = Observation(gpu_utilisation=3, other_gpu_processes=1)


def t(hhmm: str) -> dt.time:
    h, m = hhmm.split(":")
    return dt.time(int(h), int(m))


@pytest.mark.parametrize(
    ("now", "inside"),
    [
        ("21:59", False),
        ("22:00", True),
        ("23:59", True),
        ("00:00", True),
        ("06:59", True),
        ("07:00", False),
        ("12:00", False),
    ],
)
def test_quiet_hours_over_midnight(now: str, inside: bool) -> None:
    assert in_quiet_hours(t(now), parse_quiet_hours("22:00-07:00")) is inside


def test_quiet_hours_within_a_day_several_ranges_and_edge_cases() -> None:
    ranges = parse_quiet_hours(" 09:00-12:30 , 13:00-17:00")
    assert [str(r) for r in ranges] == ["09:00-12:30", "13:00-17:00"]
    assert in_quiet_hours(t("12:29"), ranges) and not in_quiet_hours(t("12:30"), ranges)
    assert in_quiet_hours(t("16:00"), ranges) and not in_quiet_hours(t("08:59"), ranges)
    assert not in_quiet_hours(t("10:00"), parse_quiet_hours("10:00-10:00"))  # empty range
    assert in_quiet_hours(t("23:59"), parse_quiet_hours("00:00-24:00"))
    assert parse_quiet_hours("") == ()


@pytest.mark.parametrize("bad", ["22-07", "22:00", "25:00-07:00", "22:60-07:00", "a:bc-d:ef"])
def test_bad_quiet_hours_are_refused_with_a_reason(bad: str) -> None:
    with pytest.raises(SettingsError):
        parse_quiet_hours(bad)
    with pytest.raises(SettingsError):
        QuietHours(0, 1441)


def test_another_programs_heavy_gpu_use_pauses_and_resumes_only_after_calm_lasts() -> None:
    s = next_state(GuestState(), BUSY, S, now=0)
    assert s.reason == GPU_BUSY
    s = next_state(s, CALM, S, now=10)  # calm starts
    assert s.reason == GPU_BUSY
    s = next_state(s, BUSY, S, now=40)  # busy again: the minute starts over
    s = next_state(s, CALM, S, now=50)
    assert next_state(s, CALM, S, now=109).reason == GPU_BUSY
    s = next_state(next_state(s, CALM, S, now=109), CALM, S, now=111)
    assert s.serving and not s.gpu_was_busy


def test_only_other_processes_count_and_absent_nvml_never_pauses() -> None:
    ours = Observation(gpu_utilisation=100, other_gpu_processes=0)  # our own stage working
    assert next_state(GuestState(), ours, S, 0).serving
    no_nvml = Observation(gpu_utilisation=None, other_gpu_processes=3)
    assert next_state(GuestState(), no_nvml, S, 0).serving
    at = Observation(gpu_utilisation=50, other_gpu_processes=1)
    assert next_state(GuestState(), at, S, 0).reason == GPU_BUSY  # at the threshold
    off = GuestSettings(pause_when_gpu_busy=False)
    assert next_state(GuestState(), BUSY, off, 0).serving


def test_battery_comes_before_quiet_hours_and_each_can_be_off() -> None:
    quiet = GuestSettings(quiet_hours=parse_quiet_hours("22:00-07:00"))
    night = dt.time(23, 0)
    seen = Observation(on_battery=True, local_time=night)
    assert next_state(GuestState(), seen, quiet, 0).reason == ON_BATTERY
    assert next_state(GuestState(), Observation(local_time=night), quiet, 0).reason == QUIET_HOURS
    no_battery_pause = GuestSettings(pause_on_battery=False)
    assert next_state(GuestState(), Observation(on_battery=True), no_battery_pause, 0).serving
    assert next_state(GuestState(), Observation(), GuestSettings(), 0).serving


def test_settings_are_checked() -> None:
    for kw in ({"gpu_busy_percent": 0}, {"sample_every_s": 0}, {"download_bytes_per_s": -1}):
        with pytest.raises(SettingsError):
            GuestSettings(**kw)  # type: ignore[arg-type]
