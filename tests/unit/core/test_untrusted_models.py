"""A downloaded model file is untrusted input: its GGUF header cannot make the reader
allocate beyond the file's size, and its chat template runs within step, time and size
budgets. Every refusal is a typed error."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import core.chat_template as ct
from core.chat_template import ChatTemplateError, render_chat_template
from core.errors import GgufFormatError, NotAModelError
from core.gguf_reader import open_gguf

pytestmark = pytest.mark.unit

STRING, ARRAY, UINT32 = 8, 9, 4


def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(kv: bytes, n_kv: int = 1, n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv


def _claims_strings(count: int) -> bytes:
    """133 bytes whose one key says it is an array of `count` strings."""
    kv = _s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, count)
    data = _header(kv)
    return data + bytes(133 - len(data))


@pytest.mark.parametrize(
    "data",
    [
        _claims_strings(4_000_000),
        _header(_s(b"a") + struct.pack("<IIQ", ARRAY, UINT32, 1 << 40)),  # uint32s
        _header(_s(b"a") + struct.pack("<IQ", STRING, 1 << 50) + b"abc"),  # one long string
        _header(
            _s(b"a") + struct.pack("<IIQ", ARRAY, STRING, 2) + _s(b"x") + struct.pack("<Q", 99)
        ),
        _header(b"", n_kv=1 << 40),  # more keys than bytes
        _header(b"", n_kv=0, n_tensors=1 << 40),
        _header(_s(b"a") + struct.pack("<I", 99) + bytes(8)),  # an unknown value type
        b"GGUF" + struct.pack("<I", 999) + bytes(16),  # an unknown version
    ],
)
def test_a_gguf_header_that_claims_more_than_the_file_is_a_typed_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "evil.gguf"
    path.write_bytes(data)
    with pytest.raises(GgufFormatError) as caught:
        open_gguf(path)
    assert isinstance(caught.value, NotAModelError) and isinstance(caught.value, ValueError)


def test_the_133_byte_file_claiming_four_million_strings_stays_small(tmp_path: Path) -> None:
    # In a child with its address space capped at 1 GiB: the reader built 1.4 GiB of
    # views for this file before it checked counts against the file size.
    path = tmp_path / "evil.gguf"
    path.write_bytes(_claims_strings(4_000_000))
    child = textwrap.dedent(
        f"""
        import resource, sys
        from core.gguf_reader import open_gguf
        from core.errors import GgufFormatError
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        try:
            open_gguf({str(path)!r})
        except GgufFormatError:
            sys.exit(0)
        sys.exit(3)
        """
    )
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        [sys.executable, "-c", child], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_real_header_still_reads(tmp_path: Path) -> None:
    kv = _s(b"general.architecture") + struct.pack("<I", STRING) + _s(b"llama")
    kv += _s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 3)
    kv += _s(b"a") + _s(b"bc") + _s(b"")
    path = tmp_path / "ok.gguf"
    path.write_bytes(_header(kv, n_kv=2) + bytes(32))
    reader = open_gguf(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["tokenizer.ggml.tokens"].contents() == ["a", "bc", ""]


# ----------------------------------------------------------------------------- templates

NESTED_LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
)


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ 'x' * 400000000 }}", "would build"),
        ("{{ [0] * 400000000 }}", "would build"),
        ("{{ ''.ljust(400000000) }}", "would build"),
        ("{{ 'x'|center(400000000) }}", "would build"),
        ("{{ '%400000000s' % 'x' }}", "would build"),
        ("{{ '%400000000s'|format('x') }}", "would build"),
        ("{{ '{:>400000000}'.format('x') }}", "would build"),
        ("{{ ('a\\n' * 1000)|indent(100000) }}", "would build"),
        ("{{ 2 ** 100000000 }}", "raised a number"),
        (
            "{% set ns = namespace(s='xx') %}{% for i in range(60) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "would build",
        ),
        (
            "{% set ns = namespace(s='xx') %}{% for i in range(60) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "would build",
        ),
        (NESTED_LOOPS, "steps"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}"
            "{% endfor %}",
            "steps|oversized",
        ),
        ("{% for m in messages %}{{ lipsum(100000000) }}{% endfor %}", "lipsum|would build"),
        # Small in memory (references to one text), huge when printed or joined.
        ("{% set a = [['x' * 3000000]] * 3000000 %}{{ a }}", "would build"),
        ("{% set a = ['x' * 3000000, 'y' * 3000000] %}{{ a|join }}", "would build"),
        ("{% set a = ['x' * 3000000, 'y' * 3000000] %}{{ a }}", "would build"),
        ("{{ dict(a=1)|tojson(indent=100000000) }}", "would build"),
    ],
)
def test_a_template_beyond_its_budgets_is_a_typed_error(template: str, says: str) -> None:
    with pytest.raises(ChatTemplateError, match=says):
        render_chat_template(template, [("user", "hi")])


def test_brackets_nested_past_the_parsers_recursion_are_a_typed_error() -> None:
    # Found by tests/fuzz/untrusted_atheris.py: Jinja's parser recursed until RecursionError.
    with pytest.raises(ChatTemplateError, match="malformed"):
        render_chat_template("{% set" + "[" * 3000 + " x = 1 %}", [("user", "hi")])


def test_the_time_budget_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ct, "MAX_RENDER_S", -1.0)  # already past: the first step refuses
    with pytest.raises(ChatTemplateError, match="ran longer"):
        render_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}", [("user", "x")])


def test_the_output_budget_counts_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ct, "MAX_OUTPUT_CHARS", 1000)
    with pytest.raises(ChatTemplateError, match="oversized"):
        render_chat_template("{% for i in range(5000) %}x{% endfor %}", [("user", "hi")])


def test_templates_real_models_use_still_render() -> None:
    template = (
        "{{ bos_token }}{% for m in messages|reverse|list|reverse %}"
        "{% if loop.first and m['role'] == 'system' %}{% set sys = m.content|trim %}{% endif %}"
        "{{ '<|' ~ m['role'] ~ '|>\\n' + m['content'].strip() + eos_token }}"
        "{{ '%02d'|format(loop.index) }}{{ loop.length }}{% endfor %}"
        "{{ messages|map(attribute='content')|join(', ')|truncate(50) }}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    text = render_chat_template(
        template, [("system", " Be brief. "), ("user", "Hi")], bos_token="<s>", eos_token="</s>"
    )
    assert text.startswith("<s><|system|>\nBe brief.</s>012<|user|>\nHi</s>022")
    assert text.endswith("<|assistant|>\n")
    # A long conversation is far inside the budgets.
    long = [("user" if i % 2 == 0 else "assistant", "word " * 200) for i in range(400)]
    assert len(render_chat_template(template, long)) > 400 * 1000
