"""Which new sessions a stage admits: a ledger of what each session costs, no IO.

A stage's KV cache is one pool of `n_ctx` positions (llama.cpp's unified cache,
allocated when the context is created) shared by up to `n_seq_max` sessions, and holds
K and V only for the stage's own layers. A session costs the positions it may fill:
its prompt plus its token limit (plus room for guessed tokens under verification), so
a session admitted here can never run out of cells half-way and disturb the others by
making a shared `llama_decode` fail. The ledger admits while the reserved positions fit
the pool (and the memory cap, when one is set below the pool) and a sequence slot is
free; otherwise it refuses with a `Refusal` that tells the client when to retry here
and whether another route is the better bet.

Bytes are what the operator sees and what placement plans with (heartbeats carry
`Capacity`); positions are what the cache counts, so both are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LLAMA_MAX_SEQ",
    "AdmissionLedger",
    "AdmissionPolicy",
    "Capacity",
    "Refusal",
    "kv_bytes_per_token",
]

LLAMA_MAX_SEQ = 256
"""llama.cpp's limit on sequence ids in one context (LLAMA_MAX_SEQ)."""


def kv_bytes_per_token(per_layer: Sequence[int]) -> int:
    """K and V of one cached position over the stage's own layers (core.offload sizes)."""
    return sum(max(0, b) for b in per_layer)


@dataclass(frozen=True)
class AdmissionPolicy:
    n_ctx: int
    """Positions in the stage's KV pool (all sessions together)."""
    max_sessions: int
    """Sequence slots of the context (n_seq_max, at most LLAMA_MAX_SEQ)."""
    kv_bytes_per_token: int = 0
    """What one position costs over this stage's layers; 0 when unknown (fakes)."""
    memory_cap_bytes: int = 0
    """The most KV memory sessions may take; 0: the whole pool."""
    guess_slack: int = 16
    """Positions reserved beyond prompt + max_tokens for guessed rows under verification
    (they are rolled back, but occupy cells while the step runs)."""
    retry_after_ms: int = 1000
    """The hint sent with a refusal while sessions run here (one ends, a slot frees)."""
    session_ctx: int = 0
    """Positions one session may hold (reproducible mode: its own stream's share of the
    pool); 0: the whole pool."""

    def __post_init__(self) -> None:
        if self.n_ctx < 1:
            raise ValueError("n_ctx must be >= 1")
        if not 1 <= self.max_sessions <= LLAMA_MAX_SEQ:
            raise ValueError(f"max_sessions must be in 1..{LLAMA_MAX_SEQ} (llama.cpp's limit)")
        sizes = (self.kv_bytes_per_token, self.memory_cap_bytes, self.guess_slack, self.session_ctx)
        if min(sizes) < 0:
            raise ValueError("sizes must be >= 0")
        if self.retry_after_ms < 1:
            raise ValueError("retry_after_ms must be >= 1")

    @property
    def budget_tokens(self) -> int:
        """Positions sessions may reserve: the pool, or fewer under a memory cap."""
        if self.memory_cap_bytes and self.kv_bytes_per_token:
            return min(self.n_ctx, self.memory_cap_bytes // self.kv_bytes_per_token)
        return self.n_ctx

    def session_tokens(self, prompt_len: int, max_tokens: int) -> int:
        """Positions one session reserves."""
        return max(1, prompt_len) + max(0, max_tokens) + self.guess_slack


@dataclass(frozen=True)
class Refusal:
    reason: str
    retry_after_ms: int
    """0: never here (the session alone is larger than this stage's whole budget)."""
    try_another_route: bool


@dataclass(frozen=True)
class Capacity:
    """What a stage can still take; heartbeats carry it to placement and the operator."""

    sessions: int
    max_sessions: int
    kv_bytes_per_token: int
    budget_bytes: int
    reserved_bytes: int
    budget_tokens: int
    reserved_tokens: int

    @property
    def free_bytes(self) -> int:
        return max(0, self.budget_bytes - self.reserved_bytes)

    @property
    def bytes_per_session(self) -> int:
        """Mean KV reserved per running session (0 with none running)."""
        return self.reserved_bytes // self.sessions if self.sessions else 0


class AdmissionLedger:
    """Sessions admitted on one stage and the positions each reserved."""

    def __init__(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        self._reserved: dict[str, int] = {}
        self._total = 0

    def __contains__(self, session: object) -> bool:
        return session in self._reserved

    def __len__(self) -> int:
        return len(self._reserved)

    def admit(self, session: str, prompt_len: int, max_tokens: int) -> Refusal | None:
        """Reserve the session's positions, or say why not (and reserve nothing)."""
        p = self.policy
        if session in self._reserved:
            return None  # a resume: it holds its reservation already
        budget = p.budget_tokens
        most = min(budget, p.session_ctx) if p.session_ctx else budget
        if prompt_len + 1 > most:
            return Refusal(
                f"a prompt of {prompt_len} positions exceeds the {most} a session may hold"
                f" here ({self._bytes(most)} of KV)",
                retry_after_ms=0,
                try_another_route=True,
            )
        # A session never holds more than that (the stage refuses positions past it with
        # a context-full error), so that is the most it reserves.
        need = min(p.session_tokens(prompt_len, max_tokens), most)
        if len(self._reserved) >= p.max_sessions:
            return Refusal(
                f"all {p.max_sessions} sessions of this stage are in use",
                p.retry_after_ms,
                try_another_route=True,
            )
        if self._total + need > budget:
            return Refusal(
                f"KV memory full: {self._bytes(self._total)} of {self._bytes(budget)} reserved"
                f" by {len(self._reserved)} sessions, this one needs {self._bytes(need)}",
                p.retry_after_ms,
                try_another_route=True,
            )
        self._reserved[session] = need
        self._total += need
        return None

    def release(self, session: str) -> None:
        self._total -= self._reserved.pop(session, 0)

    def capacity(self) -> Capacity:
        p = self.policy
        per = p.kv_bytes_per_token
        return Capacity(
            sessions=len(self._reserved),
            max_sessions=p.max_sessions,
            kv_bytes_per_token=per,
            budget_bytes=p.budget_tokens * per,
            reserved_bytes=self._total * per,
            budget_tokens=p.budget_tokens,
            reserved_tokens=self._total,
        )

    def _bytes(self, tokens: int) -> str:
        per = self.policy.kv_bytes_per_token
        if not per:
            return f"{tokens} positions"
        return f"{tokens * per / 1024**2:.1f} MiB"
