"""How fast a lying stage is caught, what the checks cost, and whether they ever accuse an
honest swarm: in a real coordinated swarm, at one spot-check rate, in one run.

Each swarm is tests/support/spot_swarm.py's: a coordinator (`--spot-check-rate RATE`,
`--max-chains 3`, answer probe off) and six worker processes in three chains of two
stages of a tiny 8-layer model, the small worker placed as a first stage.

1. For each liar kind (app/serving/chaos_lies.py: flip, noise, swap, zeros, on every
   step it sends on), `--runs` fresh swarms: greedy answers of `--tokens` tokens go
   through the liar's chain with the recovering client until the liar is caught,
   either by the next stage's row checks (app/serving/steps/row_checks.py: the client
   hears RowsRefused naming it and replays elsewhere) or by a spot check marking it
   faulty (coordinator `GET /api/v1/faults`). Reported: the tokens the swarm generated
   before the catch, counted after the set-up's one answer per chain (a verdict comes
   with a heartbeat, so the tokens of the check's round trips count too), which
   mechanism caught it, median and p95 over runs, and whether the answer finished at
   the catch and the next one equal the whole model's greedy tokens. Beside them, one
   long answer through the liar's chain is under way the whole time (a token every
   0.1 s until the catch): whether it was told which of its tokens the liar touched
   (`SuspectTokens` naming it; a spot check's catch) and ended equal to the whole
   model's answer.
2. An honest swarm answering continuously for `--honest-seconds` with checks on: the
   faults marked and rows refused (both must be 0), answers unequal to the whole
   model's, and the checks' overhead from the workers' heartbeat stats (the
   coordinator's `GET /api/v1/swarm`): rows recomputed by checkers against the rows the
   stages computed for answers, and the bytes of check records moved (sent by the
   checked stage, read by each recomputing one) against the hidden-state bytes the
   stages sent on. Only stages before the last are checked, here the first stages,
   whose records carry the token ids they took (4 bytes a row), not hidden rows.

    python -m bench.trust [--rate 0.01] [--runs 3] [--honest-seconds 60] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from app.client.generation import SuspectTokens
from app.client.route import fetch_route
from app.errors import ClientError
from app.serving.plan import HEARTBEAT_S
from tests.support.spot_swarm import (
    N_LAYER,
    PROMPT,
    Swarm,
    coordinator_args,
    faults,
    recovering_client,
    run_spot_swarm,
)
from tests.support.whole_model import whole_model_tokens

KINDS = ("flip", "noise", "swap", "zeros")
ROW_CHECKS, SPOT_CHECK = "row checks", "spot check"
NEXT_ANSWER_TRIES = 10
WATCHED_TOKENS = 960
"""The long answer under way at the catch (the coordinator's 1024 positions a session)."""
WATCH_PACE_S = 0.1


@dataclass
class Catch:
    kind: str
    caught_by: str = ""
    """ROW_CHECKS, SPOT_CHECK, or empty: not caught within the limits."""
    tokens_before: int = 0
    """Tokens the swarm generated before the catch (all of them when not caught)."""
    answers_before: int = 0
    answers_before_unequal: int = 0
    """Answers before the catch that differ from the whole model's (the lie showed)."""
    answers_failed: list[str] = field(default_factory=list)
    """Answers through the liar's chain that broke with no replay possible."""
    answer_at_catch_equal: bool | None = None
    """The answer in progress at the catch, finished by the recovering client."""
    next_answer_equal: bool | None = None
    """An answer on the coordinator's route after the catch."""
    next_route_avoids_liar: bool | None = None
    next_answer_refusals: list[str] = field(default_factory=list)
    """Tries of the next answer refused while the chains re-formed."""
    rows_refused: int = 0
    seconds: float = 0.0
    under_way_told: bool | None = None
    """The long answer under way at the catch heard SuspectTokens naming the liar."""
    under_way_taken_back: int = 0
    """Its tokens taken back and computed again."""
    under_way_equal: bool | None = None
    """It ended equal to the whole model's answer."""
    verdicts: dict[str, int] = field(default_factory=dict)
    """Checks the coordinator decided during the run, by verdict."""


@dataclass
class Honest:
    seconds: float
    answers: int = 0
    answers_unequal: int = 0
    failed: list[str] = field(default_factory=list)
    """Answers that broke with no replay possible (none expected)."""
    tokens: int = 0
    faults_marked: int = 0
    rows_refused: int = 0
    checks_decided: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    rows_recomputed: int = 0
    hidden_bytes_sent: int = 0
    check_bytes: int = 0

    @property
    def rows_overhead_pct(self) -> float:
        return 100.0 * self.rows_recomputed / max(self.rows, 1)

    @property
    def bytes_overhead_pct(self) -> float:
        return 100.0 * self.check_bytes / max(self.hidden_bytes_sent, 1)


def _stats_sum(swarm: Swarm) -> dict[str, int]:
    """The workers' counters, summed, as their latest heartbeats told the coordinator."""
    nodes = swarm.coord.admin.get("/api/v1/swarm")["nodes"]
    keys = ("rows", "rows_recomputed", "hidden_bytes_sent", "check_bytes", "rows_refused")
    return {k: sum(int(n.get("stats", {}).get(k) or 0) for n in nodes) for k in keys}


async def _answer(swarm: Swarm, route: Any, n: int, catch: Catch | None) -> tuple[list[int], bool]:
    """One answer with the recovering client; whether its replays name the liar as
    refused by the next stage's row checks (and, with `catch`, the tokens before)."""
    client = recovering_client(swarm.me, route)
    out: list[int] = []
    refused = False
    async with client:
        async for event in client.generate(PROMPT, n):
            if isinstance(event, SuspectTokens):
                del out[event.first :]
                continue
            if not refused and _refused(client.recoveries, swarm.small):
                refused = True
                if catch is not None:
                    catch.tokens_before += len(out)
            out.extend(event.tokens)
    if not refused and _refused(client.recoveries, swarm.small):
        refused = True
        if catch is not None:
            catch.tokens_before += len(out)
    return out, refused


def _refused(recoveries: Any, liar: str) -> bool:
    return any("rows refused" in r.failure and liar in r.dead for r in recoveries)


async def _under_way(swarm: Swarm, route: Any, catch: Catch, expected: list[int]) -> None:
    """The long answer through the liar's chain, paced until the catch."""
    client = recovering_client(swarm.me, route, faulty_poll_s=1.0)
    out: list[int] = []
    async with client:
        async for event in client.generate(PROMPT, WATCHED_TOKENS):
            if isinstance(event, SuspectTokens):
                catch.under_way_told = swarm.small in event.nodes
                catch.under_way_taken_back += event.count
                del out[event.first :]
                continue
            out.extend(event.tokens)
            if not catch.caught_by:
                catch.tokens_before += len(event.tokens)
                await asyncio.sleep(WATCH_PACE_S)
    catch.under_way_told = bool(catch.under_way_told)
    catch.under_way_equal = out == expected


async def _catch(swarm: Swarm, kind: str, a: argparse.Namespace, expected: list[int]) -> Catch:
    loop = asyncio.get_running_loop()
    catch, started = Catch(kind), time.monotonic()
    liar_route = next(r for chain, r in swarm.chains.items() if chain[0] == swarm.small)
    long_expected = await loop.run_in_executor(
        None, whole_model_tokens, swarm.model, N_LAYER, PROMPT, WATCHED_TOKENS
    )
    under_way = asyncio.ensure_future(_under_way(swarm, liar_route, catch, long_expected))
    while time.monotonic() - started < a.catch_seconds and catch.tokens_before < a.max_tokens:
        try:
            out, refused = await _answer(swarm, liar_route, a.tokens, catch)
        except ClientError as exc:  # the chain re-formed under it (the liar marked)
            catch.answers_failed.append(str(exc)[:200])
            out, refused = [], False
        if refused:
            catch.caught_by, catch.answer_at_catch_equal = ROW_CHECKS, out == expected
            break
        if out:
            catch.tokens_before += len(out)
            catch.answers_before += 1
            catch.answers_before_unequal += out != expected
        found = await loop.run_in_executor(None, faults, swarm.coord)
        if swarm.small in found["faulty"]:
            catch.caught_by = SPOT_CHECK
            break
    catch.seconds = time.monotonic() - started
    decided = await loop.run_in_executor(None, faults, swarm.coord)
    catch.verdicts = {str(k): int(v) for k, v in decided.get("counts", {}).items()}
    if not catch.caught_by:
        catch.caught_by = "-"  # not caught: the long answer goes on unpaced to its end
    try:
        await under_way
    except ClientError as exc:
        catch.answers_failed.append(f"the long answer: {str(exc)[:200]}")
    if catch.caught_by == "-":
        catch.caught_by = ""
    if catch.caught_by:
        await _next_answer(swarm, a, expected, catch)
    await asyncio.sleep(HEARTBEAT_S + 0.5)  # the refusals reach the coordinator
    catch.rows_refused = (await loop.run_in_executor(None, _stats_sum, swarm))["rows_refused"]
    return catch


async def _next_answer(
    swarm: Swarm, a: argparse.Namespace, expected: list[int], catch: Catch
) -> None:
    """An answer on the coordinator's route after the catch. A liar marked faulty leaves
    the plan, and the chains re-form: until the new last stages know the client, an
    answer is refused (BAD_VALUE); those tries are counted and it is asked again."""
    loop = asyncio.get_running_loop()
    for _ in range(NEXT_ANSWER_TRIES):
        route, _ = await loop.run_in_executor(None, fetch_route, swarm.me)
        try:
            out, _ = await _answer(swarm, route, a.tokens, None)
        except ClientError as exc:
            catch.next_answer_refusals.append(str(exc)[:200])
            await asyncio.sleep(HEARTBEAT_S)
            continue
        catch.next_route_avoids_liar = all(s.node_id != swarm.small for s in route.stages)
        catch.next_answer_equal = out == expected
        return


async def _honest(swarm: Swarm, a: argparse.Namespace, expected: list[int]) -> Honest:
    loop = asyncio.get_running_loop()
    report, started = Honest(seconds=a.honest_seconds), time.monotonic()
    chains = list(swarm.chains.values())
    while time.monotonic() - started < a.honest_seconds:
        route = chains[(report.answers + len(report.failed)) % len(chains)]
        try:
            out, _ = await _answer(swarm, route, a.tokens, None)
        except ClientError as exc:
            report.failed.append(str(exc)[:200])
            continue
        report.answers += 1
        report.tokens += len(out)
        report.answers_unequal += out != expected
    await asyncio.sleep(2 * HEARTBEAT_S + 0.5)  # every worker's last counters reported
    found = await loop.run_in_executor(None, faults, swarm.coord)
    stats = await loop.run_in_executor(None, _stats_sum, swarm)
    report.faults_marked = len(found["faulty"])
    report.checks_decided = sum(int(v) for v in found.get("counts", {}).values())
    for r in found["recent"]:
        report.verdicts[r["verdict"]] = report.verdicts.get(r["verdict"], 0) + 1
    report.rows_refused = stats["rows_refused"]
    report.rows, report.rows_recomputed = stats["rows"], stats["rows_recomputed"]
    report.hidden_bytes_sent, report.check_bytes = stats["hidden_bytes_sent"], stats["check_bytes"]
    return report


def _in_swarm(lie: dict[str, str] | None, a: argparse.Namespace, job: Any) -> Any:
    """`job(swarm, expected)` in a fresh swarm; its result."""
    result: list[Any] = []

    async def scenario(swarm: Swarm) -> None:
        loop = asyncio.get_running_loop()
        expected = await loop.run_in_executor(
            None, whole_model_tokens, swarm.model, N_LAYER, PROMPT, a.tokens
        )
        result.append(await job(swarm, expected))

    with TemporaryDirectory(prefix="sangama-trust-") as tmp:
        run_spot_swarm(Path(tmp), lie, scenario, coordinator_args(a.rate))
    return result[0]


def _p95(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _summary(catches: list[Catch]) -> dict[str, Any]:
    caught = [c for c in catches if c.caught_by]
    steps = [c.tokens_before for c in caught]
    by: dict[str, int] = {}
    for c in caught:
        by[c.caught_by] = by.get(c.caught_by, 0) + 1
    return {
        "runs": len(catches),
        "caught": len(caught),
        "caught_by": by,
        "tokens_median": statistics.median(steps) if steps else None,
        "tokens_p95": _p95(steps) if steps else None,
        "answers_after_equal": all(
            c.answer_at_catch_equal is not False
            and c.next_answer_equal is True
            and c.under_way_equal is True
            for c in caught
        )
        if caught
        else None,
        "under_way_told": sum(bool(c.under_way_told) for c in caught),
    }


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "NO"


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if sys.platform == "linux" else "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--rate", type=float, default=0.01, help="spot checks' share of steps")
    ap.add_argument("--runs", type=int, default=3, help="fresh swarms per liar kind")
    ap.add_argument("--honest-seconds", type=float, default=60.0, help="600 for acceptance")
    ap.add_argument("--tokens", type=int, default=8, help="tokens an answer")
    ap.add_argument("--catch-seconds", type=float, default=240.0, help="a run's limit")
    ap.add_argument("--max-tokens", type=int, default=20000, help="a run's limit")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--quick", action="store_true", help="one run per kind")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    runs = 1 if a.quick else a.runs
    kinds = [k for k in a.kinds.split(",") if k]
    load_before = _load()
    catches: dict[str, list[Catch]] = {k: [] for k in kinds}
    for i in range(runs):
        for kind in kinds:  # kinds alternate: no kind gets all the quiet minutes
            lie = {"SANGAMA_TEST_LIE": kind, "SANGAMA_TEST_LIE_SEED": str(i)}
            catch: Catch = _in_swarm(lie, a, lambda s, e, k=kind: _catch(s, k, a, e))
            catches[kind].append(catch)
            print(f"  {kind} run {i + 1}: {catch.caught_by or 'not caught'}", file=sys.stderr)
    honest: Honest = _in_swarm(None, a, lambda s, e: _honest(s, a, e))
    load_after = _load()
    if a.json:
        print(
            json.dumps(
                {
                    "rate": a.rate,
                    "load": [load_before, load_after],
                    "kinds": {
                        k: {**_summary(v), "runs": [asdict(c) for c in v]}
                        for k, v in catches.items()
                    },
                    "honest": {
                        **asdict(honest),
                        "rows_overhead_pct": honest.rows_overhead_pct,
                        "bytes_overhead_pct": honest.bytes_overhead_pct,
                    },
                }
            )
        )
        return 0
    print(f"spot-check rate {a.rate}, {runs} run(s) a kind, {a.tokens}-token answers")
    print(f"load average {load_before} before, {load_after} after")
    print()
    print(
        "| liar | caught | by row checks | by spot check | tokens before, median | p95 "
        "| answer under way told | answers after equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind, found in catches.items():
        s = _summary(found)
        print(
            f"| {kind} | {s['caught']}/{s['runs']} | {s['caught_by'].get(ROW_CHECKS, 0)} "
            f"| {s['caught_by'].get(SPOT_CHECK, 0)} | {s['tokens_median']} | {s['tokens_p95']} "
            f"| {s['under_way_told']}/{s['caught']} | {_yes(s['answers_after_equal'])} |"
        )
    h = honest
    print()
    print(
        f"honest swarm, {h.seconds:.0f} s (acceptance: 600 s): {h.answers} answers, "
        f"{h.tokens} tokens, {h.answers_unequal} unequal to the whole model's, "
        f"{len(h.failed)} failed"
    )
    print(
        f"  faults marked {h.faults_marked}, rows refused {h.rows_refused} (both must be 0); "
        f"checks decided {h.checks_decided}, recent verdicts {h.verdicts}"
    )
    print(
        f"  rows recomputed by checkers {h.rows_recomputed} / rows for answers {h.rows} "
        f"= {h.rows_overhead_pct:.2f} %"
    )
    print(
        f"  check record bytes {h.check_bytes} / hidden-state bytes sent "
        f"{h.hidden_bytes_sent} = {h.bytes_overhead_pct:.2f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
