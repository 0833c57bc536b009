"""What a worker resends to its next stage over a new link so running sessions continue.

Sans-IO: the link shell records every frame it sends; after a lost path is replaced,
`to_resend()` gives, per live session, its OPEN and the STEPs the next stage may not have
seen. The next stage treats a repeated OPEN from the same upstream identity as a resume
and drops STEPs it has already taken (step ids only grow within a session).

Which STEPs are kept follows from how a client drives a session: it sends every prompt
chunk at once, then one decode step at a time, each only after the tokens of the step
before came back from the last stage. So a decode step proves that everything before it
passed every stage: the log keeps the prompt chunks until the first decode step, then
only the latest step. Memory stays at one step per session once decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from net import wire


@dataclass
class _Entry:
    open: wire.Open
    steps: list[wire.Step] = field(default_factory=list)


class ResendLog:
    def __init__(self) -> None:
        self._sessions: dict[str, _Entry] = {}

    @property
    def sessions(self) -> tuple[str, ...]:
        return tuple(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    def record(self, frame: wire.Frame) -> None:
        """Note a frame sent downstream (OPEN, STEP, CLOSE; others are not resent)."""
        if isinstance(frame, wire.Open):
            self._sessions[frame.session] = _Entry(frame)
        elif isinstance(frame, wire.Step):
            entry = self._sessions.get(frame.session)
            if entry is None:
                return  # no OPEN went this way: nothing the next stage could resume
            if frame.start >= entry.open.prompt_len:
                entry.steps.clear()  # a decode step: all earlier steps are through
            entry.steps.append(frame)
        elif isinstance(frame, wire.Close):
            self.forget(frame.session)

    def forget(self, session: str) -> None:
        """The session ended here (finished, failed): never resend it."""
        self._sessions.pop(session, None)

    def to_resend(self) -> list[wire.Frame]:
        """Frames for a fresh link: each session's OPEN, then its unconfirmed STEPs."""
        frames: list[wire.Frame] = []
        for entry in self._sessions.values():
            frames.append(entry.open)
            frames.extend(entry.steps)
        return frames

    def pending_bytes(self) -> int:
        """Hidden-state bytes held for resending (for status pages and tests)."""
        return sum(
            len(step.hidden or b"") for entry in self._sessions.values() for step in entry.steps
        )
