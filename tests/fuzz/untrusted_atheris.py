"""Coverage-guided fuzzing (atheris, libFuzzer) of what a volunteer's PC reads from others:
a coordinator's answers, a model file's GGUF header and its chat template. Bounded:

    python tests/fuzz/untrusted_atheris.py TARGET -runs=20000 -max_total_time=10 [CORPUS]

TARGET is one of:

- `answers`: the input's first byte picks a reader (a contract message's from_json, a
  manifest, a name); the rest is JSON for it (or text, for a name and a manifest). Every
  outcome is a value or MalformedAnswer (UnsafeName is one) / SliceError.
- `gguf`: the input is a GGUF file, mutated from tiny valid ones. `open_gguf` reads it or
  raises GgufFormatError, and every field it read can be read back; the address space is
  capped (RLIMIT_AS) so that a header which makes the reader allocate beyond its file's
  size is a crash, not a slow machine.
- `template`: the input is a chat template (UTF-8, errors replaced), rendered with two
  messages. Every outcome is text within MAX_OUTPUT_CHARS or ChatTemplateError.

Anything else is a crash (libFuzzer stops and writes the input as crash-*).
tests/unit/test_untrusted_atheris.py runs each target in CI from its seed corpus.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import contextlib

import jinja2  # noqa: F401  (imported before instrumenting: only the project's code is)
import numpy  # noqa: F401
from gguf import GGUFReader  # noqa: F401

with atheris.instrument_imports(include=["coordinator", "core"]):
    from coordinator import contract as c
    from coordinator.errors import MalformedAnswer
    from coordinator.names import check_name
    from core.chat_template import MAX_OUTPUT_CHARS, ChatTemplateError, render_chat_template
    from core.errors import GgufFormatError, SliceError
    from core.gguf_reader import open_gguf
    from core.manifest import Manifest

ADDRESS_SPACE = 3 << 30
"""The gguf target's cap: several times what the interpreter, numpy and gguf-py map."""

# ---------------------------------------------------------------- answers

READERS: list[Callable[[Any], object]] = [
    c.CaAnswer.from_json,
    c.JoinAnswer.from_json,
    c.Assignment.from_json,
    c.HeartbeatAnswer.from_json,
    c.RouteAnswer.from_json,
    c.TurnAnswer.from_json,
    c.Signal.from_json,
]


def answer_seeds() -> list[bytes]:
    assignment = {
        "model": "default",
        "layers": [0, 9],
        "next_hop": {"node_id": "worker-b", "address": "10.0.0.2:7000"},
        "manifest_url": c.manifest_path("default"),
        "pieces_url": c.pieces_path("default"),
        "max_sessions": 8,
        "context_tokens": 256,
    }
    docs: list[Any] = [
        {"certificate_pem": "PEM", "fingerprint": "ab" * 32},
        {
            "node_id": "worker-a",
            "role": "worker",
            "certificate_pem": "C",
            "ca_certificate_pem": "CA",
            "token": "t",
            "expires_at": "2026-01-02T03:04:05+00:00",
        },
        assignment,
        {"assignment": assignment, "revoked_serials": ["12"], "standby": None},
        {"model": "default", "stages": [{"node_id": "w", "address": "a:1", "layers": [0, 9]}]},
        {"host": "r", "port": 3478, "username": "1:w", "password": "p", "ttl_s": 60, "uris": []},
        {"sender": "w", "kind": "offer", "link": "l", "payload": {"candidates": ["c"], "x": 1}},
    ]
    seeds = [bytes([i]) + json.dumps(doc).encode() for i, doc in enumerate(docs)]
    manifest = {
        "format": "sangama-manifest/1",
        "facts": {"architecture": "llama", "n_layer": 1},
        "source": {"sha256": "0" * 64, "size": 1},
        "pieces": [
            {"name": "blk.000", "file": "b", "kind": "block", "layer": 0, "sha256": "0", "size": 1}
        ],
    }
    seeds.append(bytes([len(READERS)]) + json.dumps(manifest).encode())
    seeds.append(bytes([len(READERS) + 1]) + b"gemma-3-270m")
    return seeds


def one_answer(data: bytes) -> None:
    if not data:
        return
    which, rest = data[0] % (len(READERS) + 2), data[1:]
    text = rest.decode("utf-8", errors="replace")
    if which == len(READERS):
        with contextlib.suppress(SliceError):
            Manifest.from_json(text)
        return
    if which == len(READERS) + 1:
        with contextlib.suppress(MalformedAnswer):
            assert check_name(text) == text
        return
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return  # the client's JSON parsing is not what is fuzzed here
    with contextlib.suppress(MalformedAnswer):
        READERS[which](doc)


# ---------------------------------------------------------------- gguf

_GGUF_PATH = Path(tempfile.mkdtemp(prefix="gguf-fuzz-")) / "input.gguf"


def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def gguf_seeds() -> list[bytes]:
    header = b"GGUF" + struct.pack("<I", 3)
    kv = _s(b"general.architecture") + struct.pack("<I", 8) + _s(b"llama")
    kv += _s(b"general.alignment") + struct.pack("<II", 4, 32)
    kv += (
        _s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + _s(b"a") + _s(b"bc") + _s(b"")
    )
    kv += _s(b"tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 1, 2)
    tensor = _s(b"token_embd.weight") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0)  # f32 4x2
    body = header + struct.pack("<QQ", 1, 4) + kv + tensor
    body += bytes(-len(body) % 32) + struct.pack("<8f", *range(8))
    return [body, header + struct.pack("<QQ", 0, 0)]


def one_gguf(data: bytes) -> None:
    _GGUF_PATH.write_bytes(data)
    try:
        reader = open_gguf(_GGUF_PATH)
    except GgufFormatError:
        return
    for field in reader.fields.values():
        # gguf-py decodes texts only when asked: a key's bytes that are not UTF-8 are a
        # UnicodeDecodeError (a ValueError, which readers of a header catch), nothing else.
        with contextlib.suppress(UnicodeDecodeError):
            field.contents()


# ---------------------------------------------------------------- template

TEMPLATE_SEEDS = [
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content|trim }}"
    " [/INST]{% else %}{{ m.content ~ eos_token }}{% endif %}{% endfor %}",
    "{% set ns = namespace(s='') %}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}"
    "{{ ns.s * 2 }}{{ messages|map(attribute='content')|join(', ')|center(20) }}",
    "{{ raise_exception('roles must alternate') if messages|length > 9 }}{{ strftime_now('%Y') }}",
]


def one_template(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        out = render_chat_template(text, [("system", "Be brief."), ("user", "Hi")])
    except ChatTemplateError:
        return
    assert len(out) <= MAX_OUTPUT_CHARS


# ---------------------------------------------------------------- running

TARGETS: dict[str, tuple[Callable[[bytes], None], Callable[[], list[bytes]]]] = {
    "answers": (one_answer, answer_seeds),
    "gguf": (one_gguf, gguf_seeds),
    "template": (one_template, lambda: [t.encode() for t in TEMPLATE_SEEDS]),
}


def write_seeds(target: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(TARGETS[target][1]()):
        (directory / f"seed-{i}").write_bytes(seed)


if __name__ == "__main__":
    target = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--write-seeds":
        write_seeds(target, Path(sys.argv[3]))
        sys.exit(0)
    if target == "gguf":
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    os.environ.setdefault("PYTHONHASHSEED", "0")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[target][0])
    atheris.Fuzz()
