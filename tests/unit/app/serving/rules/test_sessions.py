"""app.serving.rules.sessions: ownership, resume, de-duplication, admission and grace, pumped with
events; links are plain strings, no sockets, no model."""

from __future__ import annotations

import pytest

from app.serving.rules.sessions import (
    ERROR_MESSAGE_BYTES,
    Begin,
    CancelGrace,
    Drain,
    End,
    Failed,
    FrameReceived,
    GraceExpired,
    LinkClosed,
    LinkLost,
    LinkReady,
    LinkState,
    Refused,
    Release,
    Resent,
    Resumed,
    Send,
    SessionRules,
    Shutdown,
    Take,
    TokensReady,
)
from core.admission import AdmissionLedger, AdmissionPolicy
from net import wire
from net.errors import ErrorCode
from net.protocol import overload_hint
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

OPEN = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)


def step(step_id: int, session: str = "s1") -> wire.Step:
    return wire.Step(session, step_id, step_id, (1,), None, 1, 0, WireDtype.F32)


def tokens(step_id: int) -> wire.Tokens:
    return wire.Tokens("s1", step_id, (7,), (), 0, False, ())


def error(code: ErrorCode, message: str, session: str = "s1") -> Send[str]:
    return Send("up-a", wire.Error(session, code, message))


def opened(is_last: bool = False) -> SessionRules[str]:
    """A stage with s1 opened by node "a" over link "up-a" (on the last stage, the
    client's link "cl" is there first)."""
    rules: SessionRules[str] = SessionRules(is_last)
    if is_last:
        rules.handle(LinkReady("cl", "client"))
    rules.handle(LinkReady("up-a", "a"))
    assert rules.handle(FrameReceived("up-a", "a", OPEN)) == [Begin(OPEN)]
    return rules


# ---------------------------------------------------------------- ownership and resume


def test_the_opening_link_owns_the_session() -> None:
    rules = opened()
    assert "s1" in rules and len(rules) == 1
    assert rules.owns("up-a", "s1") and not rules.owns("up-b", "s1")
    assert rules.state("s1") is LinkState.LINKED


def test_the_same_open_from_the_same_node_resumes_over_the_new_link() -> None:
    rules = opened()
    assert rules.handle(LinkClosed("up-a", "path died")) == [
        LinkLost("s1", "path died", arm_grace=True)
    ]
    assert rules.state("s1") is LinkState.WAITING
    assert rules.handle(FrameReceived("up-a2", "a", OPEN)) == [
        Resumed("s1", "a"),
        CancelGrace("s1"),
    ]
    assert rules.owns("up-a2", "s1") and rules.state("s1") is LinkState.LINKED


def test_a_resume_while_the_old_link_still_lives_releases_it() -> None:
    rules = opened()
    assert rules.handle(FrameReceived("up-a2", "a", OPEN)) == [
        Release("up-a", "s1"),
        Resumed("s1", "a"),
    ]
    assert rules.owns("up-a2", "s1")


def test_another_node_reusing_the_id_is_refused_and_the_session_lives_on() -> None:
    rules = opened()
    assert rules.handle(FrameReceived("up-b", "b", OPEN)) == [
        Send(
            "up-b", wire.Error("s1", ErrorCode.NOT_OWNER, "session already open (by another peer)")
        ),
        Release("up-b", "s1"),
    ]
    assert rules.owns("up-a", "s1")


def test_a_different_open_from_the_owner_node_is_not_a_resume() -> None:
    rules = opened()
    other = wire.Open("s1", "m", WireDtype.BF16, wire.SamplingSpec(), "client", 8, 2)
    actions = rules.handle(FrameReceived("up-a2", "a", other))
    assert actions[0] == Send(
        "up-a2", wire.Error("s1", ErrorCode.NOT_OWNER, "session already open (by another peer)")
    )
    assert actions[1:] == [Release("up-a2", "s1")]
    assert rules.owns("up-a", "s1")


# ---------------------------------------------------------------- steps


def test_steps_already_taken_are_dropped_after_a_resume() -> None:
    rules = opened()
    assert rules.handle(FrameReceived("up-a", "a", step(0))) == [Take(step(0), OPEN)]
    assert rules.handle(FrameReceived("up-a", "a", step(1))) == [Take(step(1), OPEN)]
    rules.handle(FrameReceived("up-a2", "a", OPEN))  # resumed; the resend log follows
    assert rules.handle(FrameReceived("up-a2", "a", step(0))) == [Resent(step(0))]
    assert rules.handle(FrameReceived("up-a2", "a", step(1))) == [Resent(step(1))]
    assert rules.handle(FrameReceived("up-a2", "a", step(2))) == [Take(step(2), OPEN)]


@pytest.mark.parametrize(("link", "session"), [("up-b", "s1"), ("up-a", "nope")])
def test_a_step_from_a_link_that_does_not_own_the_session_is_refused(
    link: str, session: str
) -> None:
    rules = opened()
    assert rules.handle(FrameReceived(link, "a", step(0, session))) == [
        Send(link, wire.Error(session, ErrorCode.UNKNOWN_SESSION, "no such session here")),
        Release(link, session),
    ]
    assert "s1" in rules


# ---------------------------------------------------------------- admission and refusal


def test_a_draining_stage_refuses_new_sessions_but_resumes_running_ones() -> None:
    rules = opened()
    assert rules.handle(Drain()) == []
    fresh = wire.Open("s2", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)
    assert rules.handle(FrameReceived("up-a", "a", fresh)) == [
        Send(
            "up-a",
            wire.Error(
                "s2",
                ErrorCode.OVERLOADED,
                "[retry-after-ms=0 another-route=1] this stage is pausing; try another route",
            ),
        ),
        Release("up-a", "s2"),
    ]
    assert "s2" not in rules
    assert Resumed("s1", "a") in rules.handle(FrameReceived("up-a2", "a", OPEN))


def test_the_last_stage_refuses_a_session_whose_client_has_no_link() -> None:
    """The client links its route's last stage before it opens: without that link the
    OPEN came down a chain that moved, and the client is told to fetch its route again."""
    rules: SessionRules[str] = SessionRules(is_last=True)
    message = "client 'client' has no link here: its route ends elsewhere"
    assert rules.handle(FrameReceived("up-a", "a", OPEN)) == [
        error(ErrorCode.ROUTE_MOVED, message),
        Release("up-a", "s1"),
    ]
    assert "s1" not in rules


def test_a_refused_frame_of_an_owned_session_fails_the_session() -> None:
    rules = opened()
    assert rules.handle(Refused("up-a", "s1", ErrorCode.BAD_SHAPE, "width")) == [
        error(ErrorCode.BAD_SHAPE, "width"),
        error(ErrorCode.BAD_SHAPE, "width"),  # the failure itself, to everyone involved
        Release("up-a", "s1"),
        End("s1", forward_close=True, reason="width", failed=True),
    ]
    assert "s1" not in rules


def test_a_refused_frame_of_someone_elses_session_only_releases_the_id() -> None:
    rules = opened()
    assert rules.handle(Refused("up-b", "s1", ErrorCode.BAD_SHAPE, "width")) == [
        Send("up-b", wire.Error("s1", ErrorCode.BAD_SHAPE, "width")),
        Release("up-b", "s1"),
    ]
    assert rules.handle(Refused("up-b", "", ErrorCode.MALFORMED, "?")) == [
        Send("up-b", wire.Error("", ErrorCode.MALFORMED, "?"))
    ]
    assert rules.owns("up-a", "s1")


# ---------------------------------------------------------------- the last stage's client


def test_tokens_wait_for_a_redialling_client_and_are_sent_again_on_its_return() -> None:
    rules = opened(is_last=True)
    assert rules.handle(TokensReady(tokens(0))) == [Send("cl", tokens(0))]
    assert rules.handle(LinkClosed("cl", "client path died")) == [
        LinkLost("s1", "client path died", arm_grace=True)
    ]
    assert rules.handle(TokensReady(tokens(1))) == []
    assert rules.handle(LinkReady("cl2", "client")) == [
        Send("cl2", tokens(1)),
        CancelGrace("s1"),
    ]
    assert rules.handle(LinkReady("cl2", "client")) == []  # already its reply link


def test_grace_runs_until_every_link_is_back() -> None:
    rules = opened(is_last=True)
    rules.handle(LinkClosed("cl", "x"))
    assert rules.handle(LinkClosed("up-a", "y")) == [LinkLost("s1", "y", arm_grace=False)]
    assert rules.handle(FrameReceived("up-a2", "a", OPEN)) == [Resumed("s1", "a")]
    assert rules.state("s1") is LinkState.WAITING  # the client is still away
    assert rules.handle(LinkReady("cl2", "client")) == [CancelGrace("s1")]


# ---------------------------------------------------------------- ending


def test_a_session_not_resumed_within_grace_ends_and_closes_downstream() -> None:
    rules = opened()
    rules.handle(LinkClosed("up-a", "path died"))
    assert rules.handle(GraceExpired("s1")) == [
        End("s1", forward_close=True, reason="link lost and not resumed: path died")
    ]
    assert "s1" not in rules
    assert rules.handle(GraceExpired("s1")) == []


def test_grace_expiring_after_a_resume_changes_nothing() -> None:
    rules = opened()
    rules.handle(LinkClosed("up-a", "path died"))
    rules.handle(FrameReceived("up-a2", "a", OPEN))
    assert rules.handle(GraceExpired("s1")) == []
    assert "s1" in rules


def test_close_ends_the_session_and_releases_its_link() -> None:
    rules = opened()
    assert rules.handle(FrameReceived("up-a", "a", wire.Close("s1", "done"))) == [
        Release("up-a", "s1"),
        End("s1", forward_close=True, reason="done"),
    ]
    assert rules.handle(FrameReceived("up-a", "a", wire.Close("s1", "done"))) == []


def test_a_failure_from_downstream_goes_up_without_closing_downstream() -> None:
    rules = opened(is_last=True)
    message = "é" * ERROR_MESSAGE_BYTES  # 2 bytes each: cut to fit
    actions = rules.handle(Failed("s1", ErrorCode.STAGE_ERROR, message, forward_close=False))
    cut = wire.truncate_utf8(message, ERROR_MESSAGE_BYTES)
    assert actions == [
        Send("up-a", wire.Error("s1", ErrorCode.STAGE_ERROR, cut)),
        Send("cl", wire.Error("s1", ErrorCode.STAGE_ERROR, cut)),
        Release("up-a", "s1"),
        End("s1", forward_close=False, reason=message, failed=True),
    ]
    assert rules.handle(Failed("s1", ErrorCode.STAGE_ERROR, "again")) == []


def test_shutdown_ends_every_session() -> None:
    rules = opened()
    two = wire.Open("s2", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)
    rules.handle(FrameReceived("up-b", "b", two))
    rules.handle(LinkClosed("up-b", "gone"))
    assert rules.handle(Shutdown("worker shutting down")) == [
        Release("up-a", "s1"),
        End("s1", forward_close=True, reason="worker shutting down"),
        End("s2", forward_close=True, reason="worker shutting down"),
    ]
    assert len(rules) == 0


def test_error_frames_from_upstream_change_nothing() -> None:
    rules = opened()
    frame = wire.Error("s1", ErrorCode.INTERNAL, "hm")
    assert rules.handle(FrameReceived("up-a", "a", frame)) == []
    assert rules.owns("up-a", "s1")


# ---------------------------------------------------------------- admission by memory


def _open(name: str, prompt: int = 2, max_tokens: int = 8) -> wire.Open:
    return wire.Open(name, "m", WireDtype.F32, wire.SamplingSpec(), "client", max_tokens, prompt)


def test_admission_refuses_the_first_session_past_the_kv_budget_and_frees_on_end() -> None:
    # 3 sessions of 2 + 8 + 16 (guess slack) = 26 positions fit in 80; the fourth does not.
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=80, max_sessions=256, kv_bytes_per_token=10))
    rules: SessionRules[str] = SessionRules(False, ledger)
    rules.handle(LinkReady("up-a", "a"))
    for k in range(3):
        assert rules.handle(FrameReceived("up-a", "a", _open(f"s{k}"))) == [Begin(_open(f"s{k}"))]
    refused = rules.handle(FrameReceived("up-a", "a", _open("s3")))
    assert isinstance(refused[0], Send) and isinstance(refused[0].frame, wire.Error)
    err = refused[0].frame
    assert err.code is ErrorCode.OVERLOADED and refused[1] == Release("up-a", "s3")
    hint, text = overload_hint(err.code, err.message)
    assert hint is not None and hint.retry_after_ms > 0 and hint.try_another_route
    assert "KV memory full" in text
    assert len(rules) == 3 and "s3" not in ledger, "nothing reserved for the refused one"
    assert ledger.capacity().reserved_bytes == 3 * 26 * 10
    # A running session ends: its positions come back and the next one is admitted.
    assert End("s0", True, "done") in rules.handle(
        FrameReceived("up-a", "a", wire.Close("s0", "done"))
    )
    assert rules.handle(FrameReceived("up-a", "a", _open("s3"))) == [Begin(_open("s3"))]


def test_admission_counts_sequence_slots_and_a_resume_reserves_nothing_new() -> None:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=10_000, max_sessions=2))
    rules: SessionRules[str] = SessionRules(False, ledger)
    rules.handle(LinkReady("up-a", "a"))
    for k in range(2):
        rules.handle(FrameReceived("up-a", "a", _open(f"s{k}")))
    assert Resumed("s0", "a") in rules.handle(FrameReceived("up-a2", "a", _open("s0")))
    assert ledger.capacity().sessions == 2
    refused = rules.handle(FrameReceived("up-a", "a", _open("s2")))
    assert isinstance(refused[0], Send) and isinstance(refused[0].frame, wire.Error)
    assert "all 2 sessions" in refused[0].frame.message
    # A failure frees the slot as well as a close.
    rules.handle(Failed("s1", ErrorCode.STAGE_ERROR, "boom"))
    assert rules.handle(FrameReceived("up-a", "a", _open("s2"))) == [Begin(_open("s2"))]
