r"""Where the candidate scan finds its anchors: Hyperscan when installed, RE2 otherwise.

Input: the scan's anchors (literal phrases, and RE2 regexes marked with :data:`REGEX_PREFIX`)
and buffers of complete lines. Output: for each line of a buffer that holds an anchor, one
offset inside it (:meth:`Engine.hits`); a line's leftmost anchor (:meth:`Engine.leftmost`);
the parts of a line redrawn with carriage returns that hold one
(:meth:`Engine.parts_with_anchors`).

Both engines find the same lines. A line holds an anchor when a literal occurs in it or a
regex matches within it, as RE2 reads the buffer (UTF-8, never matching a newline; ``\b``,
``^`` and ``$`` see the bytes around the line).

* :class:`Re2Engine`: one RE2 alternation of everything, searched from line to line.
* :class:`HyperscanEngine`: one Hyperscan database of every literal and of the regexes
  Hyperscan can only over-match (:func:`~nccl_triage.ingest.hsdb.hyperscan_superset`); a
  line found by such a regex alone is confirmed by RE2. Regexes it cannot take are searched
  by RE2 as before, the two lists merged.

``NCCL_TRIAGE_SCAN`` chooses: ``auto`` (the default: Hyperscan when it is installed),
``hyperscan`` (an error when it is not) or ``re2``.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from functools import cache, cached_property
from typing import Any

from nccl_triage.errors import TriageError
from nccl_triage.ingest import hsdb
from nccl_triage.ingest.regex import compile_bytes_alternation

ENV = "NCCL_TRIAGE_SCAN"
CHOICES = ("auto", "hyperscan", "re2")

# An anchor starting with this is an RE2 regular expression rather than a literal (a signal
# pattern written without literal anchors).
REGEX_PREFIX = "\x00re:"


def split_anchors(anchors: tuple[str, ...]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The literals (longest first) and the regexes of a list of anchors, as bytes, once each.

    The order is the same in every process (the database on disk is named by it).
    """
    literals = sorted(
        {a for a in anchors if not a.startswith(REGEX_PREFIX)}, key=lambda a: (-len(a), a)
    )
    regexes = [a[len(REGEX_PREFIX) :] for a in dict.fromkeys(anchors) if a.startswith(REGEX_PREFIX)]
    return tuple(a.encode() for a in literals), tuple(r.encode() for r in regexes)


class Engine:
    """The search of one anchor set; subclasses say where the anchors are."""

    name = ""

    def __init__(self, literals: tuple[bytes, ...], regexes: tuple[bytes, ...]) -> None:
        self.literals = literals
        self.regexes = regexes

    @cached_property
    def pattern(self) -> Any:
        """The RE2 alternation of every anchor (long lines, leftmost anchors)."""
        return compile_bytes_alternation(self.literals, self.regexes)

    def hits(self, buf: bytes, start: int, end: int) -> list[int]:
        """An offset inside each line of ``buf[start:end]`` holding an anchor, ascending.

        ``buf[start:end]`` holds complete lines (``start`` begins a line, the byte before
        ``end`` is a newline). A line may be named by more than one offset.
        """
        raise NotImplementedError

    def leftmost(self, buf: bytes, line_start: int, line_end: int) -> int:
        """The offset of the leftmost anchor of the candidate line ``buf[line_start:line_end]``."""
        m = self.pattern.search(buf, line_start, line_end)
        return line_start if m is None else int(m.start())

    def parts_with_anchors(self, raw: bytes, bounds: list[tuple[int, int]]) -> list[int]:
        """The indices of the parts ``raw[start:end]`` that hold an anchor, each read alone."""
        search = self.pattern.search
        return [i for i, (s, e) in enumerate(bounds) if search(raw[s:e]) is not None]

    def redrawn_parts(self, raw: bytes, end: int) -> list[tuple[int, int, set[bytes]]] | None:
        r"""The parts of ``raw[:end]`` between carriage returns that hold an anchor, read alone.

        As ``(start, stop, anchors)``, in order: the part's offsets and the anchors it holds
        (literals, and regexes as given to the engine); None when this engine cannot tell
        without splitting the line (the caller then uses :meth:`parts_with_anchors`).
        """
        return None


class Re2Engine(Engine):
    """One RE2 alternation, searched from each candidate line to the next."""

    name = "re2"

    def hits(self, buf: bytes, start: int, end: int) -> list[int]:  # noqa: D102 - see Engine
        return _re2_hits(self.pattern, buf, start, end)


def _re2_hits(pattern: Any, buf: bytes, start: int, end: int) -> list[int]:
    """The leftmost match of ``pattern`` in each line of ``buf[start:end]`` that has one."""
    out: list[int] = []
    search, find = pattern.search, buf.find
    pos = start
    while pos < end:
        m = search(buf, pos, end)
        if m is None:
            break
        at = m.start()
        out.append(at)
        nl = find(b"\n", at, end)
        pos = end if nl < 0 else nl + 1
    return out


class HyperscanEngine(Engine):
    """A Hyperscan database of the literals and the regexes it can take; RE2 for the others."""

    name = "hyperscan"

    def __init__(
        self,
        literals: tuple[bytes, ...],
        regexes: tuple[bytes, ...],
        taken: tuple[bytes, ...],
        left: tuple[bytes, ...],
    ) -> None:
        super().__init__(literals, regexes)
        usable = tuple(a for a in literals if b"\n" not in a)  # RE2 never matches the others
        self._db = hsdb.load_database(tuple(hsdb.literal_expression(a) for a in usable) + taken)
        self._scan = self._db.scan
        self._first_regex = len(usable)  # ids from here on are regexes, to be confirmed
        self._lengths = [len(a) for a in usable]
        self._usable, self._taken = usable, taken
        # each regex Hyperscan takes, alone, as the alternation reads it
        self._confirm = [compile_bytes_alternation((), (r,)) for r in taken]
        self._left = compile_bytes_alternation((), left) if left else None

    def hits(self, buf: bytes, start: int, end: int) -> list[int]:  # noqa: D102 - see Engine
        return self.marked_hits(buf, start, end, None, ())

    def marks(self, anchors: tuple[str, ...]) -> list[bool]:
        """For each expression of the database, whether it is one of ``anchors``."""
        literals, regexes = split_anchors(anchors)
        lit, reg = set(literals), set(regexes)
        return [a in lit for a in self._usable] + [r in reg for r in self._taken]

    def marked_hits(
        self,
        buf: bytes,
        start: int,
        end: int,
        marked: set[int] | None,
        mark: Sequence[bool],
    ) -> list[int]:
        """:meth:`hits`, and in ``marked`` the start of each line holding a ``mark``-ed anchor.

        ``mark`` as :meth:`marks` gives it. A regex counts when Hyperscan sees it, before RE2
        confirms it, and lines found by the regexes Hyperscan cannot take count too: more
        lines are marked than hold one, never fewer.
        """
        found: list[int] = []  # offsets in lines holding a literal
        maybe: list[tuple[int, int]] = []  # (offset, regex) in lines that need RE2's word
        first_regex = self._first_regex
        rfind, find = buf.rfind, buf.find
        lo = hi = -1  # the line of the latest literal, relative to start
        was_marked = False  # whether that line is in marked

        def on_match(expr: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            nonlocal lo, hi, was_marked
            at = to - 1  # the match's last byte, relative to start: inside its line
            if lo <= at < hi:
                # a line already found (matches come mostly in order of their end)
                if marked is not None and not was_marked and mark[expr]:
                    marked.add(start + lo)
                    was_marked = True
                return
            if expr >= first_regex:
                maybe.append((start + at, expr - first_regex))
                return
            lo = max(rfind(b"\n", start, start + at) + 1 - start, 0)
            hi = find(b"\n", start + at, end) - start
            found.append(start + at)
            was_marked = marked is not None and mark[expr]
            if was_marked:
                assert marked is not None
                marked.add(start + lo)

        self._scan(
            memoryview(buf)[start:end],  # no copy
            match_event_handler=on_match,
            scratch=hsdb.scratch_for(self._db),
        )
        found.sort()
        if maybe:
            self._confirm_into(found, buf, start, end, maybe, marked, mark)
        if self._left is not None:
            left = _re2_hits(self._left, buf, start, end)
            if marked is not None:
                marked.update(max(buf.rfind(b"\n", start, at) + 1, start) for at in left)
            found = sorted(found + left)
        return found

    def _confirm_into(
        self,
        found: list[int],
        buf: bytes,
        start: int,
        end: int,
        maybe: list[tuple[int, int]],
        marked: set[int] | None = None,
        mark: Sequence[bool] = (),
    ) -> None:
        """Add to ``found`` (sorted) the regex hits RE2 confirms, in lines not found yet."""
        decided: set[tuple[int, int]] = set()
        first_regex = self._first_regex
        for at, regex in sorted(maybe):
            line_start = max(buf.rfind(b"\n", start, at) + 1, start)
            line_end = buf.find(b"\n", at, end)
            if marked is not None and mark[first_regex + regex]:
                marked.add(line_start)  # seen by Hyperscan: may hold it
            i = bisect.bisect_left(found, line_start)
            if (i < len(found) and found[i] < line_end) or (line_start, regex) in decided:
                continue
            decided.add((line_start, regex))
            if self._confirm[regex].search(buf, line_start, line_end) is not None:
                found.insert(i, at)  # the line is found: its other hits need no check

    def parts_with_anchors(  # noqa: D102 - see Engine
        self, raw: bytes, bounds: list[tuple[int, int]]
    ) -> list[int]:
        starts = [s for s, _ in bounds]
        hit: set[int] = set()
        maybe: list[tuple[int, int]] = []
        first_regex, lengths = self._first_regex, self._lengths

        def on_match(expr: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            if expr >= first_regex:
                maybe.append((to, expr - first_regex))
                return
            i = bisect.bisect_right(starts, to - 1) - 1
            if i >= 0 and starts[i] <= to - lengths[expr] and to <= bounds[i][1]:
                hit.add(i)  # wholly inside the part

        self._scan(raw, match_event_handler=on_match, scratch=hsdb.scratch_for(self._db))
        for to, regex in maybe:
            i = bisect.bisect_right(starts, to - 1) - 1
            if i < 0 or i in hit or to > bounds[i][1]:
                continue
            if self._confirm[regex].search(raw[starts[i] : bounds[i][1]]) is not None:
                hit.add(i)
        if self._left is not None:
            left = self._left.search
            hit.update(i for i, (s, e) in enumerate(bounds) if i not in hit and left(raw[s:e]))
        return sorted(hit)

    def redrawn_parts(  # noqa: D102 - see Engine
        self, raw: bytes, end: int
    ) -> list[tuple[int, int, set[bytes]]] | None:
        if self._left is not None:
            return None
        parts: dict[int, tuple[int, set[bytes]]] = {}  # start -> stop, anchors of the parts
        maybe: list[tuple[int, int]] = []
        first_regex, lengths, usable = self._first_regex, self._lengths, self._usable
        rfind, find = raw.rfind, raw.find

        def on_match(expr: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            if to > end:
                return
            if expr >= first_regex:
                maybe.append((to, expr - first_regex))
                return
            start = rfind(b"\r", 0, to - 1) + 1
            if start > to - lengths[expr]:
                return  # a literal across a carriage return
            part = parts.get(start)
            if part is None:
                stop = find(b"\r", to, end)
                part = parts[start] = (end if stop < 0 else stop, set())
            part[1].add(usable[expr])

        self._scan(raw, match_event_handler=on_match, scratch=hsdb.scratch_for(self._db))
        for to, regex in maybe:
            start = rfind(b"\r", 0, to - 1) + 1
            stop = find(b"\r", to, end)
            stop = end if stop < 0 else stop
            part = parts.get(start)
            if part is not None and self._taken[regex] in part[1]:
                continue
            if self._confirm[regex].search(raw[start:stop]) is not None:
                if part is None:
                    part = parts[start] = (stop, set())
                part[1].add(self._taken[regex])
        return [(start, stop, found) for start, (stop, found) in sorted(parts.items())]


def engine_choice() -> str:
    """The engine ``NCCL_TRIAGE_SCAN`` asks for (``auto`` when unset).

    Raises:
        TriageError: the variable names no engine.
    """
    choice = os.environ.get(ENV, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise TriageError(ENV, f"expected one of {', '.join(CHOICES)}, not {choice!r}")
    return choice


def check_choice() -> str:
    """The engine ``NCCL_TRIAGE_SCAN`` asks for, checked before any input is read.

    Raises:
        TriageError: the variable names no engine, or asks for Hyperscan where it is missing.
    """
    choice = engine_choice()
    if choice == "hyperscan" and hsdb.hyperscan_module() is None:
        raise TriageError(ENV, "hyperscan is not installed (pip install hyperscan)")
    return choice


def scan_engine(anchors: tuple[str, ...], choice: str | None = None) -> Engine:
    """The engine for a set of anchors (``choice`` as ``NCCL_TRIAGE_SCAN``; compiled once).

    Raises:
        TriageError: ``hyperscan`` was asked for and is not installed, or the choice is unknown.
    """
    return _engine(anchors, choice or engine_choice())


@cache
def _engine(anchors: tuple[str, ...], choice: str) -> Engine:
    if choice not in CHOICES:
        raise TriageError(ENV, f"expected one of {', '.join(CHOICES)}, not {choice!r}")
    literals, regexes = split_anchors(anchors)
    hs = hsdb.hyperscan_module()
    if choice == "re2" or (choice == "auto" and hs is None):
        return Re2Engine(literals, regexes)
    if hs is None:
        raise TriageError(ENV, "hyperscan is not installed (pip install hyperscan)")
    taken = tuple(r for r in regexes if hsdb.hyperscan_superset(r.decode()))
    if b"" in literals or not (any(b"\n" not in a for a in literals) or taken):
        # an empty literal makes every line a candidate; no literal and no regex for
        # Hyperscan leaves it nothing to do
        return Re2Engine(literals, regexes)
    try:
        try:
            return HyperscanEngine(
                literals, regexes, taken, tuple(r for r in regexes if r not in taken)
            )
        except hs.error:  # a regex too large, or matching the empty string: it stays on RE2
            taken = tuple(r for r in taken if hsdb.compiles(r))
            return HyperscanEngine(
                literals, regexes, taken, tuple(r for r in regexes if r not in taken)
            )
    except hs.error as exc:  # a resource limit of the compiler
        if choice == "auto":
            return Re2Engine(literals, regexes)
        raise TriageError(ENV, f"hyperscan cannot compile the anchors: {exc}") from None
