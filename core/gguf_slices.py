"""Cut a GGUF model into pieces, and assemble a stage GGUF for layers [a, b) from them.

Pieces are small GGUF files: one per transformer block (tensors keep their original
names), an embedding piece (token_embd plus the tokenizer metadata) and a head piece
(output_norm and output). Every piece carries the model's non-tokenizer metadata, so
any piece describes the model on its own.

A stage file holds only its own blocks, renumbered from 0 (docs/engine.md, "A stage
file, and what one stage computes"):
- per-layer attention kinds are always written as per-layer arrays, so any cut is right;
- the first stage keeps the tokenizer and token_embd;
- middle stages get a dummy one-token vocabulary and one-row token_embd (tiny files);
- the last stage keeps output_norm and output (and token_embd, which fixes the
  vocabulary size and is the head of tied models such as Gemma).
Tensors are copied as raw quantized bytes, never re-encoded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from core import gguf_layout as layout
from core import model_sizes
from core.errors import CutNotAllowedError, SliceError
from core.gguf_reader import open_gguf
from core.manifest import (
    BLOCK,
    EMBEDDING,
    HEAD,
    MTP,
    SHARED,
    Manifest,
    block_piece_name,
    verify_piece,
)
from core.types import LayerRange, ModelFacts

_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")
_TOKENIZER_PREFIX = "tokenizer."

# Default sliding-window period per architecture, as llama.cpp's loaders assume it when
# the GGUF has no explicit per-layer array (llama_hparams::set_swa_pattern).
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "olmo2": 4, "exaone4": 4}
# Hybrid architectures whose non-full-attention layers are recurrent.
_RECURRENT_ARCHS = {"qwen35", "qwen35moe", "qwen3next"}

# Keys the assembler rewrites per stage.
SANGAMA_LAYER_START = "sangama.layer_start"
SANGAMA_LAYER_STOP = "sangama.layer_stop"
SANGAMA_N_LAYER_TOTAL = "sangama.n_layer_total"


# ---------------------------------------------------------------- reading metadata


def _fields(reader: GGUFReader) -> dict[str, Any]:
    return {
        name: f
        for name, f in reader.fields.items()
        if not name.startswith("GGUF.") and name != "general.architecture"
    }


def _value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _arch(reader: GGUFReader) -> str:
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise SliceError("GGUF has no general.architecture")
    return arch


MAX_BLOCKS = 4096
"""The most blocks a model may declare: the largest published models have a few hundred;
a header claiming more is refused before any per-layer list is built from it."""


def _block_count(reader: GGUFReader, arch: str) -> int:
    n = int(_value(reader, f"{arch}.block_count"))
    if not 0 < n <= MAX_BLOCKS:
        raise SliceError(f"{arch}.block_count is {n}: a model has 1 to {MAX_BLOCKS} blocks")
    return n


def _per_layer(reader: GGUFReader, key: str, n_layer: int, default: int) -> list[int]:
    v = _value(reader, key, default)
    return [int(x) for x in v] if isinstance(v, list) else [int(v)] * n_layer


def layer_kinds(reader: GGUFReader) -> list[str]:
    """Per-layer attention kind as llama.cpp will see it: "full", "sliding" or "recurrent"."""
    arch = _arch(reader)
    n_layer = _block_count(reader, arch)
    kinds = ["full"] * n_layer
    recurrent = _value(reader, f"{arch}.attention.recurrent_layers")
    if isinstance(recurrent, list):
        kinds = ["recurrent" if r else k for k, r in zip(kinds, recurrent, strict=False)]
    elif arch in _RECURRENT_ARCHS:
        interval = int(_value(reader, f"{arch}.full_attention_interval", 4))
        kinds = ["recurrent" if (i + 1) % interval else "full" for i in range(n_layer)]
    pattern = _value(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        kinds = ["sliding" if s else k for k, s in zip(kinds, pattern, strict=False)]
    elif f"{arch}.attention.sliding_window" in reader.fields:
        period = int(pattern) if pattern is not None else _SWA_PERIOD.get(arch, 0)
        if period:
            kinds = ["sliding" if i % period < period - 1 else k for i, k in enumerate(kinds)]
    return kinds


def read_facts(reader: GGUFReader, name: str = "") -> ModelFacts:
    """The model facts placement and the wire need, from a whole model's GGUF."""
    arch = _arch(reader)
    metadata = {name: f.contents() for name, f in _fields(reader).items()}
    # block_count counts the MTP block(s) too; the trunk is what a chain cuts.
    n_mtp = layout.mtp_layers(arch, metadata)
    n_layer = _block_count(reader, arch) - n_mtp
    n_embd = int(_value(reader, f"{arch}.embedding_length"))
    n_head = _per_layer(reader, f"{arch}.attention.head_count", n_layer, 1)
    n_head_kv = _per_layer(reader, f"{arch}.attention.head_count_kv", n_layer, n_head[0])
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens.data) if tokens is not None else int(_value(reader, f"{arch}.vocab_size"))
    kinds = layer_kinds(reader)[:n_layer]

    block_bytes = [0] * n_layer
    embedding_bytes = head_bytes = 0
    names = set()
    for t in reader.tensors:
        names.add(t.name)
        place = layout.tensor_place(arch, t.name)
        m = _BLOCK_TENSOR.match(t.name)
        if place == BLOCK and m and int(m.group(1)) < n_layer:
            block_bytes[int(m.group(1))] += int(t.n_bytes)
        elif place == BLOCK and m:
            head_bytes += int(t.n_bytes)  # the MTP block: loaded by the last stage alone
        elif place == EMBEDDING:
            embedding_bytes += int(t.n_bytes)
        elif place == HEAD:
            head_bytes += int(t.n_bytes)
        # SHARED tensors (rope factors) are kilobytes: not worth a memory line.

    kv_bytes = []
    for il in range(n_layer):
        head_dim_k = int(_value(reader, f"{arch}.attention.key_length", n_embd // n_head[il]))
        head_dim_v = int(_value(reader, f"{arch}.attention.value_length", head_dim_k))
        per_pos = 2 * n_head_kv[il] * (head_dim_k + head_dim_v)  # f16 K and V
        kv_bytes.append(0 if kinds[il] == "recurrent" else per_pos)

    bos = _value(reader, "tokenizer.ggml.bos_token_id")
    eos = _value(reader, "tokenizer.ggml.eos_token_id")
    eot = _value(reader, "tokenizer.ggml.eot_token_id")
    eos_tokens = tuple(sorted({int(x) for x in (eos, eot) if x is not None}))
    layout.check_keys(arch, metadata)
    policy = layout.cut_policy(arch, n_layer, metadata, kinds)
    return ModelFacts(
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_ctx_train=int(_value(reader, f"{arch}.context_length", 0)),
        layer_kinds=tuple(kinds),
        bytes_per_layer=tuple(block_bytes),
        kv_bytes_per_token_per_layer=tuple(kv_bytes),
        embedding_bytes=embedding_bytes,
        head_bytes=head_bytes,
        tied_output="output.weight" not in names,
        bos_token=int(bos) if bos is not None else None,
        eos_tokens=eos_tokens,
        name=name or str(_value(reader, "general.name", "")),
        allowed_cuts=policy.cuts,
        global_tensors=tuple(sorted(n for n in names if not n.startswith("blk."))),
        cut_reason=policy.reason,
        n_mtp_layers=n_mtp,
        recurrent_state_bytes_per_session_per_layer=model_sizes.recurrent_state_bytes(
            arch, metadata, kinds
        ),
        mtp_kv_bytes_per_token=model_sizes.mtp_kv_bytes_per_token(arch, metadata, n_layer, n_mtp),
    )


# ---------------------------------------------------------------- writing GGUF files


def _copy_field(w: GGUFWriter, name: str, field: Any) -> None:
    vtype = field.types[0]
    sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
    w.add_key_value(name, field.contents(), vtype, sub_type=sub)


def _copy_tensor(w: GGUFWriter, name: str, tensor: Any) -> None:
    w.add_tensor(name, tensor.data, raw_shape=None, raw_dtype=tensor.tensor_type)


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def slice_model(
    model_path: Path,
    out_dir: Path,
    name: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Cut the model at `model_path` (one GGUF, or the first shard of a gguf-split set)
    into pieces under `out_dir` and write manifest.json there. Streamed, in memory that
    does not grow with the model, and resumable (core.gguf_stream); `progress` is called
    with (bytes read, total bytes) as the source is read."""
    from core.gguf_stream import slice_streamed  # it reads facts through this module

    return slice_streamed(model_path, out_dir, name, progress)


# ---------------------------------------------------------------- assembling a stage


def _stage_kinds_keys(
    w: GGUFWriter, arch: str, kinds: list[str], source_fields: dict[str, Any], n_mtp: int = 0
) -> set[str]:
    """Write the per-layer pattern arrays for the stage's layers; return the keys handled."""
    written = set()
    window = f"{arch}.attention.sliding_window"
    if window in source_fields and "sliding" not in kinds:
        # llama.cpp asserts when a sliding-window model has no sliding layer; a stage of
        # only global layers is, to llama.cpp, a model without a window.
        written.add(window)
    elif window in source_fields:
        key = f"{arch}.attention.sliding_window_pattern"
        w.add_key_value(
            key, [k == "sliding" for k in kinds], GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL
        )
        written.add(key)
    if "recurrent" in kinds or arch in _RECURRENT_ARCHS:
        key = f"{arch}.attention.recurrent_layers"
        flags = [k == "recurrent" for k in kinds] + [False] * n_mtp  # MTP blocks: attention
        w.add_key_value(key, flags, GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
        written.add(key)
    return written


def check_cuts(facts: ModelFacts, layers: LayerRange) -> None:
    """Raise CutNotAllowedError when `layers` starts or ends where a cut is not exact."""
    for position in (layers.start, layers.stop):
        if not facts.cut_allowed(position):
            assert facts.allowed_cuts is not None
            raise CutNotAllowedError(position, facts.allowed_cuts, facts.cut_reason)


def _stage_metadata(
    w: GGUFWriter, facts: ModelFacts, layers: LayerRange, base_fields: dict[str, Any]
) -> None:
    """Every non-tokenizer key for the stage, each by its role in gguf_layout."""
    arch = facts.architecture
    first = layers.start == 0
    # Only the last stage carries the MTP block; the others are plain trunks to llama.cpp.
    n_mtp = facts.n_mtp_layers if layers.stop == facts.n_layer else 0
    kinds = list(facts.layer_kinds[layers.start : layers.stop])
    handled = _stage_kinds_keys(w, arch, kinds, base_fields, n_mtp)
    for name, field in base_fields.items():
        role = layout.key_role(arch, name)
        if name in handled or role == layout.TOKENIZER:
            continue
        if role == layout.REWRITE:
            if name == f"{arch}.leading_dense_block_count":
                # Dense layers lead the model: the stage keeps those it holds, counted anew.
                lead = int(field.contents()) - layers.start
                w.add_uint32(name, max(0, min(len(layers), lead)))
            elif name == f"{arch}.attention.sliding_window" or (
                name == f"{arch}.vocab_size" and first
            ):
                _copy_field(w, name, field)
            continue  # block_count, vocab_size, full_attention_interval: written below
        if role == layout.FIRST_ONLY and not first:
            continue
        if (
            role == layout.PER_LAYER
            and field.types[0] == GGUFValueType.ARRAY
            and len(field.data) in (facts.n_layer, facts.n_layer + facts.n_mtp_layers)
        ):
            # Per-layer hyperparameter arrays follow the blocks they describe (the MTP
            # block's entries, after the trunk's, go with it to the last stage).
            vals = field.contents()
            mtp_vals = vals[facts.n_layer :][:n_mtp]
            vals = vals[layers.start : layers.stop] + mtp_vals
            w.add_key_value(name, vals, GGUFValueType.ARRAY, sub_type=field.types[-1])
            continue
        _copy_field(w, name, field)
    w.add_block_count(len(layers) + n_mtp)
    if n_mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    w.add_uint32(SANGAMA_LAYER_START, layers.start)
    w.add_uint32(SANGAMA_LAYER_STOP, layers.stop)
    w.add_uint32(SANGAMA_N_LAYER_TOTAL, facts.n_layer)


def _dummy_shape(facts: ModelFacts, name: str, n_vocab_stage: int) -> tuple[int, ...]:
    """Numpy shape of a global tensor as llama.cpp checks it for this stage."""
    return {
        "output_norm.weight": (facts.n_embd,),
        "output_norm.bias": (facts.n_embd,),
        "output.bias": (n_vocab_stage,),
        "output.weight": (n_vocab_stage, facts.n_embd),
        "position_embd.weight": (facts.n_ctx_train, facts.n_embd),
    }[name]


def _stage_head(w: GGUFWriter, facts: ModelFacts, n_vocab_stage: int) -> None:
    """The head a non-last stage must carry for llama.cpp to load it; never evaluated,
    as the capture stops the graph after the stage's last block."""
    w.add_tensor("output_norm.weight", np.ones(facts.n_embd, dtype=np.float32))
    for name, fill in layout.DUMMY_HEAD.items():
        if name in facts.global_tensors and name != "output_norm.weight":
            shape = _dummy_shape(facts, name, n_vocab_stage)
            w.add_tensor(name, np.full(shape, fill, dtype=np.float32))
    if "output.weight" in facts.global_tensors and facts.architecture in layout.OUTPUT_REQUIRED:
        # Zero Q4_0 blocks: the smallest encoding of a full-vocabulary matrix.
        if facts.n_embd % 32 == 0:
            raw = np.zeros((n_vocab_stage, facts.n_embd // 32 * 18), dtype=np.uint8)
            w.add_tensor("output.weight", raw, raw_dtype=GGMLQuantizationType.Q4_0)
        else:
            w.add_tensor("output.weight", np.zeros((n_vocab_stage, facts.n_embd), np.float16))


def assemble_stage(
    manifest: Manifest, pieces_dir: Path, layers: LayerRange, out_path: Path
) -> Path:
    """Verify the needed pieces, then write the stage GGUF for `layers` to `out_path`.
    Raises CutNotAllowedError, before reading any piece, for a range the manifest forbids."""
    facts = manifest.facts
    check_cuts(facts, layers)
    needed = manifest.pieces_for(layers)
    paths = {p.name: verify_piece(Path(pieces_dir), p) for p in needed}  # all checks first
    readers = {name: open_gguf(path) for name, path in paths.items()}

    first, last = layers.start == 0, layers.stop == facts.n_layer
    arch = facts.architecture
    base = readers[block_piece_name(layers.start)]

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(out_path.suffix + ".part")
    w = GGUFWriter(str(tmp), arch=arch)
    _stage_metadata(w, facts, layers, _fields(base))
    if first:
        for name, field in _fields(readers[EMBEDDING]).items():
            if name.startswith(_TOKENIZER_PREFIX):
                _copy_field(w, name, field)
    else:
        w.add_tokenizer_model("none")
        w.add_vocab_size(facts.n_vocab if last else 1)
    n_vocab_stage = facts.n_vocab if first or last else 1

    for layer in layers:
        for t in readers[block_piece_name(layer)].tensors:
            m = _BLOCK_TENSOR.match(t.name)
            if m is None or int(m.group(1)) != layer:
                raise SliceError(f"piece {block_piece_name(layer)} holds foreign tensor {t.name}")
            _copy_tensor(w, f"blk.{layer - layers.start}.{m.group(2)}", t)

    if first or last:
        for t in readers[EMBEDDING].tensors:
            if first or t.name not in layout.NEUTRAL_IF_NOT_FIRST:
                _copy_tensor(w, t.name, t)
            else:
                # Added to the stage's input: zero keeps the incoming hidden state exact.
                w.add_tensor(t.name, np.zeros(t.data.shape, dtype=np.float16))
    else:
        # A one-token vocabulary: the stage never embeds tokens nor computes logits.
        w.add_tensor("token_embd.weight", np.zeros((1, facts.n_embd), dtype=np.float32))
        for name in layout.NEUTRAL_IF_NOT_FIRST:
            if name in facts.global_tensors:
                shape = _dummy_shape(facts, name, n_vocab_stage)
                w.add_tensor(name, np.zeros(shape, dtype=np.float16))
    if SHARED in readers:
        for t in readers[SHARED].tensors:
            _copy_tensor(w, t.name, t)
    if last:
        for t in readers[HEAD].tensors:
            _copy_tensor(w, t.name, t)
        if MTP in readers:
            # The MTP block follows the stage's own trunk blocks, as llama.cpp expects.
            for t in readers[MTP].tensors:
                m = _BLOCK_TENSOR.match(t.name)
                if m is None or int(m.group(1)) < facts.n_layer:
                    raise SliceError(f"piece {MTP} holds foreign tensor {t.name}")
                index = int(m.group(1)) - facts.n_layer + len(layers)
                _copy_tensor(w, f"blk.{index}.{m.group(2)}", t)
    else:
        _stage_head(w, facts, n_vocab_stage)
    _finish(w)
    tmp.replace(out_path)
    return out_path


def has_mtp_block(path: Path) -> bool:
    """Does this GGUF (a whole model or a last stage) carry an MTP block llama.cpp runs?"""
    reader = open_gguf(path)
    arch = _arch(reader)
    return arch in layout.MTP_ARCHS and int(_value(reader, f"{arch}.nextn_predict_layers", 0)) > 0


def stage_file_name(facts: ModelFacts, layers: LayerRange) -> str:
    return f"{facts.name or facts.architecture}.{layers.start}-{layers.stop}.gguf"
