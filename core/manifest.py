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
        return json.dumps(doc, indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        try:
            doc = json.loads(text)
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
                    # Absent in older manifests: every cut allowed.
                    "allowed_cuts": None
                    if f.get("allowed_cuts") is None
                    else tuple(int(c) for c in f["allowed_cuts"]),
                }
            )
            pieces = tuple(PieceInfo(**p) for p in doc["pieces"])
            return Manifest(facts, pieces, doc["source"]["sha256"], int(doc["source"]["size"]))
        except SliceError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SliceError(f"malformed manifest: {exc}") from exc

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
