"""The first-run walk-through's decisions (app.ui.first_run_flow), without Qt: page order,
what blocks Next and why, what is saved, the download's speed and time left, the
notification when serving, and when Quit asks first."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.node_status import NodeStatus, ServeState
from app.ui.first_run_flow import (
    GIB,
    MIB,
    DownloadMeter,
    FlowFacts,
    Page,
    blocker,
    cap_range,
    download_line,
    download_text,
    finished_settings,
    needs_first_run,
    next_page,
    quit_question,
    serving_notice,
)
from app.ui.settings import Settings, default_cap_bytes

pytestmark = pytest.mark.unit

USABLE = 8 * GIB


def facts(**kw: object) -> FlowFacts:
    base: dict[str, object] = {
        "usable_bytes": USABLE,
        "cap_bytes": 6 * GIB,
        "code_problem": None,
    }
    base.update(kw)
    return FlowFacts(**base)  # type: ignore[arg-type]


def test_pages_run_in_order_when_nothing_blocks() -> None:
    f = facts(joined=True, status=NodeStatus(state=ServeState.SERVING, layers=(0, 30)))
    seen = [Page.WELCOME]
    while (n := next_page(seen[-1], f)) is not seen[-1]:
        seen.append(n)
    assert seen == list(Page)
    assert next_page(Page.SERVING, f) is Page.SERVING  # the last page is the last


def test_the_cap_must_be_what_this_pc_can_offer() -> None:
    r = cap_range(USABLE)
    assert r.low < r.default < r.high == USABLE
    assert r.default == default_cap_bytes(USABLE)  # the join dialog's default
    assert blocker(Page.MEMORY, facts(cap_bytes=r.default)) is None
    for bad in (0, USABLE + GIB):
        why = blocker(Page.MEMORY, facts(cap_bytes=bad))
        assert why is not None and "8.0 GiB" in why
        assert next_page(Page.MEMORY, facts(cap_bytes=bad)) is Page.MEMORY


def test_a_pc_with_almost_nothing_still_gets_a_valid_range() -> None:
    r = cap_range(0)
    assert r.low == r.high == r.default > 0


def test_the_invite_page_waits_for_a_good_code_and_the_coordinators_yes() -> None:
    bad = facts(code_problem="This invite code is damaged.")
    assert blocker(Page.INVITE, bad) == "This invite code is damaged."
    assert next_page(Page.INVITE, bad) is Page.INVITE
    assert blocker(Page.INVITE, facts(joining=True)) == "Joining… asking the coordinator."
    # A well-formed code allows Next (which joins), but only the coordinator's yes moves on.
    assert blocker(Page.INVITE, facts()) is None
    assert next_page(Page.INVITE, facts()) is Page.INVITE
    assert next_page(Page.INVITE, facts(joined=True)) is Page.DOWNLOAD


@pytest.mark.parametrize("state", [ServeState.WAITING, ServeState.DOWNLOADING, ServeState.LOADING])
def test_the_download_page_leads_on_only_once_serving(state: ServeState) -> None:
    f = facts(joined=True, status=NodeStatus(state=state))
    assert blocker(Page.DOWNLOAD, f) is not None and next_page(Page.DOWNLOAD, f) is Page.DOWNLOAD
    served = facts(joined=True, status=NodeStatus(state=ServeState.SERVING))
    assert next_page(Page.DOWNLOAD, served) is Page.SERVING


def test_an_error_while_downloading_is_said_in_words() -> None:
    f = facts(joined=True, status=NodeStatus(state=ServeState.ERROR, error="Disk full"))
    assert blocker(Page.DOWNLOAD, f) == "Serving stopped: Disk full"


def test_first_run_shows_until_finished_or_joined(tmp_path: Path) -> None:
    s = Settings()
    assert needs_first_run(s, joined=False)
    assert not needs_first_run(s, joined=True)  # joined another way (dialog, CLI)
    done = finished_settings(s, 5 * GIB)
    assert done.first_run_done and done.vram_cap_bytes == 5 * GIB
    assert not s.first_run_done  # a new value; the caller decides where it goes
    done.save(tmp_path)
    assert not needs_first_run(Settings.load(tmp_path), joined=False)
    assert finished_settings(Settings(vram_cap_bytes=3), None).vram_cap_bytes == 3


def test_the_meter_reads_speed_over_recent_samples_and_time_left() -> None:
    m = DownloadMeter(window_s=5.0)
    total = 100 * MIB
    v = m.observe(0.0, 0, total)
    assert v.speed_bps is None and v.eta_s is None
    assert download_text(v) == "0% · measuring speed…"
    for t in range(1, 4):
        v = m.observe(float(t), t * 10 * MIB, total)
    assert v.speed_bps == pytest.approx(10 * MIB)
    assert v.eta_s == pytest.approx(7.0)
    assert download_text(v) == "30% · 10.0 MiB/s · about 7 s left"
    assert download_line(m) == "30.0 MiB of 100.0 MiB · 30% · 10.0 MiB/s · about 7 s left"
    # It slows down: the old fast samples leave the window, the speed follows.
    for t in range(4, 12):
        v = m.observe(float(t), 30 * MIB + (t - 3) * MIB, total)
    assert v.speed_bps == pytest.approx(1 * MIB)
    assert v.eta_s == pytest.approx(62.0)
    assert "about 62 s left" in download_text(v)


def test_a_restarted_piece_does_not_read_as_negative_speed() -> None:
    m = DownloadMeter()
    m.observe(0.0, 50 * MIB, 100 * MIB)
    v = m.observe(1.0, 10 * MIB, 100 * MIB)  # a piece started again from zero
    assert v.speed_bps is None
    v = m.observe(2.0, 12 * MIB, 100 * MIB)
    assert v.speed_bps == pytest.approx(2 * MIB)


def test_long_times_read_in_minutes_and_hours() -> None:
    m = DownloadMeter()
    m.observe(0.0, 0, 10 * GIB)
    assert "about 17 min left" in download_text(m.observe(1.0, 10 * MIB, 10 * GIB))
    m = DownloadMeter()
    m.observe(0.0, 0, 10 * GIB)
    assert "about 2.8 h left" in download_text(m.observe(1.0, MIB, 10 * GIB))


def test_the_serving_notice_names_the_layers_and_how_to_stop() -> None:
    title, text = serving_notice(
        NodeStatus(state=ServeState.SERVING, layers=(10, 20), model="default")
    )
    assert title == "Sangama is serving"
    assert "layers 10-19 of default" in text and "every window closed" in text


def test_quit_asks_only_while_conversations_run() -> None:
    # `sessions` is a running total: 9 opened since start, none open now, asks nothing.
    assert quit_question(NodeStatus(state=ServeState.SERVING, sessions=9, running=0)) is None
    assert quit_question(NodeStatus(state=ServeState.PAUSED)) is None
    one = quit_question(NodeStatus(state=ServeState.SERVING, sessions=9, running=1))
    assert one is not None and one.startswith("1 conversation runs") and "it off" in one
    two = quit_question(NodeStatus(state=ServeState.PAUSING, finishing=2))
    assert two is not None and two.startswith("2 conversations run") and "them off" in two
