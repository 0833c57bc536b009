"""app.client.generation: one answer's frames and events, without IO or a clock."""

from __future__ import annotations

import pytest

from app.client.generation import (
    Finished,
    FinishReason,
    Generation,
    GuessesRejected,
    Refused,
    TokenEvent,
    ring_loop,
)
from app.config import Route, RouteStage
from app.errors import ClientError, Overloaded, StageFailed
from app.session.replay_resume import resume_ref
from app.session.replay_shapes import replay_segments
from core.guessing import MTP, GuessPolicy
from core.types import LayerRange, SamplingParams
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

PROMPT = (1, 2, 3, 4, 1, 2, 3)
WALL = 1_700_000_000_000_000_000


def route(*nodes: str) -> Route:
    stages = tuple(
        RouteStage(n, ("10.0.0.1", 7000 + i), LayerRange(i * 4, i * 4 + 4))
        for i, n in enumerate(nodes)
    )
    return Route("m", stages)


def generation(
    prompt: tuple[int, ...] = PROMPT,
    max_tokens: int = 8,
    **kwargs: object,
) -> Generation:
    return Generation("s", "m", "client", prompt, max_tokens, **kwargs)  # type: ignore[arg-type]


def opened(gen: Generation, now: float = 0.0) -> list[wire.Frame]:
    return gen.opening(now, WALL)


def tokens(
    step_id: int,
    *toks: int,
    n_accepted: int = 0,
    finished: bool = False,
    looped: bool = False,
    guessed: int = 0,
    guesses: tuple[int, ...] = (),
    session: str = "s",
) -> wire.Tokens:
    return wire.Tokens(
        session, step_id, toks, guesses, n_accepted, finished, (), looped=looped, guessed=guessed
    )


# ---------------------------------------------------------------- the opening


def test_the_opening_is_the_open_then_the_prompt_in_chunks() -> None:
    gen = generation(chunk=3, sampling=SamplingParams(temperature=0.5, seed=7))
    frames = opened(gen)
    open_, *steps = frames
    assert isinstance(open_, wire.Open)
    assert (open_.session, open_.model, open_.reply_to) == ("s", "m", "client")
    assert (open_.prompt_len, open_.max_tokens, open_.loop) == (7, 8, None)
    assert open_.sampling.temperature == 0.5 and open_.sampling.seed == 7
    assert (open_.resumes, open_.resume_held, open_.resume_digest) == ("", 0, b"")
    assert [(s.step_id, s.start, s.tokens) for s in steps if isinstance(s, wire.Step)] == [
        (0, 0, (1, 2, 3)),
        (1, 3, (4, 1, 2)),
        (2, 6, (3,)),
    ]
    step = steps[0]
    assert isinstance(step, wire.Step)
    assert step.hidden is None and step.n_rows == 3 and step.sent_at_ns == WALL
    assert gen.awaited_step == 2 and not gen.answered


def test_a_replay_names_the_session_it_continues_and_keeps_the_first_shapes() -> None:
    history = (*PROMPT, 9, 8)
    ref = resume_ref("old", history, from_layer=4)
    gen = generation(history, resume=ref, segments=replay_segments(len(PROMPT), 4, 2), chunk=4)
    open_, *steps = opened(gen)
    assert isinstance(open_, wire.Open) and ref is not None
    assert (open_.resumes, open_.resume_held, open_.resume_digest) == ("old", 8, ref.digest)
    assert open_.resume_from_layer == 4
    shapes = [(s.start, s.tokens, s.one_by_one) for s in steps if isinstance(s, wire.Step)]
    assert shapes == [(0, (1, 2, 3, 4), False), (4, (1, 2, 3), False), (7, (9, 8), True)]


def test_an_empty_prompt_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError):
        generation(())


def test_a_generation_opens_once() -> None:
    gen = generation()
    opened(gen)
    with pytest.raises(RuntimeError):
        opened(gen)


# ---------------------------------------------------------------- the ring asked for


def test_the_ring_names_the_first_and_the_last_stage() -> None:
    loop = ring_loop(route("a", "b", "c"), "client", GuessPolicy.fixed(3), ring=True)
    assert loop == wire.Loop("a", "10.0.0.1:7000", "c", 3, False)


@pytest.mark.parametrize(
    ("stages", "own", "guesses", "ring"),
    [
        (("a", "b"), "client", GuessPolicy.fixed(0), False),  # not asked
        (("a",), "client", GuessPolicy.fixed(0), True),  # one stage: nothing to go round
        (("a", "b"), "client", GuessPolicy(source=MTP), True),  # the head's guesses
        (("a", "b"), "client", GuessPolicy.fixed(99), True),  # more than a ring step carries
        (("a", "client"), "client", GuessPolicy.fixed(0), True),  # last stage on this node
        (("a", "b", "a"), "client", GuessPolicy.fixed(0), True),  # last stage is the first
    ],
)
def test_the_client_keeps_the_turn(
    stages: tuple[str, ...], own: str, guesses: GuessPolicy, ring: bool
) -> None:
    assert ring_loop(route(*stages), own, guesses, ring) is None


# ---------------------------------------------------------------- plain decoding


def test_tokens_accepted_then_the_next_step_from_the_client() -> None:
    gen = generation()
    opened(gen, now=10.0)
    events = gen.receive(tokens(0, 42), now=10.25)
    assert len(events) == 1 and isinstance(events[0], TokenEvent)
    event = events[0]
    assert (event.tokens, event.step_id, event.n_guesses, event.looped) == ((42,), 0, 0, False)
    assert event.trip_ms == pytest.approx(250.0)
    assert gen.answered and gen.has_turn
    step = gen.next_step(now=11.0, wall_ns=WALL + 1)
    assert step is not None
    assert (step.step_id, step.start, step.tokens, step.guesses, step.keep_until) == (
        1,
        7,
        (42,),
        (),
        None,
    )
    assert step.sent_at_ns == WALL + 1 and gen.awaited_step == 1 and not gen.has_turn
    (event,) = gen.receive(tokens(1, 43), now=11.5)
    assert isinstance(event, TokenEvent) and event.trip_ms == pytest.approx(500.0)


def test_frames_that_answer_nothing_awaited_mean_nothing() -> None:
    gen = generation(chunk=4)
    opened(gen)  # steps 0 and 1
    assert gen.receive(tokens(0, 5), 0.0) == ()  # an earlier step's, sent again
    assert gen.receive(tokens(1, 5, session="other"), 0.0) == ()
    assert gen.receive(wire.Close("s", "done"), 0.0) == ()  # stages send CLOSE downstream
    assert not gen.answered and not gen.has_turn


def test_the_next_step_waits_for_tokens() -> None:
    gen = generation()
    opened(gen)
    with pytest.raises(RuntimeError):
        gen.next_step(0.0, WALL)


def test_close_frees_the_session_whatever_happened() -> None:
    gen = generation()
    opened(gen)
    assert gen.close() == wire.Close("s", "done")
    assert gen.over and gen.receive(tokens(0, 5), 0.0) == ()


# ---------------------------------------------------------------- how an answer ends


def test_an_end_token_finishes_the_answer_right_there() -> None:
    gen = generation(is_end=lambda t: t == 2, guesses=GuessPolicy.fixed(0))
    opened(gen)
    events = gen.receive(tokens(0, 2), 0.0)
    assert [type(e) for e in events] == [TokenEvent, Finished]
    assert events[-1] == Finished(FinishReason.END_TOKEN) and gen.over


def test_an_accepted_guess_that_is_the_end_cuts_the_tokens_after_it() -> None:
    gen = generation(is_end=lambda t: t == 0, guesses=GuessPolicy.fixed(3), max_tokens=20)
    opened(gen)
    gen.receive(tokens(0, 4), 0.0)
    step = gen.next_step(0.0, WALL)
    assert step is not None and step.guesses == (1, 2, 3)
    event, *rest = gen.receive(tokens(1, 1, 0, 7, n_accepted=2), 0.0)
    assert isinstance(event, TokenEvent) and event.tokens == (1, 0)
    assert rest[-1] == Finished(FinishReason.END_TOKEN)


def test_max_tokens_counted_here_finishes() -> None:
    gen = generation(max_tokens=2)
    opened(gen)
    gen.receive(tokens(0, 5), 0.0)
    gen.next_step(0.0, WALL)
    events = gen.receive(tokens(1, 6), 0.0)
    assert events[-1] == Finished(FinishReason.MAX_TOKENS)


def test_the_last_stage_saying_finished_finishes() -> None:
    gen = generation(max_tokens=50)
    opened(gen)
    events = gen.receive(tokens(0, 5, finished=True), 0.0)
    assert events[-1] == Finished(FinishReason.MAX_TOKENS) and not gen.has_turn


# ---------------------------------------------------------------- refusals


def test_an_error_from_the_route_is_a_refusal_with_its_typed_error() -> None:
    gen = generation()
    opened(gen)
    (event,) = gen.receive(wire.Error("s", ErrorCode.STAGE_ERROR, "gone"), 0.0)
    assert isinstance(event, Refused) and isinstance(event.error, StageFailed)
    assert event.error.error_code is ErrorCode.STAGE_ERROR and gen.over


def test_an_overloaded_stage_is_an_overloaded_refusal() -> None:
    gen = generation()
    opened(gen)
    (event,) = gen.receive(wire.Error("s", ErrorCode.OVERLOADED, "busy"), 0.0)
    assert isinstance(event, Refused) and isinstance(event.error, Overloaded)


def test_tokens_that_do_not_add_up_are_given_then_refused() -> None:
    gen = generation()
    opened(gen)
    gen.receive(tokens(0, 5), 0.0)
    gen.next_step(0.0, WALL)  # no guesses: a reply of two tokens cannot be
    events = gen.receive(tokens(1, 6, 7, n_accepted=1), 0.0)
    assert isinstance(events[0], TokenEvent)
    assert isinstance(events[-1], Refused) and type(events[-1].error) is ClientError


def test_tokens_that_went_round_unasked_are_given_then_refused() -> None:
    gen = generation()
    opened(gen)
    events = gen.receive(tokens(0, 5, looped=True), 0.0)
    assert isinstance(events[0], TokenEvent)
    assert isinstance(events[-1], Refused) and "went round unasked" in str(events[-1].error)


# ---------------------------------------------------------------- guesses


def test_rejected_guesses_are_cut_by_the_next_step() -> None:
    gen = generation(guesses=GuessPolicy.fixed(2), max_tokens=20)
    opened(gen)
    gen.receive(tokens(0, 4), 0.0)
    step = gen.next_step(0.0, WALL)
    assert step is not None and (step.start, step.tokens, step.guesses) == (7, (4, 1, 2), (1, 2))
    events = gen.receive(tokens(1, 1, 9, n_accepted=1), 0.0)
    assert isinstance(events[0], TokenEvent) and events[0].n_guesses == 2
    assert events[1] == GuessesRejected(1, 1)
    step = gen.next_step(0.0, WALL)
    assert step is not None and step.start == 9 and step.tokens[0] == 9
    assert step.keep_until == 9  # the rejected guess's position is cut first


def test_the_mtp_heads_guesses_ride_on_the_clients_next_step() -> None:
    gen = generation(guesses=GuessPolicy(max_guesses=2, adaptive=False, source=MTP))
    opened(gen)
    gen.receive(tokens(0, 5, guesses=(6, 7)), 0.0)
    step = gen.next_step(0.0, WALL)
    assert step is not None and step.tokens == (5, 6, 7) and step.guesses == (6, 7)


# ---------------------------------------------------------------- the ring


def test_steps_round_the_ring_are_awaited_not_sent() -> None:
    loop = wire.Loop("a", "10.0.0.1:7000", "b", 2, False)
    gen = generation(guesses=GuessPolicy.fixed(2), loop=loop, max_tokens=20)
    (open_, *_) = opened(gen, now=1.0)
    assert isinstance(open_, wire.Open) and open_.loop == loop
    (event,) = gen.receive(tokens(0, 4, looped=True), now=1.5)
    assert isinstance(event, TokenEvent) and event.looped
    assert gen.next_step(now=2.0, wall_ns=WALL) is None  # the last stage sent it
    assert gen.awaited_step == 1
    # The ring's step carried two guesses; one stood.
    events = gen.receive(tokens(1, 1, 9, n_accepted=1, guessed=2, looped=False), now=2.25)
    event = events[0]
    assert isinstance(event, TokenEvent)
    assert event.n_guesses == 2 and event.trip_ms == pytest.approx(250.0)
    assert events[1] == GuessesRejected(1, 1)
    # Not looped: the client's turn, after the ring's guess it rejected.
    step = gen.next_step(now=3.0, wall_ns=WALL)
    assert step is not None and step.step_id == 2 and step.start == 9
    assert step.keep_until == 9


def test_a_step_carries_the_wire_dtype_of_no_rows() -> None:
    gen = generation(wire_dtype=WireDtype.BF16)
    open_, step, *_ = opened(gen)
    assert isinstance(open_, wire.Open) and open_.wire_dtype is WireDtype.BF16
    assert isinstance(step, wire.Step) and step.wire_dtype is WireDtype.F32
