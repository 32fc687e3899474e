"""Errors that reach the user as one line: ``where: what went wrong``.

Input: a location (an input name, or ``path:line``) and a message. Output: exceptions whose
``str()`` is the line the CLI prints; nothing here prints or exits.
"""

from __future__ import annotations


class TriageError(Exception):
    """Base class: an error the user can act on, shown as ``loc: msg``."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(loc, msg)
        self.loc = loc
        self.msg = msg

    def __str__(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class InputError(TriageError):
    """An input cannot be read: missing, a directory, permissions, damaged compression."""


class RuleError(TriageError):
    """A rule or signal file is invalid (``path:line: message``)."""


class TemplateError(TriageError):
    """An advice template cannot be loaded or rendered."""
