"""The GGUF's own chat template, run in Jinja's sandbox (core.chat_template): ChatML as
SmolLM2 writes it, the names templates use, and hostile or broken templates refused with
a typed error."""

from __future__ import annotations

import pytest

from core.chat_template import (
    MAX_TEMPLATE_CHARS,
    ChatTemplateError,
    is_jinja_template,
    render_chat_template,
)
from core.errors import TokenizerError

pytestmark = pytest.mark.unit

# SmolLM2-135M-Instruct's tokenizer.chat_template, as its GGUF carries it.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chatml_with_the_default_system_turn() -> None:
    text = render_chat_template(SMOLLM2, [("user", "What is 2 + 2?")])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_given_system_turn_replaces_the_default_and_turns_keep_their_order() -> None:
    msgs = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")]
    text = render_chat_template(SMOLLM2, msgs, add_generation_prompt=False)
    assert "SmolLM" not in text
    assert text == "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in msgs)


def test_bos_eos_and_whitespace_handling_follow_the_convention() -> None:
    tmpl = (
        "{{ bos_token }}\n  {% for m in messages %}\n"
        "[{{ m.role }}] {{ m.content }}{{ eos_token }}\n  {% endfor %}\n"
    )
    text = render_chat_template(tmpl, [("user", "a")], bos_token="<s>", eos_token="</s>")
    # lstrip_blocks and trim_blocks: block tags leave no indentation or newline behind.
    assert text == "<s>\n[user] a</s>\n"


def test_content_is_not_escaped_or_interpreted() -> None:
    text = render_chat_template(SMOLLM2, [("user", "<b>{{ 7 * 7 }}</b> & {% if %}")])
    assert "<b>{{ 7 * 7 }}</b> & {% if %}" in text


def test_a_template_that_refuses_raises_its_reason() -> None:
    tmpl = (
        "{% if messages[0]['role'] == 'assistant' %}"
        "{{ raise_exception('must start with user') }}{% endif %}ok"
    )
    assert render_chat_template(tmpl, [("user", "x")]) == "ok"
    with pytest.raises(ChatTemplateError, match="must start with user"):
        render_chat_template(tmpl, [("assistant", "x")])


def test_loop_controls_and_strftime_are_available() -> None:
    tmpl = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.content }}{% endfor %}|{{ strftime_now('%Y')|length }}"
    )
    assert render_chat_template(tmpl, [("user", "a"), ("user", "b")]) == "a|4"


@pytest.mark.parametrize(
    "hostile",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set _ = messages.append({'role': 'x'}) %}",
        "{% for i in range(10**9) %}{% endfor %}",
    ],
)
def test_the_sandbox_refuses_internals_mutation_and_huge_ranges(hostile: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat_template(hostile, [("user", "x")])


def test_unsafe_attributes_read_as_nothing() -> None:
    assert render_chat_template("[{{ raise_exception.__globals__ }}]", [("user", "x")]) == "[]"


@pytest.mark.parametrize(
    "broken", ["{% for m in messages %}", "{{ 1 / 0 }}", "{{ messages[5].x() }}"]
)
def test_broken_templates_are_a_typed_error(broken: str) -> None:
    with pytest.raises(ChatTemplateError) as info:
        render_chat_template(broken, [("user", "x")])
    assert isinstance(info.value, TokenizerError)  # callers that catch the tokenizer's errors


def test_oversized_templates_and_non_text_messages_are_refused() -> None:
    with pytest.raises(ChatTemplateError, match="characters"):
        render_chat_template("x" * (MAX_TEMPLATE_CHARS + 1), [("user", "x")])
    with pytest.raises(ChatTemplateError, match="text"):
        render_chat_template(SMOLLM2, [("user", 5)])  # type: ignore[list-item]


def test_jinja_is_told_from_builtin_names() -> None:
    assert is_jinja_template(SMOLLM2)
    assert not is_jinja_template("gemma") and not is_jinja_template("chatml")
