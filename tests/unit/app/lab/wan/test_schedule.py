"""app.lab.wan.schedule: the delay proxy's timing, on an injected clock (no sockets)."""

from __future__ import annotations

from app.lab.wan.schedule import LaneSchedule, WakeLead


def test_nothing_leaves_before_it_is_due() -> None:
    s: LaneSchedule[str] = LaneSchedule()
    s.push("a", b"1", now=10.0, delay_s=0.020)
    assert s.next_due() == 10.020
    assert s.pop_due(10.0199) == []
    assert s.pop_due(10.020) == [("a", b"1", 10.020)]
    assert s.next_due() is None and len(s) == 0


def test_jitter_never_reorders_a_lane() -> None:
    s: LaneSchedule[str] = LaneSchedule()
    s.push("a", b"1", now=0.0, delay_s=0.030)
    due = s.push("a", b"2", now=0.001, delay_s=0.005)  # would overtake the first
    assert due == 0.030
    assert [d for _, d, _ in s.pop_due(1.0)] == [b"1", b"2"]


def test_lanes_are_merged_in_due_order() -> None:
    s: LaneSchedule[str] = LaneSchedule()
    s.push("slow", b"s1", now=0.0, delay_s=0.050)
    s.push("fast", b"f1", now=0.0, delay_s=0.010)
    s.push("fast", b"f2", now=0.0, delay_s=0.060)
    s.push("slow", b"s2", now=0.0, delay_s=0.055)
    assert s.next_due() == 0.010
    assert [d for _, d, _ in s.pop_due(1.0)] == [b"f1", b"s1", b"s2", b"f2"]


def test_a_held_lane_waits_and_others_do_not() -> None:
    s: LaneSchedule[str] = LaneSchedule()
    s.hold("up")
    s.push("up", b"u", now=0.0, delay_s=0.001)
    s.push("down", b"d", now=0.0, delay_s=0.002)
    assert s.next_due() == 0.002
    assert s.pop_due(1.0) == [("down", b"d", 0.002)]
    assert s.next_due() is None and len(s) == 1
    s.release("up")
    assert s.pop_due(1.0) == [("up", b"u", 0.001)]  # overdue: out at once


def test_discard_forgets_a_lane_and_a_new_one_of_that_name_starts_clean() -> None:
    s: LaneSchedule[str] = LaneSchedule()
    s.push("a", b"old", now=0.0, delay_s=0.010)
    assert s.discard("a") == 1
    assert s.next_due() is None
    s.push("a", b"new", now=1.0, delay_s=0.010)
    assert s.pop_due(1.005) == []  # the stale heap entry (due 0.010) releases nothing
    assert s.pop_due(1.010) == [("a", b"new", 1.010)]


def test_many_lanes_release_everything_exactly_once() -> None:
    s: LaneSchedule[int] = LaneSchedule()
    sent = []
    for i in range(200):
        lane = i % 7
        s.push(lane, i.to_bytes(2, "big"), now=i * 0.0001, delay_s=(i * 37 % 11) * 0.001)
    now = 0.0
    while (due := s.next_due()) is not None:
        now = due
        out = s.pop_due(now)
        assert out and all(d <= now for _, _, d in out)
        sent += out
    assert sorted(int.from_bytes(d, "big") for _, d, _ in sent) == list(range(200))
    for lane in range(7):  # FIFO per lane
        mine = [int.from_bytes(d, "big") for ln, d, _ in sent if ln == lane]
        assert mine == sorted(mine)
    dues = [d for _, _, d in sent]
    assert dues == sorted(dues)


def test_wake_lead_follows_the_measured_lateness_within_its_cap() -> None:
    lead = WakeLead()
    assert lead.lead == lead.margin_s
    for _ in range(100):
        lead.observe(asked=1.0, woke=1.0008)  # a loop that fires 0.8 ms late
    assert abs(lead.lead - (0.0008 + lead.margin_s)) < 1e-5
    for _ in range(100):
        lead.observe(asked=1.0, woke=1.5)  # a stalled machine
    assert lead.lead == lead.cap_s
    lead.observe(asked=1.0, woke=0.9)  # early wake-ups count as zero, not negative
    assert lead.lead_s <= lead.cap_s
