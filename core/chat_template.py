"""A model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja text),
rendered in Jinja's immutable sandbox.

Why not llama.cpp's `llama_chat_apply_template`: it does not run the template, it guesses
a built-in format from marker strings and writes that, so parts of a real template are
lost (SmolLM2's default system turn, for one). Why a sandbox: the template comes with a
downloaded model file, so it is untrusted input; the sandbox refuses attribute access to
Python internals, cannot mutate what it is given, and bounds `range`.

The sandbox alone bounds no resources: a template with nested loops can run for minutes
and `{{ 'x' * 400000000 }}` allocates gigabytes before anything is returned. So each render
has three budgets, and exceeding one raises ChatTemplateError:

- steps (MAX_STEPS): every loop iteration, call, filter, attribute or item access and
  intercepted operator counts one. Loops are counted by rewriting each `for`'s iterable
  into a counting one when the template is compiled (`_Budgeted._parse`).
- time (MAX_RENDER_S), checked at each step and each piece of output.
- size (MAX_OUTPUT_CHARS): the output as it streams, and every value a call, filter or
  operator would build, estimated from its operands *before* it is built (`'x' * n`,
  `ljust(n)`, `indent(n)`, `replace`, `'%9999999s' % x`), then checked after. `~`
  (concatenation) is rewritten into a checked call too, so a string that doubles at each
  step stops at the budget.

The names a template may use are the ones chat templates are written against:
`messages` (dicts with `role` and `content`), `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception(msg)` and `strftime_now(fmt)`; Jinja's `lipsum` (text of
any length on request) is removed.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from core.errors import TokenizerError

__all__ = ["ChatTemplateError", "is_jinja_template", "render_chat_template"]

MAX_TEMPLATE_CHARS = 64 * 1024
"""Real templates are a few KiB; anything far larger is not one we should run."""
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
"""A rendered prompt longer than this is a template misbehaving (the model's context is
far smaller anyway); no value a template builds may be longer either."""
MAX_STEPS = 1_000_000
"""Loop iterations, calls, filters and lookups in one render: a real template takes a few
dozen per message."""
MAX_RENDER_S = 2.0
"""A real template renders in milliseconds."""


class ChatTemplateError(TokenizerError):
    """The model's chat template is malformed, refused these messages, or misbehaved."""


def is_jinja_template(text: str) -> bool:
    """True for a Jinja text; False for a llama.cpp built-in's name such as "gemma"."""
    return "{{" in text or "{%" in text


class _Budget:
    """One render's steps and deadline; a ContextVar holds the one in force."""

    __slots__ = ("deadline", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.deadline = time.monotonic() + MAX_RENDER_S

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ChatTemplateError(f"the model's chat template took more than {MAX_STEPS} steps")
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the model's chat template ran longer than {MAX_RENDER_S} s")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None
)


def _step() -> None:
    budget = _BUDGET.get()
    if budget is None:  # compiled templates only run inside render_chat_template
        raise ChatTemplateError("a chat template ran outside its budget")
    budget.step()


def _size(value: object) -> int:
    """About how many characters `value` prints as, to estimate what an operation on it
    would build: a text's length; for a container, its texts and separators, walked
    without recursion and given up once past MAX_OUTPUT_CHARS (a list of a million
    references to one long text is small in memory and huge printed)."""
    if isinstance(value, str | bytes):
        return len(value)
    if not isinstance(value, list | tuple | dict | set | frozenset):
        return 0
    total = 0
    pending: list[object] = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, str | bytes):
            total += len(node) + 2
        elif isinstance(node, dict):
            total += 2 + 4 * len(node)
            if total <= MAX_OUTPUT_CHARS:
                pending.extend(node.keys())
                pending.extend(node.values())
        elif isinstance(node, list | tuple | set | frozenset):
            total += 2 + 2 * len(node)
            if total <= MAX_OUTPUT_CHARS:
                pending.extend(node)
        else:
            total += 1
        if total > MAX_OUTPUT_CHARS:
            break
    return total


def _too_big(what: str, estimate: int) -> None:
    if estimate > MAX_OUTPUT_CHARS:
        raise ChatTemplateError(
            f"the model's chat template would build {what} of about {estimate} characters"
        )


_WIDTHS = re.compile(r"(\d+)")


_SIZED = (str, bytes, list, tuple, dict)
_MULTIPLYING = frozenset({"indent", "expandtabs"})
"""Operations whose integer operand multiplies the result (a width per line or per tab);
for the others (`center`, `ljust`, `truncate`, ...) it is at most added."""


def _check_operands(what: str, operands: Sequence[object], *, multiply: bool = False) -> None:
    """Refuse an operation on texts or lists whose result could exceed the size budget,
    before it runs. Two texts bound it by their product (`replace(old, new)` makes up to
    len(text) x len(new)); an integer operand adds to that, or multiplies it where
    `multiply` (`'x' * n`, `indent(n)`)."""
    if not any(isinstance(o, _SIZED) for o in operands):
        return  # arithmetic on numbers builds nothing large
    sizes = [*sorted((_size(o) for o in operands), reverse=True), 0, 0]
    counts = [abs(o) for o in operands if isinstance(o, int) and not isinstance(o, bool)]
    estimate = max(sizes[0], 1) * max(1, sizes[1])
    count = max(counts, default=0)
    _too_big(what, estimate * max(1, count) if multiply else estimate + count)


def _check_result(what: str, value: object) -> object:
    _too_big(what, _size(value))
    return value


def _check_format(what: str, spec: object) -> None:
    """A format string's widths and precisions (`%9999999s`, `{:>9999999}`) pad the result
    to that many characters."""
    if isinstance(spec, str):
        for digits in _WIDTHS.findall(spec):
            if len(digits) > 9 or int(digits) > MAX_OUTPUT_CHARS:
                _too_big(what, int(digits[:12]))


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """A `for` loop's iterable, one step per iteration."""
    for item in iterable:
        _step()
        yield item


def _concat(*parts: object) -> str:
    """The `~` operator, within the size budget."""
    _too_big("a concatenation", sum(_size(p) for p in parts))
    return str(_check_result("a concatenation", "".join(str(p) for p in parts)))


_LOOP_ITER = "__sangama_counted__"
_CONCAT = "__sangama_concat__"


class _CountLoops(NodeTransformer):
    """Every `for` iterates a counting generator; every `~` becomes a checked call."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.Name(_LOOP_ITER, "load"), [node.iter], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(
            nodes.Name(_CONCAT, "load"), list(node.nodes), [], None, None, lineno=node.lineno
        )


def _finalize(value: object) -> object:
    """Each `{{ ... }}` value before Jinja prints it with str()."""
    _too_big("a printed value", _size(value))
    return value


def _budgeted_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)  # keeps jinja_pass_arg: pass_context filters still get it
    def run(*args: Any, **kwargs: Any) -> Any:
        _step()
        operands = [*args, *kwargs.values()]
        _check_operands(f"the filter {name}", operands, multiply=name in _MULTIPLYING)
        if name == "format" and args:
            _check_format(f"the filter {name}", args[0])
        return _check_result(f"the filter {name}", func(*args, **kwargs))

    return run


class _Budgeted(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the render budgets: calls, lookups and operators each
    take a step and are size-checked; loops and `~` are rewritten when compiled."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        rewritten = _CountLoops().visit(tree)
        assert isinstance(rewritten, nodes.Template)
        return rewritten

    def call(
        __self,
        __context: jinja2.runtime.Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        _step()
        if __obj is _counted or __obj is _concat:  # our own rewrites check themselves
            return super().call(__context, __obj, *args, **kwargs)
        bound = getattr(__obj, "__self__", None)
        operands = [bound, *args, *kwargs.values()]
        name = getattr(__obj, "__name__", "")
        what = f"a call of {name or 'a function'}"
        _check_operands(what, operands, multiply=name in _MULTIPLYING)
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_result(what, result)

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        _step()
        what = f"the operator {operator}"
        if operator == "**":
            # Powers of huge integers take as long as they are long.
            if isinstance(right, int) and abs(right) > 4096:
                raise ChatTemplateError(f"the model's chat template raised a number to {right}")
        elif operator == "%":
            _check_format(what, left)
        elif operator == "*":
            _check_operands(what, [left, right], multiply=True)
        elif operator == "+":
            _too_big(what, _size(left) + _size(right))
        return _check_result(what, super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _step()
        if isinstance(obj, str) and attribute in ("format", "format_map"):
            # The sandbox hands out a wrapper that no longer shows the format string.
            _check_format("a call of format", obj)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _step()
        return super().getitem(obj, argument)


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to refuse, e.g. "Conversation roles must alternate".
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    # trim_blocks/lstrip_blocks: templates are written for this whitespace handling.
    env = _Budgeted(
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined,
        autoescape=False,
    )
    env.globals.pop("lipsum", None)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals[_LOOP_ITER] = _counted
    env.globals[_CONCAT] = _concat
    env.filters = {name: _budgeted_filter(name, f) for name, f in env.filters.items()}
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
    except (jinja2.TemplateError, RecursionError) as exc:
        # RecursionError: brackets nested deeper than Jinja's recursive parser goes.
        raise ChatTemplateError(f"the model's chat template is malformed: {exc}"[:1000]) from None
    budget = _Budget()
    token = _BUDGET.set(budget)
    try:
        pieces: list[str] = []
        length = 0
        for piece in compiled.generate(
            messages=[{"role": role, "content": content} for role, content in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        ):
            length += len(piece)
            if length > MAX_OUTPUT_CHARS:
                raise ChatTemplateError("the model's chat template produced an oversized prompt")
            budget.step()
            pieces.append(piece)
        text = "".join(pieces)
    except ChatTemplateError:
        raise
    except MemoryError:
        raise ChatTemplateError("the model's chat template ran out of memory") from None
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
            f"the model's chat template failed: {type(exc).__name__}: {exc}"[:1000]
        ) from None
    finally:
        _BUDGET.reset(token)
    return text
