"""The Lark grammar of NCCL, process-group and torchrun messages, and its transformer.

Input: one message (prefixes peeled, terminal damage undone). Output: a flat dict of event
fields (``kind`` included), or None when the text is not a message the grammar knows.

Only this package imports lark. The parser is built once per process (LALR, contextual lexer);
its tables ship with the package as plain data (dictionaries, lists, tuples, text, numbers: so
checked as they are written) in ``marshal``'s format (``nccl_tables.marshal``, written by
``python -m nccl_triage.parse.grammar``), so a process loads them in two hundredths of a second
instead of building them (JSON took 5 ms more to decode). Tables written for another grammar
text or another Lark version, or that do not decode, are ignored, and the parser is built as
before.
"""

from __future__ import annotations

import hashlib
import marshal
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import lark
from lark import Lark
from lark.exceptions import LarkError, VisitError
from lark.grammar import Rule
from lark.lexer import TerminalDef

from nccl_triage.parse.fields_common import Fields, NotAMessage
from nccl_triage.parse.fields_libs import LibraryFields
from nccl_triage.parse.fields_torch import TorchFields

TABLES = "nccl_tables.marshal"
_HERE = resources.files("nccl_triage.parse")


@cache
def parser() -> Lark:
    """Return the grammar's LALR parser (loaded or built once per process)."""
    text = _grammar_text()
    loaded = _load_tables(_HERE / TABLES, stamp(text))
    return loaded if loaded is not None else _build(text)


def _grammar_text() -> str:
    return (_HERE / "nccl.lark").read_text("utf-8")


def _build(text: str) -> Lark:
    return Lark(text, parser="lalr", lexer="contextual", maybe_placeholders=False)


def stamp(text: str) -> str:
    """What the tables were made from: the grammar's text and the Lark version."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return f"{digest} lark {lark.__version__}"


def _load_tables(path: Path | Traversable, want: str) -> Lark | None:
    try:
        blob = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if not isinstance(blob, dict) or blob.get("stamp") != want:
        return None
    try:
        data, memo = blob["data"], blob["memo"]
        loaded: Lark = Lark._load_from_dict(data, memo)  # type: ignore[no-untyped-call]
        return loaded
    except Exception:  # noqa: BLE001 - tables of another shape: build the parser instead
        return None


def write_tables(path: Path) -> None:
    """Write the parser's tables: plain data only, in ``marshal``'s format."""
    text = _grammar_text()
    data, memo = _build(text).memo_serialize([TerminalDef, Rule])
    blob = {"stamp": stamp(text), "data": _plain(data), "memo": _plain(memo)}
    path.write_bytes(marshal.dumps(blob, 4))


def _plain(value: Any) -> Any:
    """``value`` itself, checked to hold nothing but plain data (else TypeError)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _plain(k)
            _plain(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _plain(v)
    elif not (value is None or isinstance(value, str | int | float | bool)):
        raise TypeError(f"not plain data: {type(value).__name__}")
    return value


class ToFields(TorchFields, LibraryFields):
    """Turns a parse tree into a flat dict of event fields (``kind`` included)."""


@cache
def transformer() -> ToFields:
    """Return the transformer (it holds no state: one per process)."""
    return ToFields()


def parse_tree(text: str) -> Fields | None:
    """Parse one normalised message into fields, or None if the grammar does not read it."""
    try:
        tree = parser().parse(text)
    except LarkError:
        return None
    try:
        return transformer().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, NotAMessage):
            return None
        raise


if __name__ == "__main__":
    target = Path(__file__).with_name(TABLES)
    write_tables(target)
    print(f"wrote {target}")
