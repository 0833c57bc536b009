"""A serving stage's answers to spot checks (coordinator/spot_checks.py), the asks read
from its heartbeat answers: its record of a session's first steps, or another stage's
record of the same layers recomputed on its own engine. The IO beside the worker's
ledger (app/serving/rules/step_ledger.py) and recompute (app/serving/steps/recompute.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from app.serving.worker import StageWorker
from coordinator.client.session import CoordinatorClient
from coordinator.errors import CoordinatorError
from coordinator.spot_checks import RECORD, CheckAsk

log = logging.getLogger(__name__)


async def answer_asks(
    client: CoordinatorClient, worker: StageWorker, asks: Sequence[CheckAsk]
) -> None:
    """Answer each ask in turn; a failure is logged (the check then times out)."""
    for ask in asks:
        try:
            await answer_ask(client, worker, ask)
        except CoordinatorError as exc:
            log.warning("spot check %s: %s", ask.check_id, exc)


async def answer_ask(client: CoordinatorClient, worker: StageWorker, ask: CheckAsk) -> None:
    loop = asyncio.get_running_loop()
    body: dict[str, Any]
    if ask.kind == RECORD:
        record = worker.check_record(ask.session, ask.steps)
        if record is None:
            body = {"refused": f"no record of the first {ask.steps} steps of that session"}
        else:
            body = {"record": record.to_json()}
    else:
        record = await loop.run_in_executor(None, client.check_inputs, ask.check_id)
        digests = await worker.recompute(record, f"check-{ask.check_id}")
        body = digests.to_json()
        log.info(
            "spot check %s: recomputed %d steps%s",
            ask.check_id,
            len(digests.digests),
            f" (refused: {digests.refused})" if digests.refused else "",
        )
    await loop.run_in_executor(None, client.answer_check, ask.check_id, body)
