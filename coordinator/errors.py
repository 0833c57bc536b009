"""Typed errors of the `coordinator` package; callers catch `CoordinatorError` or a subclass."""

from __future__ import annotations

from dataclasses import dataclass


class CoordinatorError(Exception):
    """Base of every error raised on purpose by `coordinator`."""


class MalformedAnswer(CoordinatorError):
    """A coordinator's answer does not have the shape coordinator.contract describes."""


class UnsafeName(MalformedAnswer, ValueError):
    """A name from a coordinator (a model, a node id) that is not one safe path component:
    it would reach outside the folder it names, or is not portable across systems."""


class AccessDenied(CoordinatorError):
    """Missing or wrong credentials for this request."""


class NotFound(CoordinatorError):
    """No such invite, node, model or route (HTTP 404)."""


class JoinRefused(CoordinatorError):
    """A join or renewal whose signing request the coordinator cannot use."""


class ModelNotHostable(CoordinatorError):
    """The model the coordinator was started with (--model) cannot be served: no such
    model, not a whole GGUF, an architecture not checked for exact cuts, a folder without
    pieces. Raised before the database, the CA or any file is created."""


class PlacementError(CoordinatorError):
    """No valid chain of stages can be formed from the given nodes."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


@dataclass(frozen=True)
class MemoryShortfall:
    """Why a fleet cannot hold a model, in bytes, for a UI to show or a test to check."""

    needed_bytes: int
    """At least this much across the whole chain: weights, KV cache, per-process overhead."""
    available_bytes: int
    """Capacity of all healthy nodes together."""
    largest_piece_bytes: int
    """The smallest stage that can hold the hardest layer (with its first/last extras)."""
    largest_piece_layer: int
    """Which layer that is (the last one, when the head and an MTP layer ride on it)."""
    largest_node_bytes: int
    """Capacity of the biggest healthy node (0 without any)."""
    healthy_nodes: int

    @property
    def total_short(self) -> bool:
        return self.needed_bytes > self.available_bytes

    @property
    def piece_too_big(self) -> bool:
        return self.largest_piece_bytes > self.largest_node_bytes

    def explain(self) -> str:
        if self.healthy_nodes == 0:
            return (
                f"not enough memory: there are no healthy nodes; the model needs at least "
                f"{_gb(self.needed_bytes)}"
            )
        parts: list[str] = []
        if self.total_short:
            parts.append(
                f"the model needs at least {_gb(self.needed_bytes)} in total (weights, KV cache "
                f"for the planned sessions, per-process overhead) but the {self.healthy_nodes} "
                f"healthy nodes offer {_gb(self.available_bytes)}; about "
                f"{_gb(self.needed_bytes - self.available_bytes)} more is needed"
            )
        if self.piece_too_big:
            parts.append(
                f"layer {self.largest_piece_layer} cannot be split and its stage needs at least "
                f"{_gb(self.largest_piece_bytes)}, but the largest healthy node offers "
                f"{_gb(self.largest_node_bytes)}"
            )
        if not parts:
            # Both totals fit: the loss is in rounding to whole layers per node.
            parts.append(
                f"in total there is enough ({_gb(self.needed_bytes)} needed, "
                f"{_gb(self.available_bytes)} offered) and the largest layer fits the largest "
                f"node, but stages hold whole layers and no chain of these "
                f"{self.healthy_nodes} nodes fits every stage; bigger nodes would help"
            )
        return "not enough memory: " + "; and ".join(parts)


class NotEnoughMemory(PlacementError):
    """The healthy nodes cannot hold the model; `report` says by how much, in bytes."""

    def __init__(self, report: MemoryShortfall) -> None:
        super().__init__(report.explain())
        self.report = report
