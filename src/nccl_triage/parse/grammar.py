"""The Lark grammar of NCCL, process-group and torchrun messages, and its transformer.

Input: one message (prefixes peeled, terminal damage undone). Output: a flat dict of event
fields (``kind`` included), or None when the text is not a message the grammar knows.

Only this package imports lark. The parser is built once per process (LALR, contextual lexer).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from lark import Lark
from lark.exceptions import LarkError, VisitError

from nccl_triage.parse.fields_common import Fields, NotAMessage
from nccl_triage.parse.fields_libs import LibraryFields
from nccl_triage.parse.fields_torch import TorchFields


@cache
def parser() -> Lark:
    """Return the grammar's LALR parser (built once per process)."""
    text = resources.files("nccl_triage.parse").joinpath("nccl.lark").read_text("utf-8")
    return Lark(text, parser="lalr", lexer="contextual", maybe_placeholders=False)


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
