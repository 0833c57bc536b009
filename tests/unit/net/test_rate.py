"""The bandwidth cap's token bucket, on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from net.rate import AsyncThrottle, RateError, Throttle, TokenBucket, bucket_for, upload_throttle


def test_a_full_bucket_lets_its_burst_through_then_makes_the_caller_wait() -> None:
    b = TokenBucket(rate=1000, burst=500)
    assert b.reserve(500, now=0.0) == 0.0
    assert b.reserve(250, now=0.0) == pytest.approx(0.25)  # 250 bytes of debt at 1000/s
    assert b.delay(now=0.1) == pytest.approx(0.15)
    assert b.delay(now=0.25) == 0.0


def test_the_cap_holds_on_average_whatever_the_chunk_sizes() -> None:
    b = TokenBucket(rate=10_000, burst=1_000)
    now, sent = 0.0, 0
    for size in [3000, 10, 7000, 1, 15000, 500] * 20:
        now += b.reserve(size, now)  # a caller that waits as told
        sent += size
    assert sent / now == pytest.approx(10_000, rel=0.05)
    assert sent / now <= 10_000 * (1 + 1_000 / sent * 10)  # never above rate + one burst


def test_refill_stops_at_the_burst_and_a_clock_stepping_back_gives_nothing() -> None:
    b = TokenBucket(rate=100, burst=50)
    b.reserve(50, now=0.0)
    assert b.delay(now=100.0) == 0.0 and b.tokens == 50  # idle for long: still one burst
    b.reserve(50, now=100.0)
    assert b.reserve(10, now=99.0) == pytest.approx(0.1)  # earlier "now" refilled nothing


def test_rate_zero_is_no_cap_and_bad_values_are_refused() -> None:
    assert TokenBucket(0, 0).reserve(10**12, now=0.0) == 0.0
    for rate, burst in [(-1, 10), (float("inf"), 10), (float("nan"), 10), (100, 0)]:
        with pytest.raises(RateError):
            TokenBucket(rate, burst)
    with pytest.raises(RateError):
        TokenBucket(100, 10).reserve(-1, now=0.0)
    assert bucket_for(1_000_000).burst == 250_000 and bucket_for(1000).burst == 64 * 1024


def test_throttle_sleeps_what_the_bucket_says_across_threads() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    t = Throttle(100_000, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        t.take(50_000)  # 500 kB at 100 kB/s with a 64 kB burst
    assert sum(slept) == pytest.approx((500_000 - 64 * 1024) / 100_000)
    assert t.waited_s == pytest.approx(sum(slept))
    Throttle(0, sleep=lambda s: slept.append(-1)).take(10**9)
    assert -1 not in slept


def test_async_throttle_defers_after_the_burst_and_one_cap_per_process() -> None:
    now = [0.0]
    a = AsyncThrottle(1000, clock=lambda: now[0])
    a.sent(64 * 1024 + 500)
    assert a.delay() == pytest.approx(0.5) and a.deferred == 1
    now[0] = 0.5
    assert a.delay() == 0.0
    assert upload_throttle(0) is None
    assert upload_throttle(12345) is upload_throttle(12345)
