"""Which change in the swarm makes which event (coordinator/server/events.py)."""

from __future__ import annotations

import pytest

from coordinator.server.events import (
    GONE,
    KINDS,
    LIVE,
    STALE,
    PendingEvent,
    PlanView,
    Report,
    beat_events,
    clean_name,
    download_quarter,
    forgettable,
    liveness_after,
    name_from_note,
    node_state,
    plan_events,
    silence_events,
)

pytestmark = pytest.mark.unit

MIB = 1 << 20


def kinds(pending: tuple[PendingEvent, ...]) -> list[str]:
    return [d.kind for d in pending]


def test_every_kind_has_words_and_a_known_tone() -> None:
    for name, kind in KINDS.items():
        assert kind.label and kind.tone in ("ok", "info", "warn", "bad"), name
        assert kind.liveness in ("", LIVE, STALE, GONE), name
    assert "probe_failed" in KINDS  # recorded by the end-to-end route probe


def test_a_pause_is_told_once_with_its_reason_and_its_end_once() -> None:
    serving = Report("serving", layers=(0, 4))
    paused = Report(paused="on battery")
    first = beat_events("n", serving, paused, LIVE, 2.0)
    assert first == (PendingEvent("paused", "n", "on battery"),)
    assert beat_events("n", paused, paused, LIVE, 10.0) == ()
    # Another reason while still paused is news.
    assert kinds(beat_events("n", paused, Report(paused="quiet hours"), LIVE, 10.0)) == ["paused"]
    assert kinds(beat_events("n", paused, Report("waiting"), LIVE, 10.0)) == ["resumed"]


def test_a_download_is_told_at_its_start_and_each_quarter_not_each_beat() -> None:
    def at(done: int, layers: tuple[int, int] = (0, 4)) -> Report:
        return Report("downloading", layers=layers, done_bytes=done, total_bytes=100 * MIB)

    waiting = Report("waiting")
    start = beat_events("n", waiting, at(0), LIVE, 2.0)
    assert start == (PendingEvent("downloading", "n", "layers 0-3: 0% of 100.0 MiB"),)
    assert beat_events("n", at(0), at(10 * MIB), LIVE, 2.0) == ()
    assert [d.detail for d in beat_events("n", at(10 * MIB), at(30 * MIB), LIVE, 2.0)] == [
        "layers 0-3: 30% of 100.0 MiB"
    ]
    assert beat_events("n", at(30 * MIB), at(40 * MIB), LIVE, 2.0) == ()
    # Another stage's download starts over.
    assert kinds(beat_events("n", at(90 * MIB), at(0, (4, 8)), LIVE, 2.0)) == ["downloading"]
    assert download_quarter(100, 100) == 4 and download_quarter(5, 0) == 0


def test_loading_and_serving_are_told_when_they_begin() -> None:
    loading = Report("loading", layers=(4, 8))
    serving = Report("serving", layers=(4, 8))
    assert beat_events("n", Report("downloading", layers=(4, 8)), loading, LIVE, 2.0) == (
        PendingEvent("loading", "n", "layers 4-7"),
    )
    assert beat_events("n", loading, serving, LIVE, 2.0) == (
        PendingEvent("serving", "n", "layers 4-7"),
    )
    assert beat_events("n", serving, serving, LIVE, 2.0) == ()
    moved = Report("serving", layers=(0, 8))
    assert kinds(beat_events("n", serving, moved, LIVE, 2.0)) == ["serving"]


def test_a_restarted_coordinator_does_not_retell_what_nodes_were_doing() -> None:
    assert beat_events("n", None, Report("serving", layers=(0, 4)), LIVE, 0.0) == ()
    assert beat_events("n", None, Report("waiting"), "", 0.0) == ()
    # ... but a pause or a load under way is news to the operator reading the page now.
    assert kinds(beat_events("n", None, Report(paused="on battery"), "", 0.0)) == ["paused"]
    assert kinds(beat_events("n", None, Report("loading", layers=(0, 4)), "", 0.0)) == ["loading"]


def test_a_spare_standing_by_is_told_with_its_layers() -> None:
    standby = Report("standby", layers=(2, 5))
    assert beat_events("n", Report("waiting"), standby, LIVE, 1.0) == (
        PendingEvent("standby", "n", "a spare getting layers 2-4 ready"),
    )


def test_silence_is_told_stale_then_gone_once_each_and_a_beat_brings_it_back() -> None:
    assert silence_events("n", LIVE, "healthy", 3.0) == ()
    stale = silence_events("n", LIVE, "stale", 16.0)
    assert stale == (PendingEvent("stale", "n", "silent for 16 s"),)
    assert liveness_after(LIVE, stale) == STALE
    assert silence_events("n", STALE, "stale", 20.0) == ()
    gone = silence_events("n", STALE, "gone", 46.0)
    assert kinds(gone) == ["gone"] and liveness_after(STALE, gone) == GONE
    assert silence_events("n", GONE, "gone", 400.0) == ()
    # Straight to gone (the coordinator looked late): told gone, not stale.
    assert kinds(silence_events("n", LIVE, "gone", 60.0)) == ["gone"]
    back = beat_events("n", Report("serving", layers=(0, 4)), Report("waiting"), GONE, 61.0)
    assert back[0] == PendingEvent("back", "n", "heartbeats again after 61 s of silence")
    assert liveness_after(GONE, back) == LIVE


def test_a_paused_node_is_paused_not_stale_until_it_is_gone() -> None:
    assert node_state("stale", "on battery") == "paused"
    assert node_state("healthy", "on battery") == "paused"
    assert node_state("gone", "on battery") == "gone"
    assert node_state("stale", "") == "stale"
    assert node_state("revoked", "on battery") == "revoked"
    assert silence_events("n", LIVE, "paused", 14.0) == ()


def test_only_gone_revoked_or_long_silent_joined_workers_may_be_forgotten() -> None:
    assert forgettable("gone", "worker", 1000.0, 45.0)
    assert forgettable("revoked", "client", 1.0, 45.0)
    for state in ("healthy", "stale", "paused"):
        assert not forgettable(state, "worker", 1000.0, 45.0)
    assert not forgettable("joined", "worker", 10.0, 45.0)
    assert forgettable("joined", "worker", 100.0, 45.0)
    # A client never heartbeats: it may be chatting right now.
    assert not forgettable("joined", "client", 10_000.0, 45.0)


def test_a_new_plan_tells_its_stages_who_left_and_which_spare_was_promoted() -> None:
    names = {"a": "rack 3", "c": "Asha's PC"}
    before = PlanView((("a", (0, 4)), ("b", (4, 8))), spares=("c",))
    after = PlanView((("a", (0, 4)), ("c", (4, 8))), spares=())
    pending = plan_events(before, after, "", names)
    assert pending == (
        PendingEvent(
            "replanned", "", "2 stages: rack 3 (a) 0-3, Asha's PC (c) 4-7; left the plan: b"
        ),
        PendingEvent("promoted", "c", "takes layers 4-7 from b"),
    )
    # Spares coming and going change no stage: no event.
    assert plan_events(after, PlanView(after.stages, ("d",)), "", names) == ()


def test_the_first_plan_is_told_and_a_lost_plan_says_why() -> None:
    plan = PlanView((("a", (0, 8)),))
    assert plan_events(None, plan, "", {}) == (PendingEvent("replanned", "", "1 stage: a 0-7"),)
    lost = plan_events(plan, None, "waiting for workers: 1 of 2 joined", {})
    assert lost == (PendingEvent("no_plan", "", "waiting for workers: 1 of 2 joined"),)
    assert plan_events(None, None, "still none", {}) == ()


def test_names_come_from_the_invite_note_and_stay_apart() -> None:
    assert clean_name("  rack\t3 \n west ") == "rack 3 west"
    assert clean_name("a\x00b\x1bc") == "abc"
    assert len(clean_name("x" * 300)) == 64
    assert name_from_note("rack 3", set()) == "rack 3"
    assert name_from_note("rack 3", {"rack 3"}) == "rack 3 #2"
    assert name_from_note("rack 3", {"rack 3", "rack 3 #2"}) == "rack 3 #3"
    assert name_from_note("", {"x"}) == ""
    long = name_from_note("y" * 64, {"y" * 64})
    assert len(long) == 64 and long.endswith(" #2")
