"""core.gguf_reader: the fast reader reads exactly what gguf-py's own reader reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from core.gguf_reader import _PlainViewReader, open_gguf
from core.gguf_slices import read_facts
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A vocabulary of 3000 strings, so the string array is read thousands of times.
    return write_tiny_model(tmp_path_factory.mktemp("gguf") / "t.gguf", n_vocab=3000)


def test_same_fields_tensors_and_bytes(tiny: Path) -> None:
    fast, stock = open_gguf(tiny), GGUFReader(str(tiny))
    assert isinstance(fast, _PlainViewReader)
    assert list(fast.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        other = fast.fields[name]
        assert other.types == field.types and other.data == field.data
        assert other.offset == field.offset
        assert all(
            np.array_equal(a, b) and a.dtype == b.dtype and a.shape == b.shape
            for a, b in zip(other.parts, field.parts, strict=True)
        )
    assert [t.name for t in fast.tensors] == [t.name for t in stock.tensors]
    for a, b in zip(fast.tensors, stock.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape)
        assert a.data_offset == b.data_offset and np.array_equal(a.data, b.data)
    assert read_facts(fast) == read_facts(stock)


def test_a_file_that_is_not_gguf_is_refused_as_gguf_py_refuses_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="magic"):
        open_gguf(bad)
