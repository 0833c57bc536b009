"""Hypothesis profiles for the fuzzers (tests/unit/net/wire/test_fuzz.py,
tests/unit/app/serving/rules/test_sessions_fuzz.py): bounded in CI, longer on demand.

    fuzz-ci    (default) 60 examples, a 10 s deadline per example: a decoder or state
               machine that hangs fails the test instead of stalling CI; ~10-30 s in all.
    fuzz-long  SANGAMA_FUZZ_PROFILE=fuzz-long: 3000 examples, for a local deep run.

The deadline is generous because CI machines are shared; it catches hangs, not slowness.
"""

from __future__ import annotations

import datetime as dt
import os

from hypothesis import HealthCheck, settings

FUZZ_CI = "fuzz-ci"
FUZZ_LONG = "fuzz-long"
PROFILE_ENV = "SANGAMA_FUZZ_PROFILE"

settings.register_profile(
    FUZZ_CI,
    max_examples=60,
    deadline=dt.timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,  # a failure prints the blob that reproduces it
)
settings.register_profile(FUZZ_LONG, settings.get_profile(FUZZ_CI), max_examples=3000)


def fuzz_settings(steps: int) -> settings:
    """The active fuzz profile, with `steps` rules per stateful example."""
    profile = settings.get_profile(os.environ.get(PROFILE_ENV, FUZZ_CI))
    return settings(profile, stateful_step_count=steps)
