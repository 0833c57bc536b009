"""Typed errors of the `core` package; callers catch `CoreError` or a precise subclass."""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised on purpose by `core`."""


class SliceError(CoreError):
    """A model could not be cut into pieces, or a stage could not be assembled."""


class UnsupportedModelError(SliceError):
    """The model has a tensor, key or architecture that a chain could not reproduce exactly."""


class CutNotAllowedError(SliceError):
    """A stage boundary falls where the model's manifest says a cut would not be exact."""

    def __init__(self, position: int, allowed: tuple[int, ...], reason: str) -> None:
        super().__init__(
            f"a stage boundary at layer {position} is not exact for this model ({reason}); "
            f"allowed boundaries: {list(allowed)}"
        )
        self.position = position
        self.allowed = allowed
        self.reason = reason


class PieceCorruptError(SliceError):
    """A piece on disk does not match the sha256 or size its manifest promises."""

    def __init__(self, piece: str, reason: str) -> None:
        super().__init__(f"piece {piece!r} is corrupt: {reason}")
        self.piece = piece
        self.reason = reason


class NotFirstShardError(SliceError):
    """A shard other than the first of a gguf-split model was given to be sliced."""


class MissingShardsError(SliceError):
    """The first shard of a gguf-split model was given, but not all its shards are there."""

    def __init__(self, first: object, count: int, missing: tuple[object, ...]) -> None:
        names = ", ".join(str(m) for m in missing)
        super().__init__(
            f"{first} is one shard of a model split into {count} files (gguf-split), and "
            f"{len(missing)} of the others are missing: {names}; put every shard in the "
            "same folder, named as gguf-split wrote them"
        )
        self.missing = missing


class ModelLoadError(CoreError):
    """llama.cpp refused to load a model or create a context."""


class EngineLayoutError(CoreError):
    """The ggml tensor layout compiled into llama.cpp differs from the one we read."""


class SessionError(CoreError):
    """A request named a session the stage cannot serve as asked."""

    def __init__(self, session: str, message: str) -> None:
        super().__init__(f"session {session!r}: {message}")
        self.session = session


class StageFullError(SessionError):
    """Every sequence slot of the stage is taken."""


class UnknownSessionError(SessionError):
    """The session was never opened here, or was closed."""


class DuplicateSessionError(SessionError):
    """The session is already open on this stage."""


class PositionError(SessionError):
    """Rows of a session do not continue exactly where its cache ends."""


class InputShapeError(SessionError):
    """Rows have the wrong kind (tokens vs hidden states) or the wrong width."""


class ContextFullError(SessionError):
    """The session's positions would exceed the context the stage was built with."""


class DecodeError(CoreError):
    """llama_decode returned a non-zero status."""

    def __init__(self, code: int) -> None:
        super().__init__(f"llama_decode failed with status {code}")
        self.code = code


class ModelNotFoundError(CoreError):
    """A model name or path could not be resolved to a GGUF file."""


class TokenizerError(CoreError):
    """Tokenizing, detokenizing or applying the chat template failed."""


class NotAModelError(CoreError):
    """A file given as a model is not one a chain can start from: not a GGUF, damaged,
    not a model (an adapter), or only a part of one (a shard)."""


class GgufFormatError(NotAModelError, ValueError):
    """A GGUF file's header is damaged: a count or length that reaches past the end of the
    file, a type or version gguf-py does not know. Also a ValueError, as gguf-py's own
    parse errors are, so code that caught those still catches this."""


class SplitShardError(NotAModelError):
    """A shard of a gguf-split model was given where one whole GGUF is expected."""

    def __init__(self, message: str, shard: int, count: int, first_shard: str) -> None:
        super().__init__(message)
        self.shard = shard
        """1-based, as gguf-split names its files (-00001-of-00003)."""
        self.count = count
        self.first_shard = first_shard


class NotPiecesError(SliceError):
    """A folder given as a model's pieces is missing or holds no manifest.json."""


class CutsError(CoreError):
    """Cut points or a stage's layer range that do not fit the model: not increasing, out
    of its layers, or at a boundary where a chain would not be exact."""

    def __init__(self, message: str, allowed: tuple[int, ...], example: str) -> None:
        super().__init__(message)
        self.allowed = allowed
        """Every boundary this model allows (0 and n_layer included)."""
        self.example = example
        """A value that would work, as the person would type it."""
