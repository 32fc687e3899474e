"""Linear-time regular expressions (RE2) for every pattern that comes from a rule file.

Input: pattern text (from signals, rule conditions, the scan's anchors). Output: compiled RE2
patterns, or the reason RE2 rejects one. RE2 has no backreferences or lookarounds; that is
what keeps matching linear in the input, so a contributed pattern cannot hang the tool. Only
this package imports re2.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import re2


@cache
def compile_regex(pattern: str, ignore_case: bool = False) -> Any:
    """Compile a pattern over text (compiled once per process).

    Raises:
        re2.error: RE2 rejects the pattern (and says nothing on stderr).
    """
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False
    return re2.compile(pattern, options)


@cache
def compile_bytes_regex(pattern: str, ignore_case: bool = False) -> Any:
    """:func:`compile_regex`'s pattern, to search the UTF-8 bytes of a text.

    The same matches, with groups and their names in bytes (decode them); a call costs a
    third (no conversion of offsets between characters and bytes).
    """
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False
    return re2.compile(pattern.encode("utf-8"), options)


@cache
def compile_bytes_alternation(literals: tuple[bytes, ...], regexes: tuple[bytes, ...]) -> Any:
    r"""One RE2 alternation over bytes of escaped literals and regexes, capturing nothing.

    It never matches a newline (RE2's ``never_nl``: ``[^)]*`` or ``\s`` stop at the end of a
    line, a literal holding one never matches), so every match lies within one line.
    """
    options = re2.Options()
    options.never_capture = True
    options.never_nl = True
    parts = [re2.escape(a) for a in literals] + [b"(?:" + r + b")" for r in regexes]
    return re2.compile(b"|".join(parts), options)


_UNANCHORED = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


class BytesSearcher:
    """An RE2 pattern over bytes, searched for its groups' spans without building a match.

    The wrapper's ``search`` goes through a generator and a match object at every call,
    twice the cost of the search on a short line; this calls the compiled pattern directly
    where the wrapper exposes it (and the wrapper otherwise).
    """

    __slots__ = ("_compiled", "_groups", "_match", "_names")

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled
        regexp = getattr(compiled, "_regexp", None)
        self._match = None if regexp is None or _UNANCHORED is None else regexp.Match
        self._names = [
            (name.decode() if isinstance(name, bytes) else name, index)
            for name, index in compiled.groupindex.items()
        ]
        self._groups = int(compiled.groups)

    def spans(self, data: bytes) -> list[tuple[int, int]] | None:
        """The spans of the leftmost match and its groups ((-1, -1) unset), or None."""
        if self._match is None:
            m = self._compiled.search(data)
            return None if m is None else [m.span(i) for i in range(self._groups + 1)]
        spans: list[tuple[int, int]] = self._match(_UNANCHORED, data, 0, len(data))
        return None if spans[0][0] < 0 else spans

    def named(self, data: bytes, spans: list[tuple[int, int]]) -> dict[str, str]:
        """The named groups that took part in a match, as text."""
        out: dict[str, str] = {}
        for name, index in self._names:
            start, end = spans[index]
            if start >= 0:
                out[name] = data[start:end].decode("utf-8", "replace")
        return out


class TextSearcher:
    """An RE2 pattern searched in a text only to know whether it matches (no match object).

    The text's UTF-8 is searched by the compiled pattern directly where the wrapper exposes
    it: a third of the wrapper's ``search`` on a short line, which converts offsets and
    builds a match.
    """

    __slots__ = ("_compiled", "_match")

    def __init__(self, pattern: str, ignore_case: bool = False) -> None:
        options = re2.Options()
        options.case_sensitive = not ignore_case
        options.never_capture = True
        self._compiled = re2.compile(pattern.encode("utf-8"), options)
        regexp = getattr(self._compiled, "_regexp", None)
        self._match = None if regexp is None or _UNANCHORED is None else regexp.Match

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text``."""
        data = text.encode("utf-8")
        if self._match is None:
            return self._compiled.search(data) is not None
        return bool(self._match(_UNANCHORED, data, 0, len(data))[0][0] >= 0)


@cache
def bytes_searcher(pattern: str, ignore_case: bool = False) -> BytesSearcher:
    """:func:`compile_bytes_regex`'s pattern as a :class:`BytesSearcher`."""
    return BytesSearcher(compile_bytes_regex(pattern, ignore_case))


class RegexSet:
    """Many patterns searched in one pass: which of them match a text (RE2's ``Set``)."""

    def __init__(self, patterns: tuple[tuple[str, bool], ...]) -> None:
        self._sets: list[tuple[Any, list[int]]] = []
        for ignore_case in (False, True):
            members = [i for i, (_p, ic) in enumerate(patterns) if ic == ignore_case]
            if not members:
                continue
            options = re2.Options()
            options.case_sensitive = not ignore_case
            options.never_capture = True
            found = re2.Set.SearchSet(options)
            for i in members:
                found.Add(patterns[i][0])
            found.Compile()
            # the compiled set itself where the wrapper exposes it (its Match skips a layer
            # of Python); both answer a list of indices for UTF-8 bytes
            self._sets.append((getattr(found, "_set", found), members))

    def matching(self, text: str | bytes) -> list[int]:
        """The indices of the patterns that match somewhere in ``text`` (or its UTF-8), in order."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        sets = self._sets
        if len(sets) == 1:  # the usual case: no pattern ignores case (or all do)
            found, members = sets[0]
            return sorted(members[j] for j in found.Match(data) or ())
        hits: list[int] = []
        for found, members in sets:
            hits.extend(members[j] for j in found.Match(data) or ())
        return sorted(hits)


@cache
def compile_set(patterns: tuple[tuple[str, bool], ...]) -> RegexSet:
    """A :class:`RegexSet` of ``(pattern, ignore_case)`` pairs (compiled once per process)."""
    return RegexSet(patterns)


def compile_error(regex: str, ignore_case: bool = False, over_bytes: bool = False) -> str | None:
    """Return why RE2 rejects a pattern, or None when it compiles.

    The pattern is compiled as it is used later, so that it is compiled once: over text
    (:func:`compile_regex`), or with ``over_bytes`` over UTF-8 bytes (:func:`bytes_searcher`).
    """
    try:
        (compile_bytes_regex if over_bytes else compile_regex)(regex, ignore_case)
    except Exception as exc:  # noqa: BLE001 - re2.error, and plain errors for some inputs
        arg = exc.args[0] if exc.args else ""
        reason = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
        reason = reason or type(exc).__name__
        if any(op in regex for op in ("(?=", "(?!", "(?<=", "(?<!")) or re2.search(
            r"\\[1-9]", regex
        ):
            reason += (
                " (RE2 has no backreferences or lookarounds; that is what keeps matching linear"
                " in the input, so a pattern cannot hang the tool)"
            )
        return reason
    return None
