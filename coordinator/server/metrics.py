"""Prometheus text exposition of the swarm's state (no client library needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.server.service import Coordinator


def _line(name: str, value: float, **labels: str) -> str:
    if labels:
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {value}"
    return f"{name} {value}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(coord: Coordinator) -> str:
    nodes = coord.nodes()
    plan = coord.current_plan
    out = [
        "# HELP sangama_nodes Nodes known to the coordinator, by role and health.",
        "# TYPE sangama_nodes gauge",
    ]
    counts: dict[tuple[str, str], int] = {}
    for n in nodes:
        key = (n.role, coord.health(n))
        counts[key] = counts.get(key, 0) + 1
    for (role, health), count in sorted(counts.items()):
        out.append(_line("sangama_nodes", count, role=role, health=health))
    out += [
        "# HELP sangama_plan_stages Stages in the current plan (0 when there is none).",
        "# TYPE sangama_plan_stages gauge",
        _line("sangama_plan_stages", 0 if plan is None else len(plan.stages)),
        "# HELP sangama_plan_spares Healthy workers kept out of the chain as spares.",
        "# TYPE sangama_plan_spares gauge",
        _line("sangama_plan_spares", 0 if plan is None else len(plan.spares)),
        "# HELP sangama_node_capacity_bytes Memory a node offers (capped VRAM).",
        "# TYPE sangama_node_capacity_bytes gauge",
    ]
    for n in nodes:
        out.append(_line("sangama_node_capacity_bytes", n.capacity_bytes, node=n.node_id))
    out += [
        "# HELP sangama_stage_compute_ms Median compute per step reported by each stage.",
        "# TYPE sangama_stage_compute_ms gauge",
    ]
    for n in nodes:
        if "compute_ms" in n.stats:
            out.append(
                _line("sangama_stage_compute_ms", float(n.stats["compute_ms"]), node=n.node_id)
            )
    tokens = sum(t for _, t in coord.throughput(minutes=1))
    out += [
        "# HELP sangama_tokens_last_minute Tokens generated in the last minute.",
        "# TYPE sangama_tokens_last_minute gauge",
        _line("sangama_tokens_last_minute", tokens),
    ]
    return "\n".join(out) + "\n"
