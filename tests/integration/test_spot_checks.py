"""Spot checks in a real swarm: a coordinator and six workers in three chains of two
stages (8 layers, 4 + 4), every step sampled (--spot-check-rate 1). One first stage
lies (SANGAMA_TEST_LIE=noise, app/serving/chaos_lies.py: small noise on every row it
sends on, which the next stage's row checks let through, as they would a plausible
lie). Answers go through every chain; the liar's record
of a session is recomputed by the other two first stages, which agree with each other
and not with it: it is marked faulty with the evidence, leaves the plan and every route,
and its certificate is not renewed until the operator clears it. The honest stages'
checks find them honest, and no one else is marked. An answer under way through the liar
when it is caught is told which of its tokens the liar touched, and ends as an honest
chain's answer. In a swarm where no one lies, every first stage is checked and found
honest. ~30-60 s each (6 worker processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.client.connect import avoiding_source
from app.client.generation import SuspectTokens, apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.identity import Identity
from coordinator.client.session import CoordinatorRefused
from tests.support.spot_swarm import PROMPT, Scenario, Swarm, ask, run_spot_swarm
from tests.support.spot_swarm import faults as _faults
from tests.support.spot_swarm import routes as _routes
from tests.support.spot_swarm import until as _until

pytestmark = pytest.mark.integration

LONG = 48
"""Tokens of the answer that is under way when the liar is caught."""


def _run(tmp_path: Path, lie: bool, scenario: Scenario) -> None:
    """Every step sampled (--spot-check-rate 1); the small worker adds noise or not."""
    run_spot_swarm(tmp_path, {"SANGAMA_TEST_LIE": "noise"} if lie else None, scenario)


def test_a_stage_that_lies_is_caught_and_leaves_the_routes(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> None:
        loop = asyncio.get_running_loop()
        coord, liar_id = swarm.coord, swarm.small
        firsts = {c[0] for c in swarm.chains}
        through_liar = next(r for c, r in swarm.chains.items() if c[0] == liar_id)
        honest = next(r for c, r in swarm.chains.items() if c[0] != liar_id)

        # An answer through the liar, paused after its first tokens until it is caught.
        policy = RecoveryPolicy(step_timeout_s=20.0, faulty_poll_s=0.2)
        client = RecoveringClient(
            swarm.me.credentials(), through_liar, avoiding_source(swarm.me), policy
        )
        await client.connect()
        answer = client.generate(PROMPT, LONG)
        events = [await anext(answer) for _ in range(3)]

        def caught() -> dict[str, Any] | None:
            faults = _faults(coord)
            return faults if liar_id in faults["faulty"] else None

        faults = await loop.run_in_executor(None, _until, "the liar caught", caught)
        # The next token starts the client's ask of the faulty nodes (in the background);
        # the one after it comes once the answer is in.
        events.append(await anext(answer))
        await asyncio.sleep(1.0)
        events += [e async for e in answer]
        await client.close()
        # It is told which of its tokens the liar touched (all: it computed the prompt)
        # and the answer goes on from there without it, ending as an honest chain's.
        taken = [e for e in events if isinstance(e, SuspectTokens)]
        assert len(taken) == 1 and taken[0].nodes == (liar_id,) and taken[0].first == 0
        assert taken[0].count >= 3
        tokens: list[int] = []
        for e in events:
            apply_event(tokens, e)
        assert tokens == await ask(swarm.me, honest, LONG)
        assert all(liar_id not in r for r in client.recoveries[-1].route)
        evidence = faults["faulty"][liar_id]
        assert evidence["verdict"] == "faulty" and evidence["node"] == liar_id
        assert {evidence["checker"], evidence["third"]} == firsts - {liar_id}
        assert evidence["checker_digest"] == evidence["third_digest"] != evidence["claimed"]
        start, stop = evidence["positions"]
        assert 0 <= start < stop and evidence["session"]
        assert set(faults["faulty"]) == {liar_id}  # no honest stage marked

        # Out of the plan and of every route at once; its certificate is held.
        routes = await loop.run_in_executor(None, _routes, swarm.me, 6)
        assert routes and all(liar_id not in c for c in routes)
        events = coord.admin.get("/api/v1/events")
        assert any(e["kind"] == "faulty" and e["node_id"] == liar_id for e in events)
        liar_identity = Identity.load(coord.data_dir.parent / "liar")
        with pytest.raises(CoordinatorRefused, match="faulty"):
            await loop.run_in_executor(
                None, liar_identity.client().renew, liar_identity.certified.private_key
            )

        # The honest first stages' own checks came out honest.
        def honest_checked() -> list[dict[str, Any]] | None:
            found = [r for r in _faults(coord)["recent"] if r["node"] in swarm.others]
            return found or None

        recent = await loop.run_in_executor(None, _until, "an honest check", honest_checked)
        assert all(r["verdict"] == "honest" for r in recent)

        # The operator clears it: placed again.
        coord.admin.delete(f"/api/v1/faults/{liar_id}")
        assert liar_id not in _faults(coord)["faulty"]

    _run(tmp_path, True, scenario)


def test_an_honest_swarm_marks_nobody(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> None:
        loop = asyncio.get_running_loop()
        firsts = {c[0] for c in swarm.chains}

        def all_checked() -> list[dict[str, Any]] | None:
            recent = _faults(swarm.coord)["recent"]
            return recent if {r["node"] for r in recent} >= firsts else None

        recent = await loop.run_in_executor(None, _until, "every first stage checked", all_checked)
        assert {r["verdict"] for r in recent} == {"honest"}
        assert all(r["checker"] in firsts - {r["node"]} for r in recent)
        assert _faults(swarm.coord)["faulty"] == {}
        assert len(await loop.run_in_executor(None, _routes, swarm.me, 6)) == 3

    _run(tmp_path, False, scenario)
