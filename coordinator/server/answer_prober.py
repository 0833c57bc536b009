"""The coordinator asks its planned chain for two tokens now and then (the IO of
answer_probe.py, which decides when and what it means).

It runs in a thread of its own with an asyncio loop of its own, beside the API's: a
probe dials QUIC links and waits up to `ProbePolicy.timeout_s`, which must never hold
an HTTP request. It authenticates like any client, with a certificate the coordinator
issues to itself from the swarm's CA (role client, node id `PROBE_NODE_ID`), sends a
three-token prompt to the first stage with the ring asked for (as the chat does), and
waits on its link to the last stage for the first token and the one the ring carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ed25519

from coordinator.server.answer_probe import (
    AnswerState,
    Chain,
    Failure,
    ProbeFailure,
    ProbePolicy,
    next_state,
    no_plan_state,
    probe_due,
)
from coordinator.server.liveness import split_address
from net import auth, wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import NetError
from net.quic.links import QuicTuning
from net.wire.tensors import WireDtype

log = logging.getLogger(__name__)

DEFAULT_POLICY = ProbePolicy()
PROBE_NODE_ID = "coordinator-probe"
PROBE_PROMPT = (1, 2, 3)
"""Token ids every vocabulary has; what they mean does not matter, that tokens come does."""
PROBE_TOKENS = 2
"""The prompt's token, then one the ring carries from the last stage to the first."""
CERT_HOURS = 24
RENEW_AFTER_S = 12 * 3600.0
TICK_S = 1.0
"""How often the thread looks at the plan (a re-plan is probed at its next tick)."""


def probe_credentials(ca: auth.CertifiedKey, ca_pem: bytes) -> NodeCredentials:
    """A client certificate of the coordinator's own, from the swarm's CA."""
    key = ed25519.Ed25519PrivateKey.generate()
    cert = auth.issue_node_certificate(
        ca, PROBE_NODE_ID, key.public_key(), "client", hours=CERT_HOURS
    )
    return NodeCredentials(auth.CertifiedKey(cert, key), ca_pem)


@dataclass(frozen=True)
class _Event:
    node: str
    frame: wire.Frame | None
    closed: str = ""


async def probe_chain(
    chain: Chain,
    model: str,
    creds: NodeCredentials,
    policy: ProbePolicy = DEFAULT_POLICY,
    tuning: QuicTuning = QuicTuning(),
) -> Failure | None:
    """Ask `chain` for `PROBE_TOKENS` tokens; None when they came, else what failed.
    Takes at most about `policy.timeout_s` (plus `dial_timeout_s` to find silent stages)."""
    first, last = chain[0], chain[-1]
    channels: dict[str, Channel] = {}
    events: asyncio.Queue[_Event] = asyncio.Queue()
    session = uuid.uuid4().hex
    got = 0
    try:
        try:
            async with asyncio.timeout(policy.timeout_s):
                for node, address in dict.fromkeys((first, last)):
                    try:
                        ch = await connect_channel(
                            split_address(address), creds, node, tuning, policy.dial_timeout_s
                        )
                    except (NetError, OSError, TimeoutError, ValueError) as exc:
                        return Failure(ProbeFailure.DIAL, node, str(exc) or type(exc).__name__)
                    channels[node] = ch
                    _watch(ch, node, events)
                entry = channels[first[0]]
                host, port = split_address(first[1])
                entry.send(
                    wire.Open(
                        session=session,
                        model=model,
                        wire_dtype=WireDtype.F32,
                        sampling=wire.SamplingSpec(),
                        reply_to=creds.node_id,
                        max_tokens=PROBE_TOKENS,
                        prompt_len=len(PROBE_PROMPT),
                        # The ring, as the chat asks for it; a one-stage chain has none.
                        loop=wire.Loop(
                            first[0], wire.Loop.address_text((host, port)), last[0], 0, False
                        )
                        if len(chain) > 1
                        else None,
                    )
                )
                entry.send(_step(session, 0, 0, PROBE_PROMPT))
                entry.flush()
                while got < PROBE_TOKENS:
                    ev = await events.get()
                    if ev.frame is None:
                        return Failure(ProbeFailure.LINK_CLOSED, ev.node, ev.closed)
                    frame = ev.frame
                    if isinstance(frame, wire.Error) and frame.session in ("", session):
                        return Failure(ProbeFailure.REFUSED, ev.node, frame.message)
                    if not isinstance(frame, wire.Tokens) or frame.session != session:
                        continue
                    got += len(frame.tokens)
                    if frame.finished:
                        break
                    if not frame.looped and frame.tokens and got < PROBE_TOKENS:
                        # Not sent round the ring (the stage decided so): the client's turn.
                        start = len(PROBE_PROMPT) + got - 1
                        entry.send(_step(session, frame.step_id + 1, start, frame.tokens[-1:]))
                        entry.flush()
        except TimeoutError:
            if got:
                return Failure(ProbeFailure.NO_RING, last[0], f"within {policy.timeout_s:.0f} s")
            silent = await _silent_stages(chain[1:-1], creds, policy, tuning)
            return Failure(
                ProbeFailure.NO_TOKEN, first[0], f"within {policy.timeout_s:.0f} s", silent
            )
        return None
    finally:
        entry_ch = channels.get(first[0])
        if entry_ch is not None and not entry_ch.closed.done():
            with contextlib.suppress(Exception):
                entry_ch.send(wire.Close(session, "probe done"))
                entry_ch.flush()
        for ch in channels.values():
            ch.on_close = lambda _c, _r: None
            ch.close("probe done")


def _watch(channel: Channel, node: str, events: asyncio.Queue[_Event]) -> None:
    def frame(_c: Channel, f: wire.Frame) -> None:
        events.put_nowait(_Event(node, f))

    def closed(_c: Channel, reason: str) -> None:
        events.put_nowait(_Event(node, None, reason or "closed"))

    channel.on_frame = frame
    channel.on_close = closed


def _step(session: str, step_id: int, start: int, tokens: tuple[int, ...]) -> wire.Step:
    return wire.Step(
        session=session,
        step_id=step_id,
        start=start,
        tokens=tokens,
        hidden=None,
        n_rows=len(tokens),
        width=0,
        wire_dtype=WireDtype.F32,
        sent_at_ns=time.time_ns(),
    )


async def _silent_stages(
    middle: Chain, creds: NodeCredentials, policy: ProbePolicy, tuning: QuicTuning
) -> tuple[str, ...]:
    """Of the stages between the first and the last, those that do not accept a link."""

    async def silent(node: str, address: str) -> bool:
        try:
            ch = await connect_channel(
                split_address(address), creds, node, tuning, policy.dial_timeout_s
            )
        except (NetError, OSError, TimeoutError, ValueError):
            return True
        ch.close("probe done")
        return False

    found = await asyncio.gather(*(silent(n, a) for n, a in middle))
    return tuple(n for (n, _), s in zip(middle, found, strict=True) if s)


class AnswerProber:
    """The probing thread: `state` is what the operator page and `sangama status` show."""

    def __init__(
        self,
        chain: Callable[[], tuple[Chain, str]],
        model: str,
        credentials: Callable[[], NodeCredentials],
        policy: ProbePolicy = DEFAULT_POLICY,
        on_state: Callable[[AnswerState], None] = lambda _s: None,
    ) -> None:
        """`chain`: the planned chain now and, when there is none, why not."""
        self._chain = chain
        self._model = model
        self._credentials = credentials
        self.policy = policy
        self._on_state = on_state
        self.state = AnswerState()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="answer-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.run(self._loop())

    def _set(self, state: AnswerState) -> None:
        self.state = state
        self._on_state(state)

    async def _loop(self) -> None:
        probed: Chain | None = None
        last_at: float | None = None
        creds: NodeCredentials | None = None
        creds_at = 0.0
        while not self._stop.is_set():
            try:
                chain, why = self._chain()
            except Exception as exc:  # the database busy for a moment: try next tick
                log.warning("answer probe: cannot read the plan: %s", exc)
                chain, why = (), ""
            now = time.monotonic()
            if not chain and why and (self.state.can_answer is not False or probed != ()):
                self._set(no_plan_state(self.state, why, time.time()))
                probed, last_at = (), now
            elif probe_due(self.policy, self.state, chain, probed, last_at, now):
                if creds is None or now - creds_at > RENEW_AFTER_S:
                    creds, creds_at = self._credentials(), now
                failure = await probe_chain(chain, self._model, creds, self.policy)
                took_ms = (time.monotonic() - now) * 1e3
                if failure is not None:
                    log.warning("answer probe of %s failed: %s", chain, failure)
                self._set(next_state(self.state, chain, failure, time.time(), took_ms))
                probed, last_at = chain, time.monotonic()
            await asyncio.sleep(TICK_S)
