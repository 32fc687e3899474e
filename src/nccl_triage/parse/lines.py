"""Candidate lines to events: joining hard-wrapped messages, reading blocks, building events.

Input: :class:`~nccl_triage.ingest.scan.Candidate` lines of one input. Output: events in a
:class:`~nccl_triage.parse.dedupe.Deduper` (the same timeout seen in a watchdog line, a status
line and a ``what():`` line is one event), and the candidate lines the grammar could not read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, overload

from nccl_triage.ingest.anchors import ANCHORS, REGEX_ANCHORS
from nccl_triage.ingest.reader import segments
from nccl_triage.ingest.regex import TextSearcher
from nccl_triage.ingest.scan import Candidate
from nccl_triage.model import Detail, Event, Kind, Line, Unparsed, is_failure
from nccl_triage.parse.anatomy import peel
from nccl_triage.parse.dedupe import MAX_OCCURRENCES, Deduper
from nccl_triage.parse.eras import era_of
from nccl_triage.parse.fatal import fatal_head, nccl_frame
from nccl_triage.parse.fields_common import Fields
from nccl_triage.parse.grammar import parse_tree
from nccl_triage.parse.messages import PRELUDE_TAIL, REPEATED, normalize, parse_message, salvage

MAX_UNPARSED = 10_000
# A frame of a backtrace in an NCCL function: "2 0x0000000000068d7c ncclGroupEnd() ???:0"

_STRONG_START = re.compile(
    r"\s*(?:\[rank\d+\]|\[[A-Za-z_][\w.-]*\d+\]:|\[[FEWIV]\d{0,4}[ \d:.]*[\w.+-]+:\d+\]"
    r"|[VIWEFC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ |\[?\d{4}-\d\d-\d\d|frame #|Exception raised from|terminate called"
    r"|Traceback|File \"|[\w.-]+:\d+:\d+ \[\d+\]|\(\w+ pid=|[\w.]+(?:Error|Exception):|\[\d+\] |=====|-----)"
)
# The grammar's anchors over a segment's text, in RE2 as the scan reads them (ASCII \d, \w
# and \b): a segment the scan's anchors do not hold never holds one of these. RE2 is about 5x
# faster than re on this alternation of a hundred phrases.
ANCHOR_RE = TextSearcher(
    "|".join(
        [re.escape(a) for a in sorted(ANCHORS, key=len, reverse=True)]
        + [f"(?:{r})" for r in REGEX_ANCHORS]
    )
)
MAX_JOIN = 4
MAX_SEEN = 50_000  # distinct messages remembered to count their repeats without parsing them


class LineParser:
    """The grammar over one input's candidate lines: joins wrapped messages, reads blocks.

    Events go to :attr:`dedupe`; lines that hold an anchor but no message to :attr:`unparsed`.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.consumed_until = 0
        self.dedupe = Deduper()
        self.unparsed: list[Unparsed] = []
        self.candidates = 0
        self.failure_lines: list[int] = []  # lines of the failures read, in the order read
        # a message seen on the same rank/process before: [times seen, is a failure]
        self._seen: dict[tuple[Any, ...], list[Any]] = {}
        self.repeated = 0  # lines counted as repeats without being parsed again

    def feed(
        self,
        cand: Candidate,
        lines: Sequence[Line] | None = None,
        at: Sequence[int] | None = None,
        count: int | None = None,
        anchored: bool | None = None,
    ) -> None:
        """Parse one candidate line (joined with its neighbours when a message was wrapped).

        ``lines`` are the line's segments already peeled (the pipeline peels each line once,
        for the grammar and the signals alike); without them they are peeled here. When only
        some segments are given (those holding an anchor: no other can hold a message),
        ``at`` gives their positions among the line's ``count`` segments. ``anchored``:
        whether the one segment given holds one of the grammar's anchors, when known.
        """
        if cand.lineno <= self.consumed_until:
            return
        self.candidates += 1
        if lines is None:
            lines = peel_segments(self.source, cand)
        if at is None:
            at = range(len(lines))
        n = len(lines) if count is None else count
        if n == 1 and lines:
            seen = self._seen.get(_repeat_key(lines[0]))
            if seen is not None and seen[0] > MAX_OCCURRENCES:
                # the event already holds all the occurrences it keeps: count, do not parse
                seen[0] += 1
                self.repeated += 1
                if seen[1]:
                    self.failure_lines.append(cand.lineno)
                return
        for i, line in zip(at, lines, strict=True):
            if not (anchored if anchored is not None else ANCHOR_RE.search(line.text)):
                continue
            self._feed_segment(cand, line, first=i == 0, last=i == n - 1)

    def _feed_segment(self, cand: Candidate, line: Line, first: bool, last: bool) -> None:
        text = line.text
        after: Sequence[str] = _Decoded(cand.after) if last else ()
        signal = fatal_head(line.message)
        if signal is not None:
            self._fatal_signal(line, signal, after)
            return
        fields, used = self._parse_with_joins(line, after)
        start_line = line
        if first and _continues_previous(cand, text, line, fields is not None):
            prev = peel(Line(self.source, cand.lineno - 1, _decode(cand.before[-1]) + text))
            joined, used_b = self._parse_with_joins(prev, after)
            whole = fields is None or (
                _has_own_prefix(prev)
                and not any(p.kind == "lead" for p in prev.prefixes)
                and parse_tree(normalize(prev.message + "".join(after[k] for k in range(used_b))))
                is not None
            )
            if joined is not None and not joined.get("_incomplete") and whole:
                fields, used, start_line = joined, used_b, prev
        if fields is None:
            fields = _store_raised(line.message, cand.before) if first else None
            used = 0
        if fields is None:
            fields = salvage(line.message, prefixed=_has_own_prefix(line))
            used = 0
            if fields is None:
                if len(self.unparsed) < MAX_UNPARSED:
                    self.unparsed.append(Unparsed(cand.lineno, text))
                return
        if used:
            self.consumed_until = max(self.consumed_until, cand.lineno + used)
        kind = fields.get("kind")
        if kind == Kind.CHILD_FAILED and fields.get("form") in ("root_cause", "failures"):
            self._child_block(start_line, fields, [_decode(r) for r in cand.after], cand.lineno)
            return
        if (
            kind == Kind.NCCL_ERROR
            and fields.get("form") == "last_error"
            and not fields.get("last_error")
        ):
            value = (
                peel(Line(self.source, cand.lineno + 1, _decode(cand.after[0]))).message
                if cand.after
                else ""
            )
            if value.strip():
                fields["last_error"] = normalize(value)
                self.consumed_until = max(self.consumed_until, cand.lineno + 1)
        if kind == "child_field":
            return  # a ChildFailedError record line outside a block: nothing to pin it on
        ev = make_event(start_line, fields, self._joined_text(start_line, after, used))
        failure = is_failure(ev)
        if failure:
            self.failure_lines.append(ev.line)
        self.dedupe.add(ev)
        if used == 0 and start_line is line and not ev.partial and not ev.repeats:
            # a message read whole from its own line: the next identical one can be counted
            key = _repeat_key(line)
            if key in self._seen or len(self._seen) < MAX_SEEN:
                self._seen.setdefault(key, [0, failure])[0] += 1

    def _fatal_signal(self, line: Line, signal: str, after: Sequence[str]) -> None:
        """A process killed by a signal: an NCCL failure when its backtrace runs through NCCL.

        A crash of some other code is context for the diagnosis (a signal), not an event.
        """
        found = nccl_frame(signal, after)
        if found is None:
            return
        name, where = found
        fields: Fields = {
            "kind": Kind.NCCL_ERROR,
            "form": "fatal_signal",
            "signal": name,
            "nccl_call": where,
        }
        ev = make_event(line, fields, line.text.strip())
        self.failure_lines.append(ev.line)
        self.dedupe.add(ev)

    def _joined_text(self, line: Line, after: Sequence[str], used: int) -> str:
        if not used:
            return line.text.strip()
        return normalize(line.text + "".join(after[k] for k in range(used)))

    def _parse_with_joins(self, line: Line, after: Sequence[str]) -> tuple[Fields | None, int]:
        fields = parse_message(line.message)
        if fields is not None and not fields.get("_incomplete"):
            return fields, 0
        message = line.message
        own = len(message)
        for k in range(min(MAX_JOIN, len(after))):
            nxt = after[k]
            if not nxt.strip() or _STRONG_START.match(nxt):
                break
            message += nxt
            joined = parse_message(message, head_before=own)
            if joined is not None and not joined.get("_incomplete"):
                return joined, k + 1
        return fields, 0

    def _child_block(self, line: Line, head: Fields, after: list[str], lineno: int) -> None:
        """Read the records of a ChildFailedError block (``Root Cause`` or ``Failures:``)."""
        role = "root_cause" if head.get("form") == "root_cause" else "other"
        record: Fields | None = None
        record_line = lineno
        used = 0
        for offset, raw in enumerate(after, start=1):
            text = raw.strip()
            if not text:
                break
            if re.fullmatch(r"[=\-*]{5,}", text) or re.match(
                r"(?:Other\s+)?Failures:|Root Cause", text
            ):
                break
            used = offset
            if re.fullmatch(r"\[\d+\]:", text):
                if record:
                    self._add_child(line, record, role, record_line)
                record, record_line = {}, lineno + offset
                continue
            if text == "<NO_OTHER_FAILURES>":
                break
            fields = parse_message(text)
            if fields is None or fields.get("kind") != "child_field":
                continue
            if record is None:
                record, record_line = {}, lineno + offset
            record.update(
                {k: v for k, v in fields.items() if k != "kind" and not k.startswith("_")}
            )
        if record:
            self._add_child(line, record, role, record_line)
        self.consumed_until = max(self.consumed_until, lineno + used)

    def _add_child(self, line: Line, record: Fields, role: str, lineno: int) -> None:
        fields: Fields = {"kind": Kind.CHILD_FAILED, "form": role, **record}
        rank = record.get("rank")
        text = ", ".join(f"{k}={v}" for k, v in record.items() if v is not None)
        row = Line(line.source, lineno, text, message=text, rank=rank)
        self.dedupe.add(make_event(row, fields, line.text.strip() + " " + text))


# A store's socket error raised bare from torch.distributed's set-up: "RuntimeError: Connection
# reset by peer" right under "store = TCPStore(master_addr, ...)" or "_set_sequence_number...".
_STORE_RAISED = re.compile(
    r"^(?P<exc>(?:[\w.]+\.)?(?:RuntimeError|TimeoutError|Connection\w*Error|Dist\w*Error)):\s*"
    r"(?P<err>Connection (?:reset by peer|refused|timed out)|connect\(\) timed out\b.*"
    r"|Broken pipe)"
)
_SETUP_FRAME = re.compile(
    r"torch/distributed/|\b(?:TCPStore|FileStore|PrefixStore)\(|init_process_group|rendezvous"
    r"|_store_based_barrier|_set_sequence_number|\bstore\.(?:get|set|wait|add|compare_set)\("
)


def _store_raised(message: str, before: Sequence[bytes]) -> Fields | None:
    """The store error a traceback ends with, when its last frame is in torch.distributed."""
    m = _STORE_RAISED.match(message.strip())
    if m is None or not any(_SETUP_FRAME.search(_decode(raw)) for raw in before):
        return None
    return {
        "kind": Kind.SOCKET_ERROR,
        "form": "raised",
        "exception_type": m["exc"].rsplit(".", 1)[-1],
        "error": m["err"].strip(),
    }


def peel_segments(source: str, cand: Candidate) -> list[Line]:
    """The segments of a candidate line (parts between carriage returns), peeled."""
    return peel_raw(source, cand.lineno, cand.raw)


def peel_raw(source: str, lineno: int, raw: bytes) -> list[Line]:
    """The segments of a physical line, peeled; each keeps the physical line number.

    Segments are the parts between carriage returns, and the messages of a block flattened
    into one line.
    """
    return [
        peel(Line(source, lineno, part)) for seg in segments(raw) for part in split_flattened(seg)
    ]


# Where a message starts inside a line that holds several: an issue tracker, a chat paste or a
# log shipper turned an error block's newlines into spaces.
_NEXT_MESSAGE = re.compile(
    r"(?<=\S)\s+(?="
    r"\[(?:rank\d+\]:\[)?[EWIF]\d{0,4}(?: [\d:.]+)?(?: \d+)? ?[\w./-]+\.(?:cpp|cc|hpp|h|py):\d+\]"
    r"|\[rank\d+\]:|terminate called after throwing|what\(\):|Exception raised from \w"
    r"|Traceback \(most recent call last\):|[\w.-]+:\d+:\d+ \[\d+\] (?:NCCL )?(?:INFO|WARN)"
    r"|torch\.(?:distributed\.)?\w+Error:)"
)
_FLAT_MIN = 48  # shorter lines hold one message
# Every start of a message in _NEXT_MESSAGE holds one of these, or is a "[" after a space and
# before "rank" or a c10 header's level (E, W, I, F): a line with none is one message.
_NEXT_WORDS = (
    "terminate called",
    "what():",
    "Exception raised from",
    "Traceback (",
    "torch.",
)
# An NCCL line's "host:pid:tid [dev] NCCL INFO" after a space (an NCCL line's own header is at
# its start, or after a prefix that ends without one: "[default0]:host:...")
_NCCL_AFTER_SPACE = re.compile(r"\s[\w.-]+:\d+:\d+ \[\d+\] (?:NCCL )?(?:INFO|WARN)")


def _may_start_another(text: str) -> bool:
    """Whether a message of _NEXT_MESSAGE may start inside ``text`` (a cheap test first)."""
    if any(w in text for w in _NEXT_WORDS):
        return True
    if ("INFO" in text or "WARN" in text) and _NCCL_AFTER_SPACE.search(text):
        return True
    i = text.find("[", 1)
    while i > 0:
        if text[i - 1].isspace() and (
            text.startswith("rank", i + 1) or text[i + 1 : i + 2] in ("E", "W", "I", "F")
        ):
            return True
        i = text.find("[", i + 1)
    return False


def split_flattened(text: str) -> list[str]:
    """The messages of one line: several when a block was flattened into it, else the line.

    A split needs a whole message before it: text that holds an anchor and more than the
    prefixes (``[rank0]: what(): ...`` and a launcher's prefix before a header stay one).
    """
    if len(text) < _FLAT_MIN or not _may_start_another(text):
        return [text]
    parts: list[str] = []
    start = 0
    for m in _NEXT_MESSAGE.finditer(text):
        left = text[start : m.start()]
        if ANCHOR_RE.search(left) and peel(Line("", 0, left)).message.strip():
            parts.append(left)
            start = m.end()
    if not parts:
        return [text]
    parts.append(text[start:])
    return parts


def _continues_previous(cand: Candidate, text: str, line: Line, parsed: bool) -> bool:
    """Tell whether a candidate line may be the second half of a line hard-wrapped before it."""
    if not cand.before:
        return False
    if _only_prefixes(cand.before[-1]):
        return True  # a wrap right after the prefixes: they are no line of their own
    if _STRONG_START.match(text):
        return False
    return (
        not parsed  # a wrap in the middle of a word
        or any(p.kind == "lead" for p in line.prefixes)  # inside the header: text before it
        or (not _has_own_prefix(line) and parse_tree(normalize(line.message)) is None)
    )


def _only_prefixes(raw: bytes) -> bool:
    """Tell whether a physical line holds PyTorch's prefixes (and PG prefixes) but no message."""
    if not raw.rstrip().endswith((b"]", b"]:")):
        return False  # every prefix ends so: most lines are ruled out without peeling them
    line = peel(Line("", 0, _decode(raw)))
    message = normalize(line.message)
    return _has_own_prefix(line) and (not message or PRELUDE_TAIL.match(message) is not None)


def _has_own_prefix(line: Line) -> bool:
    """Tell whether PyTorch's own prefixes were peeled off a line (a header, ``[rankN]:``)."""
    return any(p.kind in ("header", "tee", "excepthook") for p in line.prefixes)


def _repeat_key(line: Line) -> tuple[Any, ...]:
    return (line.message, line.rank, line.local_rank, line.pid, line.host)


def _decode(raw: bytes) -> str:
    return segments(raw)[-1]


class _Decoded(Sequence[str]):
    """The lines after a candidate, decoded only when asked for (most never are)."""

    def __init__(self, raws: Sequence[bytes]) -> None:
        self._raws = raws
        self._done: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._raws)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self._raws)))]
        if i < 0:
            i += len(self._raws)
        if i not in self._done:
            self._done[i] = _decode(self._raws[i])
        return self._done[i]


# The grammar's fields an Event has as its own attributes, and those read apart (the rest is
# its detail).
_CORE_FIELDS = frozenset(
    (
        "pg",
        "pg_guid",
        "pg_desc",
        "pg_rank",
        "seq",
        "op_type",
        "numel_in",
        "numel_out",
        "tensor_shape",
        "timeout_ms",
        "ran_for_ms",
        "last_enqueued",
        "last_started",
        "last_completed",
        "form",
    )
)
_NOT_DETAIL = frozenset(
    ("kind", "_eras", "_incomplete", "tail", "rank", "host", "pid", "local_rank")
)


def make_event(line: Line, fields: Fields, text: str) -> Event:
    """Build an :class:`Event` from a peeled line and the grammar's fields."""
    repeats = 0
    m = REPEATED.search(line.text) if "[repeated " in line.text else None
    if m:
        repeats = int(m[1])
    kind = str(fields["kind"])
    # one pass over the fields: the event's own ones, those read below, and the detail (in the
    # grammar's order)
    core: dict[str, Any] = {}
    detail: dict[str, str | int | None] = {}
    for key, value in fields.items():
        if key in _CORE_FIELDS:
            core[key] = value
        elif key not in _NOT_DETAIL:
            if isinstance(value, list):  # rank lists of the desync report: "3", "0, 1, 2"
                value = ", ".join(str(v) for v in value)
            if value is None or isinstance(value, (str, int)):
                detail[key] = value
    eras = fields.get("_eras", [])
    incomplete = bool(fields.get("_incomplete", False))
    rank = fields.get("rank")
    host = fields.get("host")
    pid = fields.get("pid")
    local_rank = fields.get("local_rank")
    if kind == Kind.CHILD_FAILED:
        # the record's rank is the failed rank, not the rank of the line printing it
        rank = rank if rank is not None else line.rank
    else:
        rank = line.rank if line.rank is not None else rank
    if rank is None and core.get("pg_rank") is not None and core.get("pg") in (None, "0"):
        rank = core["pg_rank"]  # "[Rank N]" in the default process group is the global rank
    return Event(
        kind=kind,
        source=line.source,
        line=line.lineno,
        text=text,
        rank=rank,
        local_rank=line.local_rank if line.local_rank is not None else local_rank,
        host=line.host or host,
        pid=pid if pid is not None else line.pid,
        time=line.time,
        ts=line.ts,
        partial=incomplete,
        pytorch_era=era_of(line, eras),
        detail=Detail(detail),
        repeats=repeats,
        **core,
    )
