"""A model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja text),
rendered in Jinja's immutable sandbox.

Why not llama.cpp's `llama_chat_apply_template`: it does not run the template, it guesses
a built-in format from marker strings and writes that, so parts of a real template are
lost (SmolLM2's default system turn, for one). Why a sandbox: the template comes with a
downloaded model file, so it is untrusted input; the sandbox refuses attribute access to
Python internals, cannot mutate what it is given, and bounds `range`.

The names a template may use are the ones chat templates are written against:
`messages` (dicts with `role` and `content`), `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception(msg)` and `strftime_now(fmt)`.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from functools import lru_cache
from typing import NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from core.errors import TokenizerError

__all__ = ["ChatTemplateError", "is_jinja_template", "render_chat_template"]

MAX_TEMPLATE_CHARS = 64 * 1024
"""Real templates are a few KiB; anything far larger is not one we should run."""
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
"""A rendered prompt longer than this is a template misbehaving (the model's context is
far smaller anyway)."""


class ChatTemplateError(TokenizerError):
    """The model's chat template is malformed, refused these messages, or misbehaved."""


def is_jinja_template(text: str) -> bool:
    """True for a Jinja text; False for a llama.cpp built-in's name such as "gemma"."""
    return "{{" in text or "{%" in text


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to refuse, e.g. "Conversation roles must alternate".
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    # trim_blocks/lstrip_blocks: templates are written for this whitespace handling.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined,
        autoescape=False,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: Sequence[tuple[str, str]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """The prompt text for (role, content) messages, as the model was trained to read it."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(
            f"the chat template is {len(template)} characters; more than "
            f"{MAX_TEMPLATE_CHARS} is not a template this program runs"
        )
    for role, content in messages:
        if not isinstance(role, str) or not isinstance(content, str):
            raise ChatTemplateError("each message needs a text role and text content")
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the model's chat template is malformed: {exc}") from None
    try:
        text = compiled.render(
            messages=[{"role": role, "content": content} for role, content in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        # SecurityError (sandbox refusals) is a TemplateError too.
        raise ChatTemplateError(f"the model's chat template failed: {exc}") from None
    except (
        TypeError,
        ValueError,
        LookupError,
        AttributeError,
        ArithmeticError,
        RecursionError,
    ) as exc:
        raise ChatTemplateError(
            f"the model's chat template failed: {type(exc).__name__}: {exc}"
        ) from None
    if len(text) > MAX_OUTPUT_CHARS:
        raise ChatTemplateError("the model's chat template produced an oversized prompt")
    return text
