"""Which advertised addresses become ICE candidates (app.links.paths.advertised_candidates)."""

from __future__ import annotations

import pytest

from app.links.paths import advertised_candidates, path_kind
from net.ice.paths import IceConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("advertise", "expected"),
    [
        ("198.51.100.7:4433", (("198.51.100.7", 0),)),
        ("[2001:db8::5]:4433", (("2001:db8::5", 0),)),
        ("10.0.0.4:9000", (("10.0.0.4", 0),)),
        (None, ()),
        ("", ()),
        ("node.example.org:4433", ()),  # a name is dialled as it is, not offered to ICE
        ("127.0.0.1:4433", ()),
        ("0.0.0.0:4433", ()),
        ("169.254.1.1:4433", ()),
    ],
)
def test_advertised_candidates(advertise: str | None, expected: tuple[object, ...]) -> None:
    assert advertised_candidates(advertise) == expected


def test_advertised_candidates_are_valid_ice_config() -> None:
    config = IceConfig(extra_host_candidates=advertised_candidates("198.51.100.7:4433"))
    assert config.extra_host_candidates == (("198.51.100.7", 0),)


def test_path_kind_without_ice_is_direct() -> None:
    assert path_kind(None) == "direct"
