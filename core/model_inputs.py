"""What a person names as a model, a folder of pieces, cut points or a stage's layers,
checked before any work starts.

A misuse costs a sentence, not a traceback half-way through slicing or loading: each check
raises a typed error (core.errors) whose message says what is wrong and what would work,
so the CLI, the coordinator and the tray can show it as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from core import gguf_layout as layout
from core.errors import (
    CutsError,
    NotAModelError,
    NotPiecesError,
    SplitShardError,
    UnsupportedModelError,
)
from core.gguf_reader import open_gguf
from core.manifest import MANIFEST_FILE, Manifest
from core.models import resolve_model
from core.types import LayerRange, ModelFacts

GGUF_MAGIC = b"GGUF"
_SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class ModelFileSummary:
    """The few metadata a model file is judged by before it is sliced or loaded."""

    path: Path
    architecture: str
    """"" for a later shard of a split model: only the first carries the metadata."""
    split_index: int
    """0-based shard number (gguf-split's split.no); 0 for a whole model."""
    split_count: int
    """Shards the model was split into; 0 or 1 for a whole model."""


def read_header(path: Path) -> ModelFileSummary:
    """The header of the GGUF at `path`; NotAModelError for anything that is not one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise NotAModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise NotAModelError(
            f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'): give a model "
            "in GGUF format, e.g. converted with llama.cpp's convert_hf_to_gguf.py"
        )
    try:
        reader = open_gguf(path)
        fields = {
            key: reader.fields[key].contents()
            for key in ("general.architecture", "general.type", "split.no", "split.count")
            if key in reader.fields
        }
    # gguf-py reports a damaged file by whatever its parser trips on.
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise NotAModelError(
            f"{path} is a damaged or truncated GGUF file ({exc}): download or convert it again"
        ) from exc
    arch = fields.get("general.architecture")
    if fields.get("general.type") == "adapter":
        raise NotAModelError(
            f"{path} is an adapter (LoRA), not a model: give the base model's GGUF file"
        )
    split_index, split_count = int(fields.get("split.no") or 0), int(fields.get("split.count") or 0)
    if not isinstance(arch, str) or not arch:
        if split_count > 1:
            arch = ""  # gguf-split writes the model's metadata into the first shard alone
        else:
            raise NotAModelError(
                f"{path} has no general.architecture, so it is not a model GGUF: give a model file"
            )
    return ModelFileSummary(path, arch, split_index, split_count)


def first_shard_name(header: ModelFileSummary) -> str:
    """How to name the first shard of the model `header` belongs to: the file name
    gguf-split gives it, or (for a renamed file) its split.no."""
    name = header.path.name
    if _SHARD_NAME.search(name):
        return _SHARD_NAME.sub(f"-00001-of-{header.split_count:05d}.gguf", name)
    return "the one with split.no 0"


def _shard_of(header: ModelFileSummary) -> str:
    return (
        f"{header.path} is shard {header.split_index + 1} of {header.split_count} of a split "
        "GGUF (gguf-split)"
    )


def check_whole_model(path: Path, first_shard_ok: bool = False) -> ModelFileSummary:
    """Refuse a file a chain cannot be cut from: not a GGUF, a shard of a split model (but
    the first one if `first_shard_ok`: the slicer reads its siblings), or an architecture
    whose exact cuts have not been checked (core.gguf_layout)."""
    header = read_header(path)
    if header.split_count > 1 and not (first_shard_ok and header.split_index == 0):
        first = first_shard_name(header)
        raise SplitShardError(
            f"{_shard_of(header)}, not a whole model: pass the first shard ({first}) to "
            "`sangama slice`",
            header.split_index + 1,
            header.split_count,
            first,
        )
    if header.architecture not in layout.ARCH_RULES:
        raise UnsupportedModelError(
            f"{path} is a {header.architecture!r} model, an architecture not checked for "
            f"exact layer cuts; Sangama runs: {', '.join(layout.supported_architectures())}"
        )
    return header


def model_file(name_or_path: str, first_shard_ok: bool = False) -> Path:
    """`resolve_model` (a bundled model's name or a GGUF path), then `check_whole_model`."""
    path = resolve_model(name_or_path)
    check_whole_model(path, first_shard_ok)
    return path


def pieces_manifest(folder: Path) -> Manifest:
    """The manifest of a folder of pieces (what `sangama slice` writes); NotPiecesError
    saying how to make one when `folder` is not such a folder."""
    folder = Path(folder)
    slice_hint = f"`sangama slice MODEL.gguf --out {folder}` makes one"
    if not folder.exists():
        raise NotPiecesError(f"no folder {folder}: {slice_hint}")
    if not folder.is_dir():
        if _starts_with_magic(folder):
            return _gguf_given_as_pieces(folder)
        raise NotPiecesError(
            f"{folder} is a file, not a folder of pieces: give the folder that "
            "`sangama slice MODEL.gguf --out DIR` writes"
        )
    if not (folder / MANIFEST_FILE).is_file():
        raise NotPiecesError(
            f"{folder} has no {MANIFEST_FILE}, so it is not a folder of pieces: {slice_hint}"
        )
    return Manifest.load(folder)


def _starts_with_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _gguf_given_as_pieces(path: Path) -> Manifest:
    header = read_header(path)
    if header.split_count > 1:
        raise NotPiecesError(
            f"{_shard_of(header)}, not a folder of pieces: pass the first shard "
            f"({first_shard_name(header)}) to `sangama slice ... --out DIR`, then give DIR here"
        )
    raise NotPiecesError(
        f"{path} is a GGUF file, not a folder of pieces: cut it first with "
        f"`sangama slice {path} --out DIR`, then give DIR here"
    )


# ---------------------------------------------------------------- cuts and layer ranges


def allowed_boundaries(facts: ModelFacts) -> tuple[int, ...]:
    return facts.allowed_cuts or tuple(range(facts.n_layer + 1))


def suggest_cuts(facts: ModelFacts, n_stages: int = 3) -> list[int]:
    """About `n_stages` stages of similar layer counts, cut only where the model allows
    (fewer stages when it allows fewer boundaries)."""
    allowed = allowed_boundaries(facts)
    k = max(1, min(n_stages, len(allowed) - 1))
    return [allowed[round(i * (len(allowed) - 1) / k)] for i in range(k + 1)]


def _model(facts: ModelFacts) -> str:
    return f"{facts.name or facts.architecture} ({facts.n_layer} layers)"


def _joined(cuts: Sequence[int]) -> str:
    return ",".join(str(c) for c in cuts)


def _forbidden_note(facts: ModelFacts) -> str:
    reason = f" [{facts.cut_reason}]" if facts.cut_reason else ""
    return f"{_model(facts)} allows cuts only at {_joined(allowed_boundaries(facts))}{reason}"


def stage_ranges(facts: ModelFacts, cuts: Sequence[int]) -> list[LayerRange]:
    """The stages `cuts` (as given to --cuts) make of this model; CutsError, with cuts
    that would work, for cuts that do not cover it exactly."""
    cuts = list(cuts)
    allowed = allowed_boundaries(facts)
    example = _joined(suggest_cuts(facts, max(len(cuts) - 1, 1) if len(cuts) > 2 else 3))

    def refuse(problem: str) -> CutsError:
        return CutsError(
            f"{problem}; got {_joined(cuts)} — e.g. --cuts {example}", allowed, example
        )

    n = facts.n_layer
    if len(cuts) < 2 or cuts[0] != 0 or cuts[-1] != n:
        raise refuse(f"cuts must run from 0 to {n} for {_model(facts)}")
    if any(b <= a for a, b in pairwise(cuts)):
        raise refuse("cuts must strictly increase")
    bad = [c for c in cuts if not facts.cut_allowed(c)]
    if bad:
        at = "layer" if len(bad) == 1 else "layers"
        raise refuse(f"cannot cut at {at} {_joined(bad)}: {_forbidden_note(facts)}")
    return LayerRange.from_cuts(cuts)


def stage_layers(facts: ModelFacts, layers: LayerRange) -> LayerRange:
    """`layers` (as given to --layers) if one stage of this model may hold exactly them;
    CutsError naming a range that would work otherwise."""
    allowed = allowed_boundaries(facts)
    first = suggest_cuts(facts)[:2]
    example = f"{first[0]}:{first[1]}"
    given = f"{layers.start}:{layers.stop}"
    if layers.stop > facts.n_layer:
        raise CutsError(
            f"--layers {given} is outside {_model(facts)}: STOP may be at most "
            f"{facts.n_layer} — e.g. --layers {example}",
            allowed,
            example,
        )
    bad = [c for c in (layers.start, layers.stop) if not facts.cut_allowed(c)]
    if bad:
        raise CutsError(
            f"--layers {given}: a stage cannot start or end at layer {_joined(bad)}: "
            f"{_forbidden_note(facts)} — e.g. --layers {example}",
            allowed,
            example,
        )
    return layers
