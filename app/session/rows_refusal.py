"""A stage's refusal of hidden-state rows that cannot be a model's, as the client reads it.

A stage that gets rows failing its per-step checks (app.serving.steps.row_checks: not
finite, an all-zero row, a norm no model makes) refuses the step with STAGE_ERROR. The
check and the layer the rows arrived at ride at the head of the ERROR's message
(`[rows-refused check=NAME from-layer=N] why`), as OVERLOADED's hint does
(net.protocol.overloaded): the frame stays as it is, so a peer of any release decodes
it, and the stages up the chain relay the message unchanged. The client reads the head
back (`rows_refusal`) and suspects the stage whose layers end at N: the one that sent
the rows. No IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEAD = re.compile(r"^\[rows-refused check=([a-z][a-z-]{0,31}) from-layer=(\d{1,6})\] ?")


@dataclass(frozen=True)
class RowsRefusal:
    """Which check refused rows, and the first layer of the stage they were sent to."""

    check: str
    from_layer: int


def rows_refused_message(refusal: RowsRefusal, why: str) -> str:
    """The ERROR message that carries `refusal`, then `why` for people."""
    if not _HEAD.match(f"[rows-refused check={refusal.check} from-layer={refusal.from_layer}]"):
        raise ValueError(f"not a check name and layer: {refusal}")
    return f"[rows-refused check={refusal.check} from-layer={refusal.from_layer}] {why}"


def rows_refusal(message: str) -> tuple[RowsRefusal | None, str]:
    """The refusal an ERROR's message carries and the message without its head;
    (None, message) for any other message."""
    m = _HEAD.match(message)
    if m is None:
        return None, message
    return RowsRefusal(m.group(1), int(m.group(2))), message[m.end() :]
