"""GGUF fixtures for slicing tests: shard sets as llama.cpp's gguf-split writes them, the
pieces the slicer wrote before it streamed (gguf-py's GGUFWriter over a memory map), and
a tiny model with every kind of metadata value and quantized tensors.

`split_gguf` follows tools/gguf-split/gguf-split.cpp (split by tensor count):
- shard i of n is `<prefix>-%05d-of-%05d.gguf`, i from 1;
- the first shard gets every metadata entry of the model, then split.no (u16),
  split.count (u16) and split.tensors.count (i32); the others get only those three;
- tensors keep their order; a new shard starts every `max_tensors` tensors, and with
  `no_tensor_first_split` the first shard holds no tensor;
- each shard is a GGUF v3 file: header, entries, tensor infos (offsets padded to the
  alignment, 32 unless general.alignment says otherwise in the first shard), zeros to the
  alignment, then each tensor's bytes followed by zeros to 32.
It is written here from those facts, independently of core.gguf_stream's writer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

_MAGIC = 0x46554747
_ALIGN = 32


def _pad(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _split_kv(no: int, count: int, n_tensors: int) -> list[bytes]:
    return [
        _str("split.no") + struct.pack("<IH", GGUFValueType.UINT16, no),
        _str("split.count") + struct.pack("<IH", GGUFValueType.UINT16, count),
        _str("split.tensors.count") + struct.pack("<Ii", GGUFValueType.INT32, n_tensors),
    ]


def split_gguf(
    src: Path, out_dir: Path, prefix: str, max_tensors: int, no_tensor_first_split: bool = False
) -> list[Path]:
    """Split the GGUF `src` as `gguf-split --split-max-tensors N [--no-tensor-first-split]`."""
    reader = GGUFReader(str(src))
    raw = np.memmap(src, dtype=np.uint8, mode="r")
    kv = []
    for name, f in reader.fields.items():
        if not name.startswith("GGUF."):
            n = sum(int(p.nbytes) for p in f.parts)
            kv.append(bytes(raw[f.offset : f.offset + n]))
    groups: list[list[Any]] = [[]]
    if no_tensor_first_split:
        groups.append([])
    for i, t in enumerate(reader.tensors):
        if i > 0 and i % max_tensors == 0:
            groups.append([])
        groups[-1].append(t)
    n = len(groups)
    paths = []
    for i, tensors in enumerate(groups):
        entries = (kv if i == 0 else []) + _split_kv(i, n, len(reader.tensors))
        align = reader.alignment if i == 0 else _ALIGN
        meta = bytearray(struct.pack("<IIQQ", _MAGIC, 3, len(tensors), len(entries)))
        meta += b"".join(entries)
        offset = 0
        for t in tensors:
            meta += _str(t.name) + struct.pack("<I", len(t.shape))
            meta += b"".join(struct.pack("<Q", int(d)) for d in t.shape)
            meta += struct.pack("<IQ", int(t.tensor_type), offset)
            offset += _pad(int(t.n_bytes), align)
        meta += bytes(_pad(len(meta), align) - len(meta))
        path = out_dir / f"{prefix}-{i + 1:05d}-of-{n:05d}.gguf"
        with open(path, "wb") as out:
            out.write(meta)
            for t in tensors:
                out.write(bytes(raw[t.data_offset : t.data_offset + int(t.n_bytes)]))
                out.write(bytes(_pad(int(t.n_bytes), _ALIGN) - int(t.n_bytes)))
        paths.append(path)
    return paths


def merged_with_split_keys(src: Path, dst: Path) -> Path:
    """`src` with split.no 0, split.count 0 and split.tensors.count appended to its
    metadata, as `gguf-split --merge` leaves them in the merged file."""
    reader = GGUFReader(str(src))
    raw = np.memmap(src, dtype=np.uint8, mode="r")
    n_kv = len([k for k in reader.fields if not k.startswith("GGUF.")])
    first_ti = min((t.field.offset for t in reader.tensors), default=reader.data_offset)
    extra = b"".join(_split_kv(0, 0, len(reader.tensors)))
    head = bytes(raw[:first_ti])
    head = head[:16] + struct.pack("<Q", n_kv + 3) + head[24:] + extra
    # Tensor infos unchanged: their offsets count from the data section.
    last = reader.tensors[-1].field
    ti = bytes(raw[first_ti : last.offset + sum(int(p.nbytes) for p in last.parts)])
    meta = head + ti
    meta += bytes(_pad(len(meta), reader.alignment) - len(meta))
    with open(dst, "wb") as f:
        f.write(meta)
        f.write(bytes(raw[reader.data_offset :]))
    return dst


# ---------------------------------------------------------------- the slicer before streaming


def reference_pieces(model: Path, plan: Iterable[tuple[str, list[str], bool]]) -> dict[str, bytes]:
    """Each piece's bytes as the slicer wrote them with gguf-py's GGUFWriter from a
    GGUFReader: general.architecture, every other entry but GGUF.* (tokenizer.* only
    where asked), then the named tensors' data as the reader maps them."""
    reader = GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    by_name = {t.name: t for t in reader.tensors}
    out = {}
    for file, names, with_tokenizer in plan:
        path = model.parent / f"ref-{file}"
        w = GGUFWriter(str(path), arch=arch)
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            if key.startswith("tokenizer.") and not with_tokenizer:
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), vtype, sub_type=sub)
        for name in names:
            t = by_name[name]
            w.add_tensor(name, t.data, raw_shape=None, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out[file] = path.read_bytes()
        path.unlink()
    return out


# ---------------------------------------------------------------- a model with rich metadata


def write_rich_model(path: Path, n_layer: int = 3, n_embd: int = 64, n_vocab: int = 96) -> Path:
    """A tiny llama model with a tokenizer (string, float and int arrays), metadata of
    every scalar type, Q4_0 and F16 and F32 tensors, and a rope_freqs (shared) tensor."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("rich-llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(2 * n_embd)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_bool("rich.flag", True)
    w.add_int8("rich.i8", -3)
    w.add_uint64("rich.u64", 1 << 40)
    w.add_int64("rich.i64", -(1 << 40))
    w.add_float64("rich.f64", 0.1)
    w.add_array("rich.ints", [1, 2, 3])
    w.add_string("rich.utf8", "Sangama सङ्गम ✓")
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" if i % 7 else f"▁w{i}é" for i in range(n_vocab)])
    w.add_token_scores([float(-i) / 3 for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def q4_0(name: str, rows: int, cols: int) -> None:
        raw = rng.integers(0, 256, (rows, cols // 32 * 18), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=GGMLQuantizationType.Q4_0)

    def f16(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, rng.standard_normal((rows, cols)).astype(np.float16))

    f16("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("rope_freqs.weight", np.ones(n_embd // 8, dtype=np.float32))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        q4_0(p + "attn_q.weight", n_embd, n_embd)
        q4_0(p + "attn_k.weight", n_embd // 2, n_embd)
        q4_0(p + "attn_v.weight", n_embd // 2, n_embd)
        q4_0(p + "attn_output.weight", n_embd, n_embd)
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        q4_0(p + "ffn_gate.weight", 2 * n_embd, n_embd)
        q4_0(p + "ffn_up.weight", 2 * n_embd, n_embd)
        f16(p + "ffn_down.weight", n_embd, 2 * n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    q4_0("output.weight", n_vocab, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
