"""A sliced model's manifest: its facts and the pieces it was cut into, with sha256 and size.

Pure data and JSON; the coordinator serves it and workers use it to download only the
pieces their stage needs (`pieces_for`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import PieceCorruptError, SliceError
from core.piece_sources import Mirror, mirror_from_doc
from core.types import LayerRange, ModelFacts

MANIFEST_FORMAT = "sangama-manifest/1"
MANIFEST_FILE = "manifest.json"

EMBEDDING = "embedding"
HEAD = "head"
BLOCK = "block"
SHARED = "shared"
"""Global tensors every stage needs (rope factors); only models that have them get one."""
MTP = "mtp"
"""The MTP ("nextn") block after the trunk: the last stage's, for guessing ahead."""


@dataclass(frozen=True)
class PieceInfo:
    name: str
    """Stable id: "embedding", "head", "shared" or "blk.007"."""
    file: str
    kind: str
    layer: int | None
    sha256: str
    size: int


def block_piece_name(layer: int) -> str:
    return f"blk.{layer:03d}"


@dataclass(frozen=True)
class Manifest:
    facts: ModelFacts
    pieces: tuple[PieceInfo, ...]
    source_sha256: str
    source_size: int
    mirror: Mirror | None = None
    """Where the pieces' tensor bytes can also be read: ranges of the published files
    (core.piece_sources); None for a model only the coordinator serves."""

    def piece(self, name: str) -> PieceInfo:
        for p in self.pieces:
            if p.name == name:
                return p
        raise SliceError(f"manifest has no piece named {name!r}")

    def pieces_for(self, layers: LayerRange) -> list[PieceInfo]:
        """The pieces a stage holding `layers` needs, in assembly order."""
        if layers.stop > self.facts.n_layer:
            raise SliceError(f"{layers} exceeds the model's {self.facts.n_layer} layers")
        first, last = layers.start == 0, layers.stop == self.facts.n_layer
        names = [block_piece_name(i) for i in layers]
        # The last stage needs token_embd too: its row count fixes the vocabulary size
        # llama.cpp checks the head against, and tied models use it as the head.
        if first or last:
            names.insert(0, EMBEDDING)
        if last:
            names.append(HEAD)
        if last and any(p.name == MTP for p in self.pieces):
            names.append(MTP)
        if any(p.name == SHARED for p in self.pieces):
            names.insert(0, SHARED)
        return [self.piece(n) for n in names]

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "facts": asdict(self.facts),
            "source": {"sha256": self.source_sha256, "size": self.source_size},
            "pieces": [asdict(p) for p in self.pieces],
        }
        if self.mirror is not None:  # absent otherwise: the manifest reads as before
            doc["mirror"] = self.mirror.to_doc()
        return json.dumps(doc, indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        """The manifest in `text`; SliceError for anything that is not one. A manifest
        comes from a coordinator, so nothing it holds is trusted: see _piece."""
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or not isinstance(doc.get("facts"), dict):
                raise SliceError("malformed manifest: not an object with facts")
            if doc.get("format") != MANIFEST_FORMAT:
                raise SliceError(f"unsupported manifest format {doc.get('format')!r}")
            f = doc["facts"]
            facts = ModelFacts(
                **{
                    **f,
                    "layer_kinds": tuple(f["layer_kinds"]),
                    "bytes_per_layer": tuple(f["bytes_per_layer"]),
                    "kv_bytes_per_token_per_layer": tuple(f["kv_bytes_per_token_per_layer"]),
                    "eos_tokens": tuple(f["eos_tokens"]),
                    "global_tensors": tuple(f.get("global_tensors", ())),
                    # Absent in older manifests: no recurrent state counted.
                    "recurrent_state_bytes_per_session_per_layer": tuple(
                        int(b) for b in f.get("recurrent_state_bytes_per_session_per_layer", ())
                    ),
                    # Absent in older manifests: every cut allowed.
                    "allowed_cuts": None
                    if f.get("allowed_cuts") is None
                    else tuple(int(c) for c in f["allowed_cuts"]),
                }
            )
            if not isinstance(doc["pieces"], list) or len(doc["pieces"]) > MAX_PIECES:
                raise SliceError(f"malformed manifest: pieces must be a list of <= {MAX_PIECES}")
            pieces = tuple(_piece(p) for p in doc["pieces"])
            mirror = doc.get("mirror")
            if mirror is not None:
                mirror = mirror_from_doc(mirror, {p.name: p.size for p in pieces})
            return Manifest(
                facts, pieces, doc["source"]["sha256"], int(doc["source"]["size"]), mirror
            )
        except SliceError:
            raise
        # RecursionError: deeply nested JSON; AttributeError: a list where a dict belongs.
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise SliceError(f"malformed manifest: {exc!r}"[:500]) from None

    @staticmethod
    def load(directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST_FILE
        try:
            return Manifest.from_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SliceError(f"cannot read manifest {path}: {exc}") from exc

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.write_text(self.to_json(), encoding="utf-8")
        return path


MAX_PIECES = 1 << 16
"""Far above any model's pieces (one per layer, plus a few)."""


def _piece(doc: Any) -> PieceInfo:
    """One piece entry, each field of its JSON type: its file name and size decide what
    is written to disk and how much is downloaded."""
    if not isinstance(doc, dict):
        raise SliceError("malformed manifest: a piece is not an object")
    piece = PieceInfo(**doc)
    texts = (piece.name, piece.file, piece.kind, piece.sha256)
    layer_ok = piece.layer is None or (
        isinstance(piece.layer, int) and not isinstance(piece.layer, bool) and piece.layer >= 0
    )
    size_ok = isinstance(piece.size, int) and not isinstance(piece.size, bool) and piece.size >= 0
    if not all(isinstance(t, str) and 0 < len(t) <= 256 for t in texts) or not (
        layer_ok and size_ok
    ):
        raise SliceError(f"malformed manifest: piece {str(piece.name)[:64]!r} has a wrong field")
    return piece


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_piece(directory: Path, piece: PieceInfo) -> Path:
    """Check one piece's size and sha256; raise PieceCorruptError naming it otherwise."""
    path = Path(directory) / piece.file
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise PieceCorruptError(piece.name, f"missing ({exc.strerror})") from exc
    if size != piece.size:
        raise PieceCorruptError(piece.name, f"size {size} != expected {piece.size}")
    digest = sha256_file(path)
    if digest != piece.sha256:
        raise PieceCorruptError(
            piece.name, f"sha256 {digest[:16]}… != expected {piece.sha256[:16]}…"
        )
    return path
