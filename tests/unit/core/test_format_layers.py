"""One notation for layer ranges wherever a person reads them: "layers 20-29" means 20
through 29; code keeps the half-open [start, stop)."""

from __future__ import annotations

import pytest

from core.types import LayerRange, format_layers

pytestmark = pytest.mark.unit


def test_a_range_reads_first_through_last() -> None:
    assert format_layers(20, 30) == "layers 20-29"
    assert format_layers(0, 2) == "layers 0-1"
    assert format_layers(7, 8) == "layer 7"


def test_a_layer_range_prints_the_same_way() -> None:
    assert str(LayerRange(20, 30)) == "layers 20-29"
    assert f"assigned {LayerRange(3, 4)}" == "assigned layer 3"
    assert len(LayerRange(20, 30)) == 10  # the text's last layer is stop - 1, not stop
