"""The MTP head's bookkeeping on the last stage, over a fake head context: which rows
feed its cache (token x_p with the trunk's h_{p-1}), what it drops before each trip,
how guesses chain and stop at the probability threshold, and the client's choice of
guesses by source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from app.errors import ClientError
from app.serving.steps.mtp_guesses import chosen_position
from app.session.guess_tracker import GuessTracker
from core.guessing import GuessPolicy, choose_guesses
from core.mtp_head import MtpError, MtpGuesser, top_probability
from net import wire
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

E, V = 4, 8


class FakeHead:
    """Cache rows per sequence; the guess after a row is (token + 1) % V, with a
    probability set per token; its 'hidden state' is the token, to check chaining."""

    n_embd = E

    def __init__(self, confident: set[int] | None = None) -> None:
        self.cache: dict[int, dict[int, tuple[int, float]]] = {}
        self.confident = confident
        self.calls: list[tuple[int, int, list[int]]] = []

    def decode(
        self, seq: int, start: int, tokens: npt.ArrayLike, h_prev: np.ndarray, want_last: bool
    ) -> tuple[np.ndarray, np.ndarray] | None:
        toks = [int(t) for t in np.asarray(tokens)]
        self.calls.append((seq, start, toks))
        rows = self.cache.setdefault(seq, {})
        for i, (t, h) in enumerate(zip(toks, h_prev, strict=True)):
            assert start + i not in rows, "a position fed twice without being dropped"
            rows[start + i] = (t, float(h[0]))
        if not want_last:
            return None
        last = toks[-1]
        logits = np.zeros(V, dtype=np.float32)
        sure = self.confident is None or last in self.confident
        logits[(last + 1) % V] = 10.0 if sure else 0.5
        return logits, np.full(E, 100 + last, dtype=np.float32)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        rows = self.cache.setdefault(seq, {})
        for p in [p for p in rows if p >= p0 and (p1 < 0 or p < p1)]:
            del rows[p]
        return True


def _h(start: int, n: int) -> np.ndarray:
    """h rows whose first value names their position."""
    return np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], E, axis=1)


def test_observe_pairs_each_token_with_the_previous_positions_state() -> None:
    head = FakeHead()
    mtp = MtpGuesser(head, n_seq_max=2, n_batch=3)
    mtp.open("a")
    mtp.observe("a", 0, [5, 6, 7, 1], _h(0, 4))  # more rows than n_batch: two decodes
    mtp.observe("a", 4, [2], _h(4, 1))
    rows = head.cache[0]
    # Row p holds token x_p and h_{p-1}; position 0 has no predecessor (zeros).
    assert rows == {0: (5, 0.0), 1: (6, 0.0), 2: (7, 1.0), 3: (1, 2.0), 4: (2, 3.0)}
    assert [c[1] for c in head.calls] == [0, 3, 4]


def test_guess_chains_guesses_then_drops_its_own_rows() -> None:
    head = FakeHead()
    mtp = MtpGuesser(head, n_seq_max=2, n_batch=8)
    mtp.open("a")
    mtp.observe("a", 0, [1, 2, 3], _h(0, 3))
    # The stage chose 4 at position 3: guesses 5, 6, 7 chain from the head itself.
    assert mtp.guess("a", 3, 4, k=3, p_min=0.0) == (5, 6, 7)
    assert head.calls[-3:] == [(0, 3, [4]), (0, 4, [5]), (0, 5, [6])]
    assert sorted(head.cache[0]) == [0, 1, 2]  # guess rows gone; the next trip feeds them
    assert mtp.head_decodes == 3


def test_verify_trip_drops_rejected_rows_and_guesses_from_the_accepted_end() -> None:
    head = FakeHead()
    mtp = MtpGuesser(head, n_seq_max=2, n_batch=8)
    mtp.open("a")
    mtp.observe("a", 0, [1, 2, 3], _h(0, 3))
    # Verify trip: newest token 4 at 3, guesses 5, 6, 7 at 4..6; the stage kept 5 and
    # said 0 at position 5, so the rows at 5 and 6 were rejected.
    mtp.observe("a", 3, [4, 5, 6, 7], _h(3, 4))
    assert mtp.guess("a", 5, 0, k=1, p_min=0.0) == (1,)
    assert head.calls[-1] == (0, 5, [0])
    assert sorted(head.cache[0]) == [0, 1, 2, 3, 4]
    # The next trip starts at 5 (keep_until): its rows are fed without a clash.
    mtp.observe("a", 5, [0, 1], _h(5, 2))
    assert head.cache[0][5] == (0, 4.0)


def test_guessing_stops_below_the_probability_threshold() -> None:
    head = FakeHead(confident={4, 5})
    mtp = MtpGuesser(head, n_seq_max=1, n_batch=8)
    mtp.open("a")
    mtp.observe("a", 0, [1, 2, 3], _h(0, 3))
    # After 6 the head is unsure (p ~ 0.2): it stops instead of sending a weak guess.
    assert mtp.guess("a", 3, 4, k=5, p_min=0.5) == (5, 6)
    assert mtp.guess("a", 3, 4, k=5, p_min=0.0) == (5, 6, 7, 0, 1)
    assert mtp.guess("a", 3, 4, k=0, p_min=0.0) == ()


def test_no_guess_without_the_previous_state_and_slots_are_recycled() -> None:
    head = FakeHead()
    mtp = MtpGuesser(head, n_seq_max=1, n_batch=8)
    mtp.open("a")
    assert mtp.guess("a", 3, 4, k=2, p_min=0.0) == ()  # nothing observed yet
    assert mtp.guess("nobody", 0, 1, k=2, p_min=0.0) == ()
    with pytest.raises(MtpError):
        mtp.open("b")
    mtp.close("a")
    mtp.open("b")
    assert head.cache[0] == {}


def test_top_probability_is_the_softmax_of_the_argmax() -> None:
    tok, p = top_probability(np.array([0.0, 2.0, 2.0, -1.0], dtype=np.float32))
    assert tok == 1 and p == pytest.approx(np.exp(2) / (2 * np.exp(2) + 1 + np.exp(-1)))


def test_chosen_position_follows_the_real_rows_and_accepted_guesses() -> None:
    def step(start: int, rows: int, guesses: tuple[int, ...]) -> wire.Step:
        return wire.Step("s", 0, start, tuple(range(rows)), None, rows, 0, WireDtype.F32, guesses)

    assert chosen_position(step(0, 10, ()), 0) == 10  # the prompt's answer
    assert chosen_position(step(10, 4, (1, 2, 3)), 0) == 11
    assert chosen_position(step(10, 4, (1, 2, 3)), 3) == 14


def test_sources_choose_mtp_guesses_ngram_ones_or_both() -> None:
    history = [1, 2, 3, 1, 2]
    assert GuessPolicy.parse("mtp").source == "mtp" and GuessPolicy.parse("mtp").adaptive
    combined = GuessPolicy(max_guesses=3, adaptive=False, source="mtp+ngram")
    assert GuessPolicy.parse("mtp+ngram:3") == combined
    with pytest.raises(ValueError):
        GuessPolicy(source="eagle")
    mtp, both, ngram = (GuessPolicy.parse(s) for s in ("mtp:4", "mtp+ngram:4", "4"))
    assert choose_guesses(mtp, history, (7, 8, 9, 9, 9), 4) == (7, 8, 9, 9)
    assert choose_guesses(mtp, history, (), 4) == ()
    assert choose_guesses(both, history, (), 4) == (3, 1, 2)  # no MTP guesses: n-gram
    assert choose_guesses(both, history, (7,), 4) == (7,)
    assert choose_guesses(ngram, history, (7,), 4) == (3, 1, 2)  # offered guesses ignored


def test_tracker_sends_the_last_stages_guesses_and_refuses_bad_counts() -> None:
    t = GuessTracker([1, 2, 3], max_tokens=10, policy=GuessPolicy.parse("mtp:3"))
    t.reply([4], 0, 1.0, offered=(5, 6, 7, 8))
    step = t.next_step()
    assert step.tokens == (4, 5, 6, 7) and step.guesses == (5, 6, 7)
    t.reply([5, 9], 1, 1.0, offered=())
    assert t.next_step().guesses == ()
    with pytest.raises(ClientError, match="malformed TOKENS"):
        t.reply([1, 2, 3], 2, 1.0)  # accepting 2 of no guesses


def test_worker_config_carries_the_mtp_settings_through_toml(tmp_path: Path) -> None:
    import tomllib

    from app.config import WorkerConfig
    from app.errors import ConfigError
    from core.types import LayerRange

    cfg = WorkerConfig("n", ("127.0.0.1", 1), "m", LayerRange(0, 2), tmp_path,
                       mtp_guesses=3, mtp_p_min=0.5)  # fmt: skip
    back = WorkerConfig.from_dict(tomllib.loads(cfg.to_toml()))
    assert (back.mtp_guesses, back.mtp_p_min) == (3, 0.5)
    with pytest.raises(ConfigError):
        WorkerConfig("n", ("127.0.0.1", 1), "m", LayerRange(0, 2), tmp_path, mtp_guesses=9)


def test_a_client_that_ignores_the_guesses_stops_costing_them_but_is_probed() -> None:
    from app.serving.steps.mtp_guesses import (
        PROBE_EVERY,
        GuessGate,
        gate_offered,
        gate_open,
        gate_step,
    )

    gate = gate_step(GuessGate(), step_had_guesses=False)  # the prompt: guess
    assert gate_open(gate)
    opened = []
    for _ in range(2 * PROBE_EVERY):
        gate = gate_offered(gate, (1, 2))
        gate = gate_step(gate, step_had_guesses=False)  # a client with guesses off
        opened.append(gate_open(gate))
    assert opened[:2] == [True, False] and sum(opened) == 1 + 2  # then one probe per 16
    gate = gate_step(gate_offered(gate, (1,)), step_had_guesses=True)
    assert gate.ignored == 0 and gate_open(gate)
    # Offering nothing (the head was unsure) is not the client ignoring guesses.
    quiet = gate_step(gate_offered(GuessGate(), ()), step_had_guesses=False)
    assert quiet.ignored == 0 and gate_open(quiet)
