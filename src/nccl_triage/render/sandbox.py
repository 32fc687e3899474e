"""The sandbox advice templates render in: safe, and bounded in memory, time and output.

Input: template directories. Output: a Jinja environment whose templates cannot reach outside
the values they are given (Jinja's immutable sandbox: no attribute of Python's internals, no
method that changes a list, dict or set), and cannot take the machine down either:

- every value a template builds (an operator, a call, a filter, a ``~`` join, a ``{% set %}``
  block, a ``{{ }}`` output) is at most :data:`MAX_VALUE_SIZE` characters, and the operations
  that could build a bigger one from small parts (``*``, ``%``-formatting and ``format`` with a
  wide field, ``center``, ``indent``, ``replace``, ``join``) are refused *before* they run;
- every ``{% for %}`` loop, ``range`` and macro call draws from one budget of
  :data:`MAX_ITERATIONS` steps per render, and a render stops after :data:`RENDER_SECONDS`;
- the rendered advice is at most :data:`MAX_OUTPUT` characters.

A template that breaks a bound raises :class:`~jinja2.exceptions.SecurityError` (or
:class:`RenderBudgetExceeded`), which the caller reports as that template's failure.
"""

from __future__ import annotations

import re
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache, wraps
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.filters import FILTERS
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nccl_triage.render.compiled import TemplateCodeCache

MAX_ITERATIONS = 100_000
MAX_VALUE_SIZE = 1_000_000
MAX_OUTPUT = 64 * 1024
RENDER_SECONDS = 2.0

_state = threading.local()


class RenderBudgetExceeded(SecurityError):
    """A render ran out of steps or time."""


def start_budget(seconds: float = RENDER_SECONDS) -> None:
    """Give the current thread's next render its budget of steps and time."""
    _state.left = MAX_ITERATIONS
    _state.deadline = time.monotonic() + seconds


def _step(n: int = 1) -> None:
    left = getattr(_state, "left", MAX_ITERATIONS) - n
    if left < 0:
        raise RenderBudgetExceeded(f"template loops exceed {MAX_ITERATIONS} steps")
    _state.left = left
    if time.monotonic() > getattr(_state, "deadline", float("inf")):
        raise RenderBudgetExceeded(f"template ran longer than {RENDER_SECONDS:g} s")


def size_of(value: Any, limit: int = MAX_VALUE_SIZE) -> int:
    """Estimate how many characters ``str(value)`` has, stopping once past ``limit``."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool | int | float) or value is None:
        return 24
    if isinstance(value, dict):
        items: Iterable[Any] = (x for kv in value.items() for x in kv)
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        return 64
    total = 2
    for item in items:
        total += size_of(item, limit - total) + 2
        if total > limit:
            break
    return total


def _check_size(value: Any, what: str = "value") -> Any:
    if size_of(value) > MAX_VALUE_SIZE:
        raise SecurityError(f"template {what} longer than {MAX_VALUE_SIZE:,} characters")
    return value


def _check_int(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_VALUE_SIZE:
        raise SecurityError(f"template {what} too large ({value})")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")
_DIGITS = re.compile(r"\d+")


def _check_percent_format(fmt: str) -> None:
    """Refuse ``%``-formatting whose fields could be wide: ``'%0500000000d' % 1``."""
    for m in _PERCENT_SPEC.finditer(fmt):
        for part in (m[1], m[2]):
            if part == "*":
                raise SecurityError("template %-format with a * width")
            if part is not None:
                _check_int(int(part), "format width")


def _check_brace_format(fmt: str) -> None:
    """Refuse ``str.format`` whose fields could be wide: ``'{:500000000}'.format(1)``."""
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # the call itself fails with this error
    for _text, _field, spec, _conv in parsed:
        for digits in _DIGITS.findall(spec or ""):
            _check_int(int(digits), "format width")


def _check_str_call(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a string method whose result would be too large, before it runs."""
    if name in ("format", "format_map"):
        _check_brace_format(text)
    elif name in ("center", "ljust", "rjust", "zfill") and args:
        _check_int(args[0], "width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int) and text.count("\t") * tab > MAX_VALUE_SIZE:
            raise SecurityError("template value too large")
    elif name == "replace" and len(args) >= 2:
        _check_replace(text, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        _check_join(text, args[0])


def _check_replace(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    if len(text) + hits * (len(new) - len(old)) > MAX_VALUE_SIZE:
        raise SecurityError("template value too large")


def _check_join(sep: Any, items: Any) -> None:
    if (
        isinstance(items, list | tuple)
        and isinstance(sep, str)
        and size_of(items) + len(sep) * len(items) > MAX_VALUE_SIZE
    ):
        raise SecurityError("template value too large")


def _guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A builtin filter with its result bounded, and its known blow-ups refused first."""

    @wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _step()
        # Filters marked pass_eval_context / pass_environment get that first: skip it.
        values = [
            a for a in args if not isinstance(a, jinja2.nodes.EvalContext | jinja2.Environment)
        ]
        value = values[0] if values else None
        rest = values[1:]
        if name == "format" and isinstance(value, str):
            _check_percent_format(value)
        elif name in ("center", "indent", "wordwrap", "truncate"):
            for arg in (*rest, *kwargs.values()):
                _check_int(arg, "width")
            width = rest[0] if rest else kwargs.get("width", 4)
            pad = len(width) if isinstance(width, str) else width
            if (
                name == "indent"
                and isinstance(value, str)
                and isinstance(pad, int)
                and (value.count("\n") + 1) * pad > MAX_VALUE_SIZE
            ):
                raise SecurityError("template value too large")
        elif name == "replace" and len(rest) >= 2:
            _check_replace(value, rest[0], rest[1], rest[2] if len(rest) > 2 else -1)
        elif name == "join":
            sep = rest[0] if rest else kwargs.get("d", "")
            _check_join(sep, value if isinstance(value, list | tuple) else None)
        return _check_size(func(*args, **kwargs))

    return guarded


def _budgeted_range(*args: int) -> range:
    for arg in args:
        _check_int(arg, "range")
    r = range(*args)
    _step(len(r))
    return r


@jinja2.pass_context
def _loop_budget(_context: Any, iterable: Any) -> Iterator[Any]:
    """Every ``{% for %}`` loop's iterable passes through here: one step per item."""
    for item in iterable:
        _step()
        yield item


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with loops, ``~`` joins and set blocks routed through checks."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, "_loop_budget", [], [], None, None)
            loop.iter.set_lineno(loop.lineno)
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with every value, loop, call and render bounded."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.globals = {"range": _budgeted_range, "dict": dict}
        self.filters = {name: _guarded_filter(name, f) for name, f in FILTERS.items()}
        self.filters["_loop_budget"] = _loop_budget
        self.finalize = self._finalize

    @staticmethod
    def _finalize(value: Any) -> Any:
        return _check_size(value, "output")

    def concat(self, parts: Iterable[Any]) -> str:
        """Join a ``{% set %}`` block's output (and a render's), bounded."""
        parts = list(parts)
        _check_size(parts)
        return "".join(parts)

    def checked_join(self, parts: tuple[Any, ...]) -> str:
        """The ``~`` operator, bounded."""
        _step()
        _check_size(parts)
        return "".join(str(p) for p in parts)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call a function, method or macro: one step, arguments and result bounded."""
        _step()
        for value in (*args, *kwargs.values()):
            _check_int(value, "argument")
        target = getattr(obj, "__wrapped__", obj)
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            _check_str_call(owner, getattr(target, "__name__", ""), args, kwargs)
        return _check_size(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Apply ``*``, ``**``, ``+``, ``%`` or ``//``: refused first when the result would be huge."""
        _step()
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise SecurityError("template exponent too large")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and size_of(seq) * n > MAX_VALUE_SIZE
                ):
                    raise SecurityError("template value too large")
        if operator == "%" and isinstance(left, str):
            _check_percent_format(left)
        return _check_size(super().call_binop(context, operator, left, right))


@cache
def environment(
    dirs: tuple[Path, ...], filters: tuple[tuple[str, Callable[..., Any]], ...]
) -> BoundedSandbox:
    """The bounded sandbox for ``dirs``, with the project's own ``filters`` added."""
    env = BoundedSandbox(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        auto_reload=False,  # a template is read once per process, not checked at every use
        bytecode_cache=TemplateCodeCache(Path(__file__)),  # compiled once per source
    )
    env.filters.update({name: _guarded_filter(name, f) for name, f in filters})
    return env


def render_bounded(template: jinja2.Template, context: dict[str, Any]) -> str:
    """Render a template with a fresh budget, stopping once the output passes the cap."""
    start_budget()
    out: list[str] = []
    size = 0
    for chunk in template.generate(**context):
        size += len(chunk)
        if size > MAX_OUTPUT:
            raise SecurityError(f"advice longer than {MAX_OUTPUT // 1024} KiB")
        out.append(chunk)
    return "".join(out)
