"""The frames peers exchange, as frozen dataclasses: what each one means, no encoding.

net.wire validates them and turns them into bytes and back; net.protocol decides which
may come when. Import them from net.wire, which re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass

from net.errors import ErrorCode
from net.wire.tensors import WireDtype


@dataclass(frozen=True)
class SamplingSpec:
    """The wire twin of core's SamplingParams (net may not import core; app converts)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_window: int = 64
    seed: int = 0


@dataclass(frozen=True)
class StageTiming:
    """What one stage spent on one step; the last stage returns them all to the client."""

    stage: int
    compute_ms: float
    queue_ms: float
    recv_to_send_ms: float


@dataclass(frozen=True)
class Loop:
    """Where a session's plain decode steps go round: the last stage sends the step of
    each token it chose straight to the first stage (and TOKENS to the client, off the
    token's path), instead of the client sending it after TOKENS came back."""

    first_node: str
    """The first stage, which the last stage dials (authenticated like every link)."""
    first_address: str
    """`host:port` of the first stage, as the client dialled it."""
    last_node: str
    """The last stage: the one node besides the client the first stage takes the
    session's STEPs from."""
    guesses: int = 0
    """Up to this many n-gram guesses a step round the ring may carry, chosen by the last
    stage from the session's tokens (core.guessing); 0: plain steps only."""
    adaptive: bool = True
    """The guesses follow what pays (core.guessing's adaptive policy); False: always
    `guesses` where the text has them."""

    @property
    def address(self) -> tuple[str, int]:
        """`first_address` as a socket takes it (checked by net.wire before it travels)."""
        host, _, port = self.first_address.rpartition(":")
        return host.strip("[]"), int(port)

    @staticmethod
    def address_text(address: tuple[str, int]) -> str:
        host, port = address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Open:
    """Client -> every stage of the route: a new session and how its tokens are chosen."""

    session: str
    model: str
    wire_dtype: WireDtype
    sampling: SamplingSpec
    reply_to: str
    """Where the last stage sends `Tokens` (the client's node id or address)."""
    max_tokens: int
    prompt_len: int
    resumes: str = ""
    """A replay after a reroute: the session it continues (empty: a plain new session).
    A last stage that still holds that session's first `resume_held` positions for the
    same client, with token ids matching `resume_digest`, keeps their KV and computes
    only the rest (app.serving.rules.resume); any other stage treats the OPEN as new.
    Encoded as an optional tail of the OPEN body, absent when empty: plain OPENs are
    byte-for-byte what peers of the same VERSION without this field send and read."""
    resume_held: int = 0
    """Positions [0, resume_held) the replay expects the resumed session to hold."""
    resume_digest: bytes = b""
    """SHA-256 of those positions' token ids, bound to `resumes` (app.session.replay_resume)."""
    resume_from_layer: int | None = None
    """The first layer whose stage may take the resumed session over: the client knows
    which stages of the new route held the old session on the old one (every stage from
    here on did), so only they keep their KV and the stages before, the new ones among
    them, compute everything. None (OPENs of clients before this field): the last stage
    only. A second optional tail after the digest, absent when None."""
    loop: Loop | None = None
    """Set: the client asks for the ring (`Loop`). A third optional tail, after the
    resume fields (written then in full, a missing `resume_from_layer` as U32_MAX);
    absent when None."""


@dataclass(frozen=True)
class Step:
    """Rows of one session from position `start`, moving down the chain.

    Either token rows (to the first stage: `hidden` None, `width` 0, one token per row)
    or hidden-state rows (`hidden` holds n_rows x width values of `wire_dtype`), where
    `tokens` is empty or names the same positions' tokens for the last stage's history.
    """

    session: str
    step_id: int
    start: int
    tokens: tuple[int, ...]
    hidden: bytes | None
    n_rows: int
    width: int
    wire_dtype: WireDtype
    guesses: tuple[int, ...] = ()
    """Guessed tokens under verification: the last len(guesses) rows."""
    keep_until: int | None = None
    """Before evaluating, each stage drops cached positions >= keep_until (rejected guesses)."""
    timings: tuple[StageTiming, ...] = ()
    sent_at_ns: int = 0
    one_by_one: bool = False
    """Every stage evaluates these rows one at a time, each in a llama_decode of its own
    (a replay's generated tokens, as they were first computed: app.session.replay_shapes); the
    last stage needs logits for the final row only. No guesses with it. Encoded as an
    optional tail of the STEP body, absent when False: plain STEPs keep their bytes."""


@dataclass(frozen=True)
class Tokens:
    """Last stage -> client: tokens chosen this step, and guesses for the next one."""

    session: str
    step_id: int
    tokens: tuple[int, ...]
    guesses: tuple[int, ...]
    n_accepted: int
    """How many of the step's guesses the model agreed with."""
    finished: bool
    timings: tuple[StageTiming, ...]
    logits_sample: bytes = b""
    """Optional diagnostics (tests compare logits); opaque to the wire."""
    looped: bool = False
    """The last stage sent the next step to the first stage itself (`Open.loop`): the
    client waits for its TOKENS and sends nothing."""
    guessed: int = 0
    """How many guesses the answered step carried, when the ring sent it (the client did
    not build it, so it does not know); 0 otherwise. With `looped`, an optional tail of
    two bytes, absent when both are unset."""


@dataclass(frozen=True)
class Close:
    session: str
    reason: str


@dataclass(frozen=True)
class Error:
    """A refusal sent to the peer; `session` is empty for connection-level errors."""

    session: str
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Ping:
    nonce: int


@dataclass(frozen=True)
class Pong:
    nonce: int


# The handshake (net.protocol): HELLO -> CHALLENGE -> PROOF -> WELCOME, before any other frame.


@dataclass(frozen=True)
class Hello:
    """Initiator, first frame: asks the acceptor for a challenge, and says what it speaks.

    `protocol` and `release` are an optional tail, absent at protocol 1: peers before the
    version exchange sent an empty HELLO and refuse one with a body."""

    protocol: int = 1
    """net.wire.layout.PROTOCOL_VERSION of the initiator (1: it did not say)."""
    release: str = ""
    """Its package version, e.g. "0.2.0", for messages ("": not said)."""


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    """Fresh random bytes the initiator must sign (MIN_NONCE..MAX_NONCE of them)."""


@dataclass(frozen=True)
class Proof:
    data: bytes
    """The initiator's certificate and signature, encoded by net.auth; opaque here."""


@dataclass(frozen=True)
class Welcome:
    node_id: str
    """The identity the acceptor verified, echoed so both sides agree on it."""
    protocol: int = 1
    """The acceptor's PROTOCOL_VERSION; with `release`, an optional tail sent only to an
    initiator whose HELLO had one (older initiators refuse a WELCOME with a tail)."""
    release: str = ""


Frame = Open | Step | Tokens | Close | Error | Ping | Pong | Hello | Challenge | Proof | Welcome
