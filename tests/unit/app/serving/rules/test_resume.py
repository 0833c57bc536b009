"""A replay after a reroute keeps the KV of the stages that survived downstream of the
replaced one: the pure policy (app.serving.rules.resume, app.session.replay_resume), the session
rules' adoption and `Stage.adopt`, with plain strings for links and a fake engine; no
sockets, no model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.serving.rules.resume import (
    HeldSession,
    extend_history,
    may_adopt,
    positions_kept,
    rows_to_skip,
    trimmed,
)
from app.serving.rules.sessions import (
    Begin,
    End,
    FrameReceived,
    LinkReady,
    Release,
    Send,
    SessionRules,
)
from app.session.replay_resume import history_digest, resume_ref
from core.admission import AdmissionLedger, AdmissionPolicy
from core.errors import DuplicateSessionError, PositionError
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype, decode_rows, encode_rows
from tests.support.fakes import FakeEngine

pytestmark = pytest.mark.unit

HISTORY = [1, 5, 17, 42, 99, 7, 3]
"""What the old session's last stage holds: the prompt and all generated tokens but the
newest (8), which the client replays too."""
REPLAY = [*HISTORY, 8]
OLD = wire.Open("old", "m", WireDtype.F32, wire.SamplingSpec(), "client", 40, 4)


def replay_open(history: list[int] = REPLAY, resumes: str = "old", **changes: object) -> wire.Open:
    ref = resume_ref(resumes, history)
    assert ref is not None
    base = wire.Open("new", "m", WireDtype.F32, wire.SamplingSpec(), "client", 36, len(history),
                     ref.session, ref.held, ref.digest)  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the digest and the ref


def test_the_digest_binds_the_session_and_every_token() -> None:
    d = history_digest("old", HISTORY)
    assert len(d) == 32 and d == history_digest("old", list(HISTORY))
    assert d != history_digest("other", HISTORY)
    assert d != history_digest("old", HISTORY[:-1])
    assert d != history_digest("old", [*HISTORY[:-1], HISTORY[-1] + 1])


def test_the_ref_expects_all_but_the_newest_position() -> None:
    ref = resume_ref("old", REPLAY)
    assert ref is not None and ref.held == len(REPLAY) - 1
    assert ref.digest == history_digest("old", HISTORY)
    assert resume_ref("old", [5]) is None  # one position: nothing to keep


# ---------------------------------------------------------------- which positions are kept


def test_a_matching_history_keeps_all_but_the_final_row() -> None:
    assert positions_kept(replay_open(), HeldSession(OLD, HISTORY)) == len(HISTORY)
    # A stage that also saw the newest token (its answer was lost) keeps the same prefix.
    assert positions_kept(replay_open(), HeldSession(OLD, REPLAY)) == len(HISTORY)


@pytest.mark.parametrize(
    ("new", "held"),
    [
        (dataclasses.replace(replay_open(), resumes="", resume_held=0, resume_digest=b""),
         HISTORY),  # a plain new session
        (replay_open(), None),  # the stage restarted: nothing held
        (replay_open(resumes="someone-else"), HISTORY),  # names another session
        (replay_open(reply_to="mallory"), HISTORY),  # another client
        (replay_open(model="other"), HISTORY),
        (replay_open(), HISTORY[:-1]),  # holds fewer positions than the replay expects
        (replay_open(), [*HISTORY[:-1], 4]),  # a different history
        (replay_open(resume_digest=bytes(32)), HISTORY),  # a made-up digest
    ],
)  # fmt: skip
def test_anything_else_is_a_plain_new_session(new: wire.Open, held: list[int] | None) -> None:
    old = None if held is None else HeldSession(OLD, held)
    if new.resumes == "someone-else":
        old = HeldSession(dataclasses.replace(OLD, session="old"), HISTORY)
    assert positions_kept(new, old) == 0


@pytest.mark.parametrize(
    ("kept", "start", "n_rows", "skip"),
    [(7, 0, 4, 4), (7, 4, 4, 3), (7, 7, 1, 0), (7, 8, 1, 0), (0, 0, 4, 0), (7, 6, 1, 1)],
)
def test_rows_to_skip(kept: int, start: int, n_rows: int, skip: int) -> None:
    assert rows_to_skip(kept, start, n_rows) == skip


def test_trimming_a_step_keeps_its_later_rows_and_their_tokens() -> None:
    rows = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    step = wire.Step("new", 1, 4, (99, 7, 3, 8), encode_rows(rows, WireDtype.BF16), 4, 3,
                     WireDtype.BF16)  # fmt: skip
    cut = trimmed(step, 3)
    assert (cut.start, cut.n_rows, cut.tokens, cut.step_id) == (7, 1, (8,), 1)
    assert cut.hidden is not None
    np.testing.assert_array_equal(decode_rows(cut.hidden, WireDtype.BF16, 1, 3), rows[3:])
    wire.encode(cut)  # still a valid frame
    tokens_only = wire.Step("new", 0, 0, tuple(REPLAY), None, len(REPLAY), 0, WireDtype.F32)
    assert trimmed(tokens_only, 7).tokens == (8,)
    for bad in (0, 4):
        with pytest.raises(ValueError):
            trimmed(step, bad)


# ---------------------------------------------------------------- the rules adopt


def last_stage(
    ledger: AdmissionLedger | None = None,
) -> tuple[SessionRules[str], dict[str, list[int]]]:
    """A last stage with "old" opened by the dead middle stage over "up-dead" and its
    history held; the client is linked ("cl"), the spare too ("up-spare")."""
    held = {"old": list(HISTORY)}
    rules: SessionRules[str] = SessionRules(True, ledger, upstream_is_stage=True,
                                            history_of=held.get)  # fmt: skip
    rules.handle(LinkReady("cl", "client"))
    rules.handle(LinkReady("up-dead", "dead"))
    assert rules.handle(FrameReceived("up-dead", "dead", OLD)) == [Begin(OLD)]
    rules.handle(LinkReady("up-spare", "spare"))
    return rules, held


def test_the_replay_from_the_new_upstream_takes_the_session_over() -> None:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=10_000, max_sessions=1))
    rules, _ = last_stage(ledger)
    new = replay_open()
    # One slot: the old session's reservation passes to its replay.
    assert rules.handle(FrameReceived("up-spare", "spare", new)) == [
        Release("up-dead", "old"),
        Begin(new, adopt="old", kept=len(HISTORY)),
    ]
    assert "old" not in rules and rules.owns("up-spare", "new")
    assert "old" not in ledger and "new" in ledger
    # The dead stage's link (were it alive) can no longer step the old session.
    late = wire.Step("old", 9, 7, (3,), None, 1, 0, WireDtype.F32)
    (refusal, *_) = rules.handle(FrameReceived("up-dead", "dead", late))
    assert isinstance(refusal, Send) and isinstance(refusal.frame, wire.Error)
    assert refusal.frame.code is ErrorCode.UNKNOWN_SESSION


@pytest.mark.parametrize(
    "new",
    [replay_open(reply_to="mallory"), replay_open(resume_digest=bytes(32)),
     replay_open(history=[*HISTORY[:-1], 4, 8])],
)  # fmt: skip
def test_a_replay_that_does_not_match_is_new_and_leaves_the_old_session(new: wire.Open) -> None:
    rules, _ = last_stage()
    if new.reply_to == "mallory":
        rules.handle(LinkReady("cl-m", "mallory"))
    assert rules.handle(FrameReceived("up-spare", "spare", new)) == [Begin(new)]
    assert "old" in rules and rules.owns("up-dead", "old")


def test_no_histories_no_adoption_and_only_the_last_stage_adopts() -> None:
    rules: SessionRules[str] = SessionRules(True, upstream_is_stage=True)  # history_of None
    rules.handle(LinkReady("cl", "client"))
    rules.handle(LinkReady("up-dead", "dead"))
    rules.handle(FrameReceived("up-dead", "dead", OLD))
    (begin, *_ends) = rules.handle(FrameReceived("up-dead", "dead", replay_open()))
    assert begin == Begin(replay_open())  # nothing taken over (it ends: the next test)
    middle: SessionRules[str] = SessionRules(False, history_of={"old": HISTORY}.get)
    middle.handle(LinkReady("up", "a"))
    middle.handle(FrameReceived("up", "a", OLD))
    # Not taken over, and the replay came over the link that owns the old session: its
    # upstream moved on, so the old one ends here (after the replay's OPEN went on).
    assert middle.handle(FrameReceived("up", "a", replay_open())) == [
        Begin(replay_open()),
        Release("up", "old"),
        End("old", True, "replayed as new"),
    ]
    assert "old" not in middle


def test_a_refused_replay_gives_the_old_session_its_reservation_back() -> None:
    # 100 positions: the old session holds 60 (4 + 40 + 16 slack), another one 26; a
    # replay asking for 94 does not fit even with the old one's 60 back.
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=100, max_sessions=4, kv_bytes_per_token=1))
    rules, _ = last_stage(ledger)
    other = wire.Open("x", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)
    assert rules.handle(FrameReceived("up-dead", "dead", other)) == [Begin(other)]
    big = replay_open(max_tokens=70)
    (refusal, *_) = rules.handle(FrameReceived("up-spare", "spare", big))
    assert isinstance(refusal, Send) and isinstance(refusal.frame, wire.Error)
    assert refusal.frame.code is ErrorCode.OVERLOADED
    assert "old" in rules and "old" in ledger and "new" not in ledger
    assert ledger.capacity().reserved_bytes == 86


@pytest.mark.parametrize(
    ("from_layer", "first_layer", "is_last", "adopts"),
    [
        (None, 6, True, True),  # a client before the field: the last stage only
        (None, 4, False, False),
        (4, 4, False, True),  # the named layer's stage, and every one after it
        (4, 6, True, True),
        (4, 2, False, False),  # upstream of (or the) replaced stage: it feeds every row
        (8, 6, True, False),  # past the last layer: nobody (the last stage is new)
        (0, 0, False, True),  # nothing replaced: even the first stage keeps its KV
    ],
)
def test_a_stage_may_adopt_from_the_layer_the_replay_names(
    from_layer: int | None, first_layer: int, is_last: bool, adopts: bool
) -> None:
    new = replay_open(resume_from_layer=from_layer)
    assert may_adopt(new, first_layer, is_last) is adopts
    assert not may_adopt(dataclasses.replace(OLD, session="new"), first_layer, is_last)


def middle_stage(first_layer: int) -> SessionRules[str]:
    """A middle stage (layers from `first_layer`) with "old" opened by the stage before
    it, which died ("up-dead"); the replacement links as "up-spare"."""
    rules: SessionRules[str] = SessionRules(False, upstream_is_stage=True,
                                            history_of={"old": list(HISTORY)}.get,
                                            first_layer=first_layer)  # fmt: skip
    rules.handle(LinkReady("up-dead", "dead"))
    assert rules.handle(FrameReceived("up-dead", "dead", OLD)) == [Begin(OLD)]
    rules.handle(LinkReady("up-spare", "spare"))
    return rules


def test_a_middle_stage_downstream_of_the_replaced_one_adopts() -> None:
    new = replay_open(resume_from_layer=4)
    rules = middle_stage(4)
    assert rules.handle(FrameReceived("up-spare", "spare", new)) == [
        Release("up-dead", "old"),
        Begin(new, adopt="old", kept=len(HISTORY)),
    ]
    assert "old" not in rules and rules.owns("up-spare", "new")
    # The stage before the named layer (the replacement's upstream side) starts fresh.
    upstream = middle_stage(2)
    assert upstream.handle(FrameReceived("up-spare", "spare", new)) == [Begin(new)]
    assert "old" in upstream


def test_the_history_follows_computed_steps_and_is_lost_on_a_gap() -> None:
    def step(start: int, tokens: tuple[int, ...], keep_until: int | None = None) -> wire.Step:
        n = len(tokens)
        return wire.Step("s", start, start, tokens, bytes(16 * n), n, 4, WireDtype.F32,
                         keep_until=keep_until)  # fmt: skip

    history: list[int] = []
    assert extend_history(history, step(0, (1, 5, 17)))
    assert extend_history(history, step(3, (42, 9, 9)))  # a token and two guesses
    assert extend_history(history, step(5, (99,), keep_until=5))  # one guess rejected
    assert history == [1, 5, 17, 42, 9, 99]
    assert not extend_history(list(history), step(8, (3,)))  # rows past a gap
    no_tokens = dataclasses.replace(step(6, (3,)), tokens=())
    assert not extend_history(list(history), no_tokens)  # rows without their tokens


# ---------------------------------------------------------------- the stage renames


def test_stage_adopt_moves_the_cache_and_cuts_it_back() -> None:
    stage = Stage(FakeEngine(), StageSpec(LayerRange(2, 4), 8, n_ctx=64, n_batch=8, n_seq_max=2))
    stage.open("old")
    stage.step([StepRequest("old", 0, hidden=np.ones((8, 4), dtype=np.float32))])
    with pytest.raises(PositionError):
        stage.adopt("old", "new", 9)  # more than it holds: nothing changes
    assert stage.sessions == ["old"] and stage.n_past("old") == 8
    stage.adopt("old", "new", 7)
    assert stage.sessions == ["new"] and stage.n_past("new") == 7
    (out,) = stage.step([StepRequest("new", 7, hidden=np.ones((1, 4), dtype=np.float32))])
    assert isinstance(out, StepResult) and stage.n_past("new") == 8
    stage.open("other")
    with pytest.raises(DuplicateSessionError):
        stage.adopt("new", "other", 8)
