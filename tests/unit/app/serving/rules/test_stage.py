"""app.serving.rules.stage: a client and three stage cores pumped in memory
(tests/support/pump.py): answers with guesses, round the ring, after a stage is
replaced mid-answer, and refusals that cost nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from app.serving.rules.events import LinkClosed, LinkReady
from app.serving.rules.work import StepsComputed, SweepIdle, TimerFired
from app.session.rows_refusal import RowsRefusal, rows_refusal
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype, encode_rows
from tests.support.pump import N_EMBD, Chain, answer_of, prompt_of

pytestmark = pytest.mark.unit

CUTS = [0, 2, 4, 6]
PROMPT = prompt_of(12)


def _settled(chain: Chain) -> None:
    """Every stage forgot every session (the client closed or failed them)."""
    for host in chain.hosts:
        assert len(host.core) == 0, f"{host.node} still holds {host.core.sessions}"
        assert host.stage.sessions == []


def test_an_answer_through_three_stages_is_the_models_own() -> None:
    chain = Chain(CUTS)
    chain.client.open("a", PROMPT, 10)
    chain.pump()
    answer = chain.client.answers["a"]
    assert answer.tokens == answer_of(PROMPT, 10)
    assert answer.finished and not answer.errors
    assert chain.last.core.stats.tokens == 10
    _settled(chain)


def test_each_stage_counts_the_hidden_bytes_it_sends_on() -> None:
    """What spot checks move is weighed against these (bench/trust.py)."""
    chain = Chain(CUTS)
    chain.client.open("a", PROMPT, 10)
    chain.pump()
    *senders, last = chain.hosts
    for host in senders:  # f32 rows, each N_EMBD wide, for every row computed
        assert host.core.stats.hidden_bytes_sent == host.core.stats.rows * N_EMBD * 4 > 0
    assert last.core.stats.hidden_bytes_sent == 0  # the last stage sends tokens


def test_guesses_are_verified_at_the_last_stage_and_change_nothing() -> None:
    plain, guessing = Chain(CUTS), Chain(CUTS)
    plain.client.open("a", PROMPT, 16)
    guessing.client.open("a", PROMPT, 16, guesses=3)
    plain.pump()
    guessing.pump()
    answer = guessing.client.answers["a"]
    assert answer.tokens == plain.client.answers["a"].tokens == answer_of(PROMPT, 16)
    assert any(r.n_accepted > 0 for r in answer.replies)  # guesses stood...
    assert len(answer.replies) < len(plain.client.answers["a"].replies)  # ...saving trips
    # The guessed rows went down the whole chain; only the last stage judged them.
    onward = [f for _, f in guessing.hosts[1].sent if isinstance(f, wire.Step)]
    assert any(f.guesses for f in onward)
    _settled(guessing)


def test_rejected_guesses_are_cut_on_every_stage_and_the_answer_stays() -> None:
    prompt = [1, 2, 4, 3, 3, 2, 1, 4, 1, 2, 1, 4, 1, 2]  # a text whose n-grams mislead
    chain = Chain(CUTS)
    chain.client.open("a", prompt, 16, guesses=3)
    chain.pump()
    answer = chain.client.answers["a"]
    assert answer.tokens == answer_of(prompt, 16) and not answer.errors
    onward = [f for _, f in chain.hosts[1].sent if isinstance(f, wire.Step)]
    assert any(f.keep_until is not None for f in onward)  # a cut after a rejection
    _settled(chain)


def test_the_mtp_heads_guesses_ride_back_while_the_client_uses_them() -> None:
    using, ignoring = Chain(CUTS), Chain(CUTS)
    for chain in (using, ignoring):
        chain.last.with_mtp_head(2)
    using.client.open("a", PROMPT, 20, guesses=2)
    ignoring.client.open("a", PROMPT, 20)  # guesses off: it sends none of them back
    using.pump()
    ignoring.pump()
    for chain in (using, ignoring):
        assert chain.client.answers["a"].tokens == answer_of(PROMPT, 20)
    used = using.client.answers["a"].replies
    assert all(r.guesses for r in used[:-2])  # but where max_tokens leaves no room
    assert sum(r.n_accepted for r in used) > 0
    # Ignored twice, the stage stops guessing (a probe every 16 steps aside).
    ignored = ignoring.client.answers["a"].replies
    assert ignoring.last.guessed < len(ignored) // 2
    assert [bool(r.guesses) for r in ignored[:3]] == [True, True, False]
    # No step round the ring while guesses ride back: the client builds the step.
    assert not any(r.looped for r in used)


@pytest.mark.parametrize("guesses", [0, 3])
def test_steps_go_round_the_ring_and_the_answer_is_the_same(guesses: int) -> None:
    chain = Chain(CUTS)
    chain.client.open("a", PROMPT, 12, loop=chain.loop(guesses))
    chain.pump()
    answer = chain.client.answers["a"]
    assert answer.tokens == answer_of(PROMPT, 12)
    assert answer.finished and not answer.errors
    assert answer.looped > 0  # the last stage sent those steps to the first itself
    ring_steps = [f for link, f in chain.last.sent if link.startswith("ring-")]
    assert sum(isinstance(f, wire.Step) for f in ring_steps) == answer.looped
    if guesses:
        assert any(r.guessed for r in answer.replies)
    _settled(chain)


def test_a_stage_replaced_mid_answer_and_the_replay_continues_identically() -> None:
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 4
    chain.client.open("a", PROMPT, 10)
    chain.pump()
    assert chain.client.answers["a"].tokens == answer_of(PROMPT, 4)
    # The middle stage dies; a fresh node takes its layers. The first stage fails the
    # session that ran through it; the last keeps it for a resume.
    chain.replace(1, "n1b")
    chain.pump()
    (error,) = chain.client.answers["a"].errors
    assert error.code is ErrorCode.STAGE_ERROR
    assert "a" in chain.last.core
    # The client replays as a new session; the last stage (layer 4 on) kept the old one.
    rows_before = chain.last.engine.rows
    chain.client.replay("a", "a2", from_layer=CUTS[2])
    chain.pump()
    replayed = chain.client.answers["a2"]
    assert [*chain.client.answers["a"].tokens, *replayed.tokens] == answer_of(PROMPT, 10)
    assert replayed.finished and not replayed.errors
    held = len(PROMPT) + 4 - 1
    stats = chain.last.core.stats
    assert (stats.sessions_adopted, stats.rows_reused) == (1, held)
    # The last stage computed the replay's final row and the six tokens after it only.
    assert chain.last.engine.rows - rows_before == 1 + 5
    # The new middle stage computed every replayed row.
    assert chain.hosts[1].engine.rows >= len(PROMPT) + 4
    _settled(chain)


def test_an_open_refused_for_overload_is_typed_and_costs_the_others_nothing() -> None:
    chain = Chain(CUTS, max_sessions=1)
    chain.client.open("a", PROMPT, 8)
    chain.client.open("b", PROMPT, 8)
    chain.pump()
    refused = chain.client.answers["b"].errors
    assert refused[0].code is ErrorCode.OVERLOADED
    # Its prompt's STEP, sent beside the OPEN, finds no session: nothing else happens.
    assert {e.code for e in refused[1:]} <= {ErrorCode.UNKNOWN_SESSION}
    assert chain.client.answers["b"].tokens == []
    a = chain.client.answers["a"]
    assert a.tokens == answer_of(PROMPT, 8) and not a.errors
    _settled(chain)


def test_a_stage_that_cannot_open_refuses_down_the_chain_and_the_client_hears() -> None:
    """The middle stage's engine has no slot left: the refusal travels back up."""
    chain = Chain(CUTS)
    middle = chain.hosts[1]
    middle.stage._free_slots.clear()  # every slot taken by someone else
    chain.client.open("a", PROMPT, 8)
    chain.pump()
    (error,) = chain.client.answers["a"].errors
    assert error.code is ErrorCode.OVERLOADED
    _settled(chain)


def test_a_node_cannot_step_or_open_a_session_it_does_not_own() -> None:
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 2
    chain.client.open("a", PROMPT, 6)
    chain.pump()
    middle = chain.hosts[1]
    # A third node links to the middle stage and tries the session "a".
    chain.net.connect("x-n1", "x", middle.node)
    middle.feed(LinkReady("x-n1", "x"))
    step = wire.Step("a", 99, len(PROMPT) + 2, (1,), None, 1, 0, WireDtype.F32)
    middle.receive("x-n1", "x", step)
    middle.receive("x-n1", "x", chain.client._opens["a"])
    refusals = [f for link, f in middle.sent if link == "x-n1"]
    assert [f.code for f in refusals if isinstance(f, wire.Error)] == [
        ErrorCode.UNKNOWN_SESSION,
        ErrorCode.NOT_OWNER,
    ]
    assert ("x-n1", "a") in middle.released
    # Nothing of "a" changed: it answers on as if nobody had tried.
    chain.client.go_on("a")
    chain.pump()
    answer = chain.client.answers["a"]
    assert answer.tokens == answer_of(PROMPT, 6) and not answer.errors
    _settled(chain)


def test_a_stage_that_redials_resumes_its_sessions_and_repeats_nothing() -> None:
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 3
    chain.client.open("a", PROMPT, 8)
    chain.pump()
    first, middle = chain.hosts[0], chain.hosts[1]
    # The path from the first stage to the middle one dies and is dialled again; the
    # first stage replays what it sent (its resend log): the OPEN and the latest step.
    middle.feed(LinkClosed("n0-n1", "path died"))
    assert middle.core.next_deadline() is not None  # the session waits for a resume
    chain.net.connect("n0-n1#2", first.node, middle.node)
    first.downstream = "n0-n1#2"
    middle.feed(LinkReady("n0-n1#2", first.node))
    sent = [f for link, f in first.sent if link == "n0-n1"]
    for frame in [sent[0], sent[-1]]:
        first._send("n0-n1#2", frame)
    chain.pump()
    assert middle.core.stats.sessions_resumed == 1
    assert middle.core.stats.resent_steps == 1
    assert middle.core.next_deadline() is None
    chain.client.go_on("a")
    chain.pump()
    answer = chain.client.answers["a"]
    assert answer.tokens == answer_of(PROMPT, 8) and not answer.errors
    _settled(chain)


def test_a_session_whose_link_stays_away_ends_after_its_grace() -> None:
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 2
    chain.client.open("a", PROMPT, 8)
    chain.pump()
    middle = chain.hosts[1]
    middle.feed(LinkClosed("n0-n1", "path died"))
    deadline = middle.core.next_deadline()
    assert deadline is not None
    chain.clock.now = deadline - 0.001
    middle.feed(TimerFired())
    assert "a" in middle.core
    chain.clock.now = deadline
    middle.feed(TimerFired())
    assert "a" not in middle.core and middle.stage.sessions == []
    # The CLOSE went on down the chain.
    assert any(isinstance(f, wire.Close) for link, f in middle.sent if link == "n1-n2")


def test_steps_computed_for_a_session_closed_meanwhile_are_dropped() -> None:
    chain = Chain(CUTS)
    chain.client.open("a", PROMPT, 4)
    while chain.net.queue:  # deliver, compute nothing yet
        _, to, link, frame = chain.net.queue.popleft()
        host = chain.host(to)
        if host is not None:
            host.receive(link, chain.net.other(link, to), frame)
    first = chain.first
    batch = first.core.take_batch(64)
    assert batch is not None
    results, verdicts = first.steps.run(batch.items, batch.checks)
    first.receive("c-n0", "client", wire.Close("a", "gone"))
    sent = len(first.sent)
    first.feed(StepsComputed(batch, results, verdicts, 0.0, 0.0))
    assert [f for _, f in first.sent[sent:] if isinstance(f, wire.Step)] == []


@pytest.mark.parametrize(
    ("rows", "dtype", "code"),
    [
        (np.zeros((1, 3), dtype=np.float32), WireDtype.F32, ErrorCode.BAD_SHAPE),  # width
        (np.zeros((1, 4), dtype=np.float32), WireDtype.BF16, ErrorCode.BAD_DTYPE),
        (None, WireDtype.F32, ErrorCode.BAD_SHAPE),  # token ids to a later stage
    ],
)
def test_rows_a_stage_cannot_take_fail_the_session_with_a_typed_error(
    rows: np.ndarray | None, dtype: WireDtype, code: ErrorCode
) -> None:
    """A bad STEP from the owner's link: the stage refuses it (no exception leaves the
    core), the session fails on every stage, and the client hears the code."""
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 2
    chain.client.open("a", PROMPT, 6)
    chain.pump()
    first, middle = chain.hosts[0], chain.hosts[1]
    start = len(PROMPT) + 1
    if rows is None:
        bad = wire.Step("a", 50, start, (1,), None, 1, 0, dtype)
    else:
        data = encode_rows(rows, dtype)
        bad = wire.Step("a", 50, start, (1,), data, 1, rows.shape[1], dtype)
    first._send(first.downstream or "", bad)
    chain.pump()
    sent_back = [f for link, f in middle.sent if link == "n0-n1" and isinstance(f, wire.Error)]
    assert sent_back and {e.code for e in sent_back} == {code}
    errors = chain.client.answers["a"].errors
    assert errors and errors[0].code is code
    _settled(chain)


def _row(values: list[float]) -> np.ndarray:
    return np.array([values], dtype=np.float32)


@pytest.mark.parametrize(
    ("rows", "check"),
    [
        (_row([1.0, float("nan"), 2.0, 0.0]), "not-finite"),
        (_row([1.0, float("inf"), 2.0, 0.0]), "not-finite"),
        (_row([0.0, 0.0, 0.0, 0.0]), "zero-row"),
        (_row([3.0e10, 15.0, 1.0, 0.0]), "norm-ceiling"),
    ],
)
def test_rows_no_model_computes_are_refused_before_the_engine(rows: np.ndarray, check: str) -> None:
    """Rows of the right shape and dtype that cannot be a model's: the next stage
    refuses the step before its engine sees them and counts it; the client hears a
    STAGE_ERROR naming the check and the layer the rows came in at (their sender is
    the stage that ends there). The refusing stage keeps the session's KV as it was,
    so the client's replay takes it over there and the answer goes on unchanged."""
    chain = _with_bad_rows(rows)
    middle = chain.hosts[1]
    assert middle.core.stats.rows_refused == 1
    sent_back = [f for link, f in middle.sent if link == "n0-n1" and isinstance(f, wire.Error)]
    assert [e.code for e in sent_back] == [ErrorCode.STAGE_ERROR]
    errors = chain.client.answers["a"].errors
    assert errors and {e.code for e in errors} == {ErrorCode.STAGE_ERROR}
    refusal, why = rows_refusal(errors[0].message)
    assert refusal == RowsRefusal(check, CUTS[1])
    assert why.startswith("step 50: row 0 ")
    assert "a" in middle.core and "a" in chain.last.core  # kept for the replay
    # The replay takes the refusing stage's KV over (and the last stage's).
    chain.client.replay("a", "a2", from_layer=CUTS[1])
    chain.pump()
    replayed = chain.client.answers["a2"]
    assert [*chain.client.answers["a"].tokens, *replayed.tokens] == answer_of(PROMPT, 6)
    assert replayed.finished and not replayed.errors
    assert middle.core.stats.sessions_adopted == 1
    assert middle.core.stats.rows_refused == 1  # the honest replay: no alarm
    _settled(chain)


def _with_bad_rows(rows: np.ndarray) -> Chain:
    """A chain whose first stage sent `rows` on as a step of session "a" (paused after
    two tokens), pumped until everyone answered."""
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 2
    chain.client.open("a", PROMPT, 6)
    chain.pump()
    first, middle = chain.hosts[0], chain.hosts[1]
    assert all(h.core.stats.rows_refused == 0 for h in chain.hosts)  # honest: no alarm
    computed = middle.engine.rows
    start = len(PROMPT) + 1
    data = encode_rows(rows, WireDtype.F32)
    bad = wire.Step("a", 50, start, (1,), data, 1, 4, WireDtype.F32)
    first._send(first.downstream or "", bad)
    chain.pump()
    assert middle.engine.rows == computed  # the rows never reached the engine
    return chain


def test_a_session_whose_rows_were_refused_ends_after_its_grace_without_a_replay() -> None:
    chain = _with_bad_rows(_row([0.0, 0.0, 0.0, 0.0]))
    middle = chain.hosts[1]
    assert "a" in middle.core
    chain.clock.now += middle.core.setup.resume_grace + 1
    middle.feed(TimerFired())
    chain.pump()
    _settled(chain)  # the middle stage's CLOSE freed the last stage's too


def test_a_session_that_stops_stepping_is_closed_and_its_client_told() -> None:
    chain = Chain(CUTS)
    chain.client.pause_after["a"] = 2
    chain.client.open("a", PROMPT, 8)
    chain.pump()
    first = chain.first
    idle_s = first.core.setup.session_idle_s
    chain.clock.now += idle_s - 1
    first.feed(SweepIdle())
    assert "a" in first.core
    chain.clock.now += 1
    first.feed(SweepIdle())
    chain.pump()
    assert first.core.stats.sessions_idle_closed == 1
    (error,) = chain.client.answers["a"].errors
    assert error.code is ErrorCode.STAGE_ERROR and "no step" in error.message
    _settled(chain)
