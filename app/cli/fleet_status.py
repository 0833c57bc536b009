"""`sangama status --coordinator URL`: the swarm as its operator sees it, read from the
coordinator's HTTP API with the admin token: the chain, and the tokens/s it should
deliver alone and with many requests at once (coordinator/server/prediction.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import requests

from core.types import format_layers

ADMIN_TOKEN_FILE = "admin-token"  # as coordinator/server/serve.py writes it
SWARM_PATH = "/api/v1/swarm"


class FleetStatusError(Exception):
    """The coordinator could not be asked, or answered something unreadable."""


def fetch_swarm(base_url: str, token: str, ca_file: Path | None, timeout: float = 15.0) -> Any:
    """GET the swarm view as the operator (bearer token), TLS checked against the swarm CA."""
    verify: str | bool = str(ca_file) if ca_file is not None else True
    try:
        r = requests.get(
            f"{base_url.rstrip('/')}{SWARM_PATH}",
            headers={"Authorization": f"Bearer {token}"},
            verify=verify,
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise FleetStatusError(f"cannot reach {base_url}: {exc}") from exc
    if r.status_code != 200:
        raise FleetStatusError(f"{base_url} answered {r.status_code}: {r.text[:200]}")
    try:
        return r.json()
    except ValueError as exc:
        raise FleetStatusError(f"{base_url} answered something other than JSON") from exc


def _rate(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def answer_line(answer: Any) -> str:
    """Whether the swarm can answer, as the coordinator's last end-to-end probe found
    (api_models.AnswerOut); '' before the first probe or from a coordinator without it."""
    if not isinstance(answer, dict) or answer.get("can_answer") is None:
        return ""
    if answer["can_answer"]:
        return f"the swarm can answer (two tokens in {answer['answer_ms']:.0f} ms)"
    since = time.strftime("%H:%M:%S", time.localtime(float(answer["since"])))
    return f"the swarm cannot answer since {since}, because {answer['reason']}"


def describe(swarm: Any) -> list[str]:
    """The lines `sangama status` prints for a swarm view (api_models.SwarmOut)."""
    try:
        nodes = swarm["nodes"]
        healthy = sum(1 for n in nodes if n["health"] == "healthy")
        chain = " -> ".join(
            f"{s['node_id']} ({format_layers(*s['layers'])})" for s in swarm["plan"]
        )
        stages, s_, n_ = (
            len(swarm["plan"]),
            "s" * (len(swarm["plan"]) != 1),
            "s" * (len(nodes) != 1),
        )
        lines = [
            f"swarm       model {swarm['model']}, {stages} stage{s_}, "
            f"{len(nodes)} node{n_} ({healthy} healthy)",
            f"plan        {chain or 'none: ' + str(swarm.get('plan_error') or 'no stage placed')}",
        ]
        answer = answer_line(swarm.get("answer"))
        if answer:
            lines.append(f"answer      {answer}")
        p = swarm.get("prediction")
        note = swarm.get("prediction_note") or ""
        if p is None:
            lines.append(f"predicted   none yet: {note or 'no plan'}")
            return lines
        slow = f"; slowest stage {p['slowest_node']}" if p["slowest_node"] else ""
        lines.append(
            f"predicted   one request {_rate(p['one_request_tokens_per_s'])} tokens/s "
            f"(trip {p['trip_ms']:.1f} ms = compute {p['compute_ms']:.1f} + links "
            f"{p['links_ms']:.1f} + hops {p['hops_ms']:.1f}{slow})"
        )
        peak = p["peak"]
        lines.append(
            f"            at most {_rate(peak['tokens_per_s'])} tokens/s in all, at "
            f"{peak['requests']} requests (admission limit {p['admission_limit']})"
        )
        lines.append("            requests  total tok/s  each tok/s  round ms  rows/step  bound")
        for lv in p["levels"]:
            lines.append(
                f"            {lv['requests']:8d}  {_rate(lv['tokens_per_s']):>11}  "
                f"{_rate(lv['per_request_tokens_per_s']):>10}  {lv['round_ms']:8.1f}  "
                f"{lv['rows_per_step']:9d}  {lv['bound']}"
            )
        if note:
            lines.append(f"note        {note}")
        return lines
    except (KeyError, TypeError, IndexError) as exc:
        raise FleetStatusError(f"an unreadable swarm view ({exc!r})") from exc


def run_fleet_status(args: argparse.Namespace, default_data: Path) -> int:
    """The operator's `sangama status`: the chain and its prediction, or them as JSON.
    `default_data`: the coordinator's data directory when --data is not given."""
    data: Path = args.data or default_data
    token_file: Path = args.token_file or data / ADMIN_TOKEN_FILE
    ca_file: Path | None = args.ca or data / "ca" / "ca.pem"
    if ca_file is not None and not ca_file.exists():
        ca_file = None  # a coordinator behind a publicly trusted certificate
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        print(f"sangama status: error: cannot read the admin token: {exc}")
        return 2
    try:
        swarm = fetch_swarm(args.coordinator, token, ca_file)
        if args.json:
            keys = ("model", "plan", "plan_error", "answer", "prediction", "prediction_note")
            print(json.dumps({k: swarm.get(k) for k in keys}, indent=1))
            return 0
        for line in describe(swarm):
            print(line)
    except FleetStatusError as exc:
        print(f"sangama status: error: {exc}")
        return 1
    return 0
