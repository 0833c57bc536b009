"""WorkerConfig files: every setting survives to_toml -> from_dict, and a file that names
a setting that does not exist or gives a wrong type is refused with ConfigError."""

from __future__ import annotations

import tomllib
from dataclasses import fields, replace
from pathlib import Path

import pytest

from app.config import Hop, WorkerConfig
from app.errors import ConfigError
from core.types import LayerRange

BASE = WorkerConfig(
    node_id="w1",
    listen=("127.0.0.1", 5000),
    model="pieces/gemma",
    layers=LayerRange(0, 6),
    credentials=Path("/creds"),
)


def _changed(cfg: WorkerConfig) -> WorkerConfig:
    """Every plain setting moved off its default, so a reader that forgets one fails."""
    changes: dict[str, object] = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "quic_library":
            changes[f.name] = "aioquic" if value == "qh3" else "qh3"
        elif isinstance(value, bool):
            changes[f.name] = not value
        elif f.name in ("mtp_guesses",):
            changes[f.name] = value - 1
        elif f.name == "mtp_p_min":
            changes[f.name] = 0.5
        elif f.name == "cpus":
            changes[f.name] = "0-5,7"
        elif isinstance(value, int | float) and f.name != "listen":
            changes[f.name] = value + 3
    return replace(cfg, next_hop=Hop("w2", ("::1", 5001)), **changes)  # type: ignore[arg-type]


def test_every_setting_round_trips_through_toml() -> None:
    cfg = _changed(BASE)
    assert cfg.upload_bytes_per_s == 3 and cfg.use_gpu is False  # the ones once dropped
    assert WorkerConfig.from_dict(tomllib.loads(cfg.to_toml())) == cfg


def test_defaults_round_trip_and_relative_credentials_resolve(tmp_path: Path) -> None:
    doc = tomllib.loads(replace(BASE, credentials=Path("creds")).to_toml())
    back = WorkerConfig.from_dict(doc, tmp_path)
    assert back == replace(BASE, credentials=tmp_path / "creds")


@pytest.mark.parametrize(
    "bad",
    [
        {"uplod_bytes_per_s": 10},  # a typo is not silently ignored
        {"use_gpu": "no"},  # a string is not a bool
        {"threads": "many"},
        {"threads": -1},  # __post_init__'s checks still apply (0 is auto)
    ],
)
def test_a_bad_setting_is_a_config_error(bad: dict[str, object]) -> None:
    doc = {**tomllib.loads(BASE.to_toml()), **bad}
    with pytest.raises(ConfigError):
        WorkerConfig.from_dict(doc)
