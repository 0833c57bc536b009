"""Facts and manifests from a GGUF header alone: Qwen3.5-397B-A17B at true sizes from a
header-only file, the same facts as the full reader on a real file, and hostile headers
refused with GgufHeaderError (never another exception, never a large allocation)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import PieceCorruptError, SliceError
from core.gguf_header import (
    NOT_COMPUTED,
    GgufHeader,
    GgufHeaderError,
    HeaderLimits,
    facts_from_header,
    manifest_from_header,
    parse_header,
    read_header,
    write_manifest_only,
)
from core.gguf_reader import open_gguf
from core.gguf_slices import read_facts
from core.manifest import Manifest, verify_piece
from core.model_sizes import recurrent_state_values
from core.types import LayerRange
from tests.support.qwen35_397b import QWEN35_397B, tensor_table, write_header_only_gguf
from tests.support.tiny_qwen35 import write_qwen35_model

pytestmark = pytest.mark.unit

GB = 10**9


@pytest.fixture(scope="module")
def qwen397(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_header_only_gguf(tmp_path_factory.mktemp("q397") / "qwen3.5-397b.gguf")


@pytest.fixture(scope="module")
def header397(qwen397: Path) -> GgufHeader:
    return read_header(qwen397)


# ------------------------------------------------------------------ the 397B model


def test_a_header_only_file_describes_the_whole_model(qwen397: Path, header397: GgufHeader) -> None:
    assert qwen397.stat().st_size < 200_000  # no data section at all
    assert header397.architecture == "qwen35moe"
    assert len(header397.tensors) == len(tensor_table())
    assert header397.data_offset >= qwen397.stat().st_size  # the data would start here
    assert 240 * GB < header397.data_bytes < 248 * GB  # trunk + MTP block + ends at Q4_K_M


def test_facts_of_qwen35_397b(header397: GgufHeader) -> None:
    f = facts_from_header(header397, "qwen3.5-397b")
    assert (f.n_layer, f.n_mtp_layers, f.n_embd, f.n_vocab) == (60, 1, 4096, 248_320)
    assert f.layer_kinds == tuple("full" if (i + 1) % 4 == 0 else "recurrent" for i in range(60))
    # Full attention: 2 KV heads x (256 + 256) dims x f16; recurrent layers hold none.
    assert f.kv_bytes_per_token_per_layer == tuple(
        2048 if k == "full" else 0 for k in f.layer_kinds
    )
    # Gated delta-net state, f32: conv (4 - 1) x (8192 + 2 x 16 x 128), SSM 128 x 8192.
    state = 4 * (3 * (64 * 128 + 2 * 16 * 128) + 128 * 64 * 128)
    assert state == 4_341_760
    assert f.recurrent_state_bytes_per_session_per_layer == tuple(
        state if k == "recurrent" else 0 for k in f.layer_kinds
    )
    assert f.mtp_kv_bytes_per_token == 2048
    assert not f.tied_output


def test_layer_sizes_match_the_seeds_figures(header397: GgufHeader) -> None:
    f = facts_from_header(header397)
    routed_4bit = 3 * 512 * 4096 * 1024 // 256 * 144  # gate, up, down of 512 experts at Q4_K
    assert routed_4bit == pytest.approx(3.62 * GB, rel=0.01)  # "~3.6 GB of routed experts"
    # Q4_K_M gives ffn_down Q6_K in some layers: those are ~0.55 GB heavier.
    assert min(f.bytes_per_layer) == pytest.approx(3.70 * GB, rel=0.01)
    assert max(f.bytes_per_layer) == pytest.approx(4.27 * GB, rel=0.01)
    assert sum(f.bytes_per_layer) == pytest.approx(238.6 * GB, rel=0.01)
    heavy = [i for i, b in enumerate(f.bytes_per_layer) if b > 4 * GB]
    assert heavy[:7] == list(range(7)) and heavy[-7:] == list(range(53, 60))
    # "12.6 GB of weights" per 3-layer stage: between the lightest and the heaviest three.
    threes = [sum(f.bytes_per_layer[a : a + 3]) for a in range(0, 60, 3)]
    assert min(threes) < 12.6 * GB < max(threes) + 0.2 * GB
    # Embedding at Q4_K; the last stage's extras: output at Q6_K and the MTP block.
    assert f.embedding_bytes == 4096 * 248_320 // 256 * 144
    output = 4096 * 248_320 // 256 * 210
    assert output < f.head_bytes - 4.2 * GB < output + 0.1 * GB


def test_the_manifest_from_the_header(header397: GgufHeader) -> None:
    m = manifest_from_header(header397, "qwen3.5-397b")
    f = m.facts
    assert [p.name for p in m.pieces[1:61]] == [f"blk.{i:03d}" for i in range(60)]
    assert [p.name for p in (m.pieces[0], *m.pieces[61:])] == ["embedding", "head", "mtp"]
    for i in range(60):  # tensor data only, each tensor padded to 32 bytes
        assert 0 <= m.piece(f"blk.{i:03d}").size - f.bytes_per_layer[i] < 32 * 30
    assert m.piece("head").size + m.piece("mtp").size >= f.head_bytes
    assert all(p.sha256 == NOT_COMPUTED for p in m.pieces) and m.source_sha256 == NOT_COMPUTED
    assert m.source_size == header397.data_offset + header397.data_bytes
    names = [p.name for p in m.pieces_for(LayerRange(57, 60))]
    assert names == ["embedding", "blk.057", "blk.058", "blk.059", "head", "mtp"]


def test_write_manifest_only_round_trips_and_no_piece_passes_verification(
    qwen397: Path, tmp_path: Path
) -> None:
    written = write_manifest_only(qwen397, tmp_path / "m")
    loaded = Manifest.load(tmp_path / "m")
    assert loaded == written
    assert loaded.facts.recurrent_state_bytes_per_session_per_layer[0] == 4_341_760
    assert not list((tmp_path / "m").glob("*.gguf"))
    with pytest.raises(PieceCorruptError):
        verify_piece(tmp_path / "m", loaded.pieces[1])


def test_older_manifests_load_without_state(header397: GgufHeader) -> None:
    doc = json.loads(manifest_from_header(header397).to_json())
    del doc["facts"]["recurrent_state_bytes_per_session_per_layer"]
    del doc["facts"]["mtp_kv_bytes_per_token"]
    facts = Manifest.from_json(json.dumps(doc)).facts
    assert facts.recurrent_state_bytes_per_session_per_layer == ()
    assert facts.mtp_kv_bytes_per_token == 0
    assert facts.stage_state_bytes(LayerRange(0, 3), sessions=96) == 0


# ------------------------------------------------------------------ one code path


def write_tiny(path: Path) -> Path:
    return write_qwen35_model(path)


def test_header_facts_equal_the_full_readers_on_a_real_file(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "tiny.gguf")
    full = read_facts(open_gguf(path), "tiny")
    assert facts_from_header(read_header(path), "tiny") == full
    assert sum(full.recurrent_state_bytes_per_session_per_layer) > 0
    header = read_header(path)
    assert header.data_offset + header.data_bytes == path.stat().st_size
    values = recurrent_state_values("qwen35", dict(header.metadata))
    assert values == (3 * (64 + 2 * 2 * 16), 16 * 64)  # the tiny model's n_embd_r, n_embd_s


def test_the_397b_fixture_matches_the_published_config() -> None:
    d = QWEN35_397B
    assert (d.n_layer, d.n_embd, d.n_expert, d.n_expert_used, d.n_ff_exp) == (
        60,
        4096,
        512,
        10,
        1024,
    )
    assert (d.n_head, d.n_head_kv, d.head_dim, d.linear_k_heads, d.linear_v_heads) == (
        32,
        2,
        256,
        16,
        64,
    )
    # ~397B parameters: the trunk's routed experts alone are 386.5B.
    routed = 60 * 3 * 512 * 4096 * 1024
    assert routed == pytest.approx(386.5e9, rel=1e-3)


# ------------------------------------------------------------------ hostile headers


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _header(
    kv: list[bytes] | None = None,
    tensors: list[bytes] | None = None,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
) -> bytes:
    kv = [_s("general.architecture") + struct.pack("<I", 8) + _s("llama")] if kv is None else kv
    tensors = tensors or []
    head = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        n_tensors if n_tensors is not None else len(tensors),
        n_kv if n_kv is not None else len(kv),
    )
    return head + b"".join(kv) + b"".join(tensors)


def _tensor(name: str, shape: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    dims = struct.pack(f"<{len(shape)}Q", *shape)
    return _s(name) + struct.pack("<I", len(shape)) + dims + struct.pack("<IQ", ggml_type, offset)


def _parse(data: bytes, limits: HeaderLimits | None = None) -> GgufHeader:
    return parse_header(io.BytesIO(data), limits or HeaderLimits())


def test_a_small_valid_header() -> None:
    h = _parse(_header(tensors=[_tensor("a", (256, 2), 12), _tensor("b", (8,), 0, 288)]))
    assert [(t.name, t.n_bytes) for t in h.tensors] == [("a", 288), ("b", 32)]
    assert (
        h.data_bytes == 320
        and h.data_offset % 32 == 0
        and h.metadata["general.architecture"] == "llama"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + bytes(20), "bad magic"),
        (_header(version=1), "version"),
        (_header(version=3 << 24), "version"),  # a big-endian file
        (_header(n_tensors=1 << 40), "tensor count"),
        (_header(n_kv=1 << 40), "metadata count"),
        (_header(kv=[struct.pack("<Q", 1 << 40)]), "string length"),
        (_header(kv=[_s("k") + struct.pack("<IIQ", 9, 4, 1 << 40)]), "array length"),
        (_header(kv=[_s("k") + struct.pack("<IIQ", 9, 9, 1)]), "array of value type 9"),
        (_header(kv=[_s("k") + struct.pack("<I", 99)]), "unknown value type"),
        (
            _header(
                kv=[_s("k") + struct.pack("<I", 8) + b"\x02\x00\x00\x00\x00\x00\x00\x00\xff\xfe"]
            ),
            "UTF-8",
        ),
        (_header(kv=[_s("k") + struct.pack("<IB", 0, 1)] * 2), "twice"),
        (_header(tensors=[_tensor("t", (1, 1, 1, 1, 1))]), "dimensions"),
        (_header(tensors=[_tensor("t", (4, 0))]), "impossible shape"),
        (_header(tensors=[_tensor("t", (4, 1 << 50))]), "impossible shape"),
        (_header(tensors=[_tensor("t", (1 << 30, 1 << 30))]), "exceeds the limit"),
        (_header(tensors=[_tensor("t", (4,), 1234)]), "unknown ggml type"),
        (_header(tensors=[_tensor("t", (100,), 12)]), "not a multiple"),
        (_header(tensors=[_tensor("t", (4,), 0, 7)]), "not aligned"),
        (_header(tensors=[_tensor("t", (64,)), _tensor("u", (4,), 0, 224)]), "overlaps"),
        (_header(tensors=[_tensor("t", (4,)), _tensor("t", (4,), 0, 32)]), "twice"),
        (
            _header(kv=[_s("general.alignment") + struct.pack("<II", 4, 48)]),
            "power of two",
        ),
        (_header()[:-3], "truncated"),
    ],
)
def test_hostile_headers_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(GgufHeaderError, match=message):
        _parse(data)


def test_nothing_is_read_past_the_header_limit() -> None:
    data = _header(kv=[_s("k") + struct.pack("<I", 8) + _s("x" * 5000)])
    with pytest.raises(GgufHeaderError, match="header larger"):
        _parse(data, HeaderLimits(max_header_bytes=4096))
    assert _parse(data).metadata["k"] == "x" * 5000


def test_every_truncation_of_a_real_header_is_refused(header397: GgufHeader, qwen397: Path) -> None:
    data = qwen397.read_bytes()
    for cut in (0, 3, 4, 10, 24, 100, 5_000, len(data) // 2, len(data) - 1):
        with pytest.raises(GgufHeaderError):
            _parse(data[:cut])


def test_a_header_that_does_not_describe_a_model_is_a_slice_error() -> None:
    with pytest.raises(SliceError):
        facts_from_header(_parse(_header()))  # llama with no block_count


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_headers_fail_only_with_slice_errors(data: st.DataObject) -> None:
    base = bytearray(_tiny_header())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(base) - 1))
        base[at] = data.draw(st.integers(0, 255))
    limits = HeaderLimits(max_header_bytes=1 << 20, max_array_items=1 << 16)
    with contextlib.suppress(SliceError):  # anything else fails the test
        facts_from_header(_parse(bytes(base), limits))


@functools.cache
def _tiny_header() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = write_tiny(Path(d) / "t.gguf")
        return path.read_bytes()[: read_header(path).data_offset]
