"""What a coordinator answers is untrusted on a volunteer's PC: names must be one safe path
component, and every contract message is checked like a wire frame (types, sizes, counts,
depth) before anything is made from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.pieces_cache import pieces_dir
from coordinator import contract as c
from coordinator.errors import CoordinatorError, MalformedAnswer, UnsafeName
from coordinator.names import MAX_NAME_CHARS, check_name, name_problem
from core.errors import SliceError
from core.manifest import Manifest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "name",
    [
        "default",
        "gemma-3-270m",
        "SmolLM2-135M-Instruct-Q4_1",
        "Meta-Llama-3.1-8B-Instruct.Q4_K_M",
        "SmolLM2 135M Instruct",
        "worker-3fa2c1",
        "a" * MAX_NAME_CHARS,
    ],
)
def test_model_names_people_use_pass(name: str) -> None:
    assert check_name(name) == name and name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../../.config/autostart",
        "..\\..\\AppData",
        "a/b",
        "/etc",
        "C:evil",
        "x\x00y",
        "line\nbreak",
        ".hidden",
        "-rf",
        "trailing.",
        "trailing ",
        "CON",
        "nul.txt",
        "com1",
        "a" * (MAX_NAME_CHARS + 1),
        "caf\u00e9",
        "\u2024\u2024",  # ONE DOT LEADER twice: looks like ".."
        3,
        None,
        ["default"],
    ],
)
def test_names_that_could_leave_their_folder_are_refused(name: object) -> None:
    with pytest.raises(UnsafeName):
        check_name(name, "model name")
    assert isinstance(UnsafeName("x"), CoordinatorError)


def test_a_malicious_model_name_makes_no_folder_outside_the_identity(tmp_path: Path) -> None:
    identity = tmp_path / "home" / ".config" / "sangama" / "node"
    identity.mkdir(parents=True)
    with pytest.raises(UnsafeName):
        target = pieces_dir(identity, "../../../.config/autostart")
        target.mkdir(parents=True)  # what the node did with the answer before
    assert not (tmp_path / "home" / ".config" / "autostart").exists()
    assert pieces_dir(identity, "default") == identity / "pieces" / "default"


def _assignment(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "default",
        "layers": [0, 9],
        "next_hop": {"node_id": "worker-b", "address": "10.0.0.2:7000"},
        "manifest_url": c.manifest_path("default"),
        "pieces_url": c.pieces_path("default"),
        "max_sessions": 8,
        "context_tokens": 256,
    }
    doc.update(changes)
    return doc


def test_a_valid_assignment_reads_back() -> None:
    got = c.Assignment.from_json(_assignment())
    assert got.model == "default" and got.layers == (0, 9) and got.next_hop is not None


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "../../.config/autostart"},
        {"model": {"name": "default"}},  # str() of it used to be the model name
        {"model": "x" * 10_000},
        {"layers": [0, 9, 12]},
        {"layers": [9, 3]},
        {"layers": ["0", "9"]},
        {"layers": [True, 9]},
        {"layers": [0, 10**30]},
        {"next_hop": {"node_id": "../peer", "address": "x"}},
        {"next_hop": ["worker-b", "10.0.0.2:7000"]},
        {"manifest_url": "@evil.example/x"},
        {"manifest_url": "//evil.example/x"},
        {"pieces_url": "/api/v1/models/../../etc"},
        {"max_sessions": "8"},
        {"max_sessions": 0},
        {"context_tokens": 1.5},
        {"context_tokens": 10**12},
    ],
)
def test_a_malformed_assignment_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(MalformedAnswer):
        c.Assignment.from_json(_assignment(**changes))
    with pytest.raises(MalformedAnswer):
        c.HeartbeatAnswer.from_json({"assignment": _assignment(**changes)})


def test_counts_and_sizes_are_bounded() -> None:
    stage = {"node_id": "worker-a", "address": "10.0.0.1:7000", "layers": [0, 1]}
    with pytest.raises(MalformedAnswer):
        c.RouteAnswer.from_json({"model": "default", "stages": [stage] * (c.MAX_STAGES + 1)})
    with pytest.raises(MalformedAnswer):
        c.RouteAnswer.from_json({"model": "../m", "stages": [stage]})
    with pytest.raises(MalformedAnswer):
        c.HeartbeatAnswer.from_json({"revoked_serials": ["1"] * (c.MAX_SERIALS + 1)})
    with pytest.raises(MalformedAnswer):
        c.HeartbeatAnswer.from_json({"revoked_serials": [12]})
    turn = {"host": "r", "port": 3478, "username": "u", "password": "p", "ttl_s": 60}
    with pytest.raises(MalformedAnswer):
        c.TurnAnswer.from_json({**turn, "uris": ["turn:r"] * (c.MAX_URIS + 1)})
    with pytest.raises(MalformedAnswer):
        c.TurnAnswer.from_json({**turn, "port": 70000, "uris": []})
    with pytest.raises(MalformedAnswer):
        c.JoinAnswer.from_json(
            {
                "node_id": "../x",
                "role": "worker",
                "certificate_pem": "C",
                "ca_certificate_pem": "CA",
                "token": "t",
                "expires_at": "2026-01-01T00:00:00+00:00",
            }
        )
    with pytest.raises(MalformedAnswer):
        c.CaAnswer.from_json({"certificate_pem": "x" * (c.MAX_PEM_CHARS + 1), "fingerprint": "f"})


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_signal_payload_has_bounded_depth_and_size() -> None:
    ok = {"sender": "worker-a", "kind": "offer", "link": "l1", "payload": _nested(3)}
    assert c.Signal.from_json(ok).payload == _nested(3)
    for payload in (
        _nested(c.MAX_PAYLOAD_DEPTH + 1),
        _nested(100_000),  # deeper than Python's recursion limit: still a typed error
        {"candidates": ["c"] * (c.MAX_PAYLOAD_ITEMS + 1)},
        {"x": "y" * 100_000},
        {"x": object()},
    ):
        with pytest.raises(MalformedAnswer):
            c.Signal.from_json({**ok, "payload": payload})
    with pytest.raises(MalformedAnswer):
        c.Signal.from_json({**ok, "sender": "../../x"})


def test_manifests_from_a_coordinator_fail_only_with_a_typed_error() -> None:
    for text in (
        "[]",
        "null",
        '"x"',
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"format": "sangama-manifest/1", "facts": []}),
        json.dumps({"format": "sangama-manifest/1", "facts": {}, "pieces": {}}),
    ):
        with pytest.raises(SliceError):
            Manifest.from_json(text)
