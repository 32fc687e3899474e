"""One message at a time: undo terminal damage, find the message in its line, salvage damage.

Input: a message (a line with its prefixes peeled). Output: the grammar's fields, from the
whole message, or from where a known family starts after unknown text (a logger format we do
not know, prose), or what survives of a damaged timeout message (``salvage``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from lark import Token

from nccl_triage.model import Kind
from nccl_triage.parse.fields_common import Fields
from nccl_triage.parse.grammar import parse_tree, transformer

# Where a family's message starts, to retry after unknown text in front of it.
_HEADS = re.compile(
    r"Watchdog\s*caught|Caught\s*collective|Work\s*WorkNCCL|Timeout\s*at\s*NCCL|Exception\s*\(either"
    r"|failure\s*detected\s*by|(?:NCCL|Process\s*group)\s*watchdog\s*thread|NCCL\s*communicator\s*was"
    r"|Some\s*NCCL\s*operations|To\s*avoid\s*data|terminate\s*called|ProcessGroupNCCL\s*'s"
    r"|Heartbeat\s*monitor|First\s*PG|Received\s*a|Observed\s*flight|Terminating\s*the\s*process"
    r"|NCCL\s*error|NCCL\s*timeout\s*in|nccl[A-Z]\w*:|Last\s*error:|CUDA\s*error:|Cuda\s*failure"
    r"|Detected\s*mismatch|failed\s*\(exitcode|Sending\s*process|Received\s*\d+\s*death"
    r"|The\s*(?:client|server)\s*socket|TCP\s*client|\[\d+\]\s*is\s*setting|wait\s*timeout\s*after"
    r"|Timed\s*out|Socket\s*Timeout|Timeout\s*waiting|Root\s*Cause|Failures:|\b\w*ChildFailedError"
    r"|recvValue|Stack\s*trace\s*of|Not\s*all\s*ranks|Connection\s*closed\s*by\s*peer"
    r"|Unable\s*to\s*find\s*address|Environment\s*variable|(?<![\w.-])[\w.-]+:\d+:\d+\s*\[\d+\]"
    r"|NCCL\s*version|ProcessGroupNCCL\s*(?:preparing|monitor)|Could\s*not\s*acquire"
    r"|NCCL\s*(?:operation|failure|Error)|Nccl\s*error|Aborting\s*communicator|undefined\s*symbol"
    r"|Error\s*while\s*(?:creating|attaching)|NET/IB\w*\s*:\s*Got\s*completion"
    r"|Unable\s*to\s*load\s*NCCL|Mismatched\s|One\s*or\s*more\s*tensors|Stalled\s*ops"
    r"|\bnccl[A-Z]\w*(?:\(.*?\))?\s*failed|Test\s*(?:CUDA|NCCL)\s*failure|DDP\s*expects"
    r"|params\[\d+\]\s*in\s*this\s*process"
)
# Prelude tokens that may stand right before a head: exception classes, what():, PG prefixes.
PRELUDE_TAIL = re.compile(
    r"(?:(?:[A-Za-z_][\w.:]*(?:Error|Exception)\s*:|what\(\)\s*:|\[\s*(?:Rank\s*\d+|PG\s[^\[\]]*?Rank\s*\d+)\s*\]"
    r"|\[c10d\]|Warning\s*:)\s*)+$"
)
# Preludes are short: looking further back than this before a head would make the search
# quadratic on a long glued line.
_PRELUDE_REACH = 512
REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
_DAMAGE = re.compile(r"[ \t]{3,}")  # terminal copies insert runs of spaces inside words
_RETYPED = re.compile(r"WorkNCCL\(\s*(?:\.\.\.|…)\s*\)|\d\+\s*milli|[=:]\s*(?:\.\.\.|…|<\w+>|N\b)")


def normalize(message: str) -> str:
    """Undo terminal damage in a message: runs of three or more spaces never belong to one."""
    return _DAMAGE.sub("", message.strip())


def parse_message(message: str, head_before: int | None = None) -> Fields | None:
    """Parse one message (prefixes already peeled) into fields, or None if it is not one.

    Unknown text in front of a family's head (a logger format we do not know, prose) is
    skipped, keeping exception class, ``what():`` and process-group prefixes just before it.
    With ``head_before``, only a head starting before that offset counts (the message's own
    line, when continuation lines were appended to it).

    A message seen before is not parsed again, and neither is one that differs from a message
    seen before only in its numbers (:func:`_by_shape`): logs repeat the same messages
    thousands of times (every rank's watchdog line, each with its SeqNum; a retry loop), and
    the grammar is the costly step.
    """
    if len(message) > _CACHED_LENGTH:  # a long glued line: rare, and it would fill the cache
        fields = _parse(message, head_before)
    elif head_before is None:
        if message in _seen:
            return _copy(_seen[message])
        fields = _by_shape(message)
        if len(_seen) >= _MAX_SEEN:
            _seen.clear()
        _seen[message] = _copy(fields)  # (a dict apart: callers add to theirs)
        return fields
    else:
        fields = _parse_once(message, head_before)
    return None if fields is None else dict(fields)


_CACHED_LENGTH = 2048

# A message's shape: the message with each number made "#" (a run of digits, or a hex number
# whole: "comm 0x55d1c0a2b0", so that its sentinel is hex too and the message still parses as
# its family, else the shape is never trusted). Messages of one shape parse
# alike, their numbers landing in the same fields, unless a field is computed from a number
# (a signal's name from its number): a shape is learnt from its first message by parsing it
# a second time with every number replaced by a sentinel, and trusted only when the sentinel
# fields, given back the real numbers, are the real fields. Later messages of a trusted shape
# get the sentinel fields with their own numbers, without the grammar.
_NUMBERS = re.compile(r"0[xX][0-9a-fA-F]+|\d+")
_NUMBER_SPLIT = re.compile(f"({_NUMBERS.pattern})")  # text, number, text, ... in one pass
_SENTINEL_BASE = 7_100_000_000
_SENTINEL = re.compile(r"71\d{8}")
_SENTINEL_SPLIT = re.compile(f"({_SENTINEL.pattern})")
_MAX_SHAPES = 8192
_UNTRUSTED = object()
_shapes: dict[str, object] = {}
# Messages seen before, word for word, with their fields: the same line comes from every rank
# and every job ("NCCL version 2.21.5+cuda12.4"), and a copy costs a tenth of filling a shape.
_MAX_SEEN = 4096
_seen: dict[str, Fields | None] = {}


def _by_shape(message: str) -> Fields | None:
    pieces = _NUMBER_SPLIT.split(message)  # the text between numbers, and the numbers
    count = len(pieces) // 2
    if not count or count > 99:
        return _copy(_parse_once(message, None))
    tokens = pieces[1::2]
    runs = [t[2:] if t[1:2] in ("x", "X") else t for t in tokens]  # a hex number's digits
    shape = "#".join(pieces[::2])
    learnt = _shapes.get(shape)
    if learnt is _UNTRUSTED:
        return _copy(_parse_once(message, None))
    if learnt is not None or shape in _shapes:
        if learnt is None:
            return None
        template: Fields
        fillers: tuple[_Filler, ...]
        template, fillers = learnt  # type: ignore[misc]
        out = dict(template)
        for key, how, arg in fillers:
            if how == _FORMAT:
                out[key] = arg.format(*runs)
            elif how == _INT:
                run = runs[arg]
                value = template[key]
                if run.isdigit():
                    out[key] = int(run) if value >= 0 else -int(run)
            else:
                out[key] = _fill(template[key], runs)
        return out
    real = _parse_once(message, None)
    if len(_shapes) >= _MAX_SHAPES:
        _shapes.clear()
    _shapes[shape] = _learn(message, runs, real)
    return _copy(real)


def _copy(fields: Fields | None) -> Fields | None:
    return None if fields is None else dict(fields)


# How a numbered field of a shape's template is filled in with a message's numbers:
# (key, _FORMAT, a format string of the text between them), (key, _INT, which number), or
# (key, _ANY, None): the template's value walked (lists, nested fields).
_Filler = tuple[str, int, Any]
_FORMAT, _INT, _ANY = 0, 1, 2


def _filler(key: str, value: Any, numbers: int) -> _Filler:
    """How :func:`_fill` fills a template's value in, worked out once per shape."""
    if isinstance(value, int) and not isinstance(value, bool):
        i = abs(value) - _SENTINEL_BASE
        if 0 <= i < numbers:
            return (key, _INT, i)
    if isinstance(value, str):
        parts = _SENTINEL_SPLIT.split(value)
        fmt = []
        for j, part in enumerate(parts):
            if j % 2 == 0:
                fmt.append(part.replace("{", "{{").replace("}", "}}"))
            else:
                i = int(part) - _SENTINEL_BASE
                fmt.append(f"{{{i}}}" if 0 <= i < numbers else part)
        return (key, _FORMAT, "".join(fmt))
    return (key, _ANY, None)


def _sentinel(m: re.Match[str], numbers: Iterator[int]) -> str:
    """The sentinel for one number: a hex number keeps its ``0x`` (and stays hex)."""
    token = m.group(0)
    head = token[:2] if token[1:2] in ("x", "X") else ""
    return head + str(_SENTINEL_BASE + next(numbers))


def _learn(message: str, runs: list[str], real: Fields | None) -> object:
    """The sentinel fields of a message's shape, or ``_UNTRUSTED``."""
    numbers = iter(range(len(runs)))
    marked = _NUMBERS.sub(lambda m: _sentinel(m, numbers), message)
    template = _parse(marked, None)
    if template is None or real is None:
        if template is None and real is None and _neighbours_agree(message, None):
            return None
        return _UNTRUSTED
    if _fill(template, runs) != real or not _neighbours_agree(message, template):
        return _UNTRUSTED
    numbered = [k for k, v in template.items() if _fill(v, ["0"] * len(runs)) != v]
    return template, tuple(_filler(k, template[k], len(runs)) for k in numbered)


_SMALL = 256  # what a field may be looked up from: an error code, a signal number


def _neighbours_agree(message: str, template: Fields | None) -> bool:
    """Whether the grammar reads the message with its numbers one up, and down, as its shape.

    A field looked up from a number (an NCCL error code's class) is not a copy of it: the
    sentinel's reading may agree with the message's by chance (an unknown code's class is
    taken from the text, which names the same class), not with the next code's.
    """
    tokens = _NUMBERS.findall(message)
    if not any(t.isdigit() and int(t) < _SMALL for t in tokens):
        return True
    for delta in (1, -1):

        def shift(m: re.Match[str], delta: int = delta) -> str:
            t = m.group(0)
            return str(int(t) + delta) if t.isdigit() and int(t) + delta >= 0 else t

        variant = _NUMBERS.sub(shift, message)
        if variant == message:
            continue
        runs = [t[2:] if t[1:2] in ("x", "X") else t for t in _NUMBERS.findall(variant)]
        want = None if template is None else _fill(template, runs)
        if _parse(variant, None) != want:
            return False
    return True


def _fill(value: Any, runs: list[str]) -> Any:
    """A template's value with each sentinel made the number it stands for."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        i = abs(value) - _SENTINEL_BASE
        if 0 <= i < len(runs) and runs[i].isdigit():
            return int(runs[i]) if value >= 0 else -int(runs[i])
        return value
    if isinstance(value, str):
        if "71" not in value:
            return value
        return _SENTINEL.sub(lambda m: _number(m[0], runs), value)
    if isinstance(value, dict):
        return {k: _fill(v, runs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, runs) for v in value]
    if isinstance(value, tuple):
        return tuple(_fill(v, runs) for v in value)
    return value


def _number(sentinel: str, runs: list[str]) -> str:
    i = int(sentinel) - _SENTINEL_BASE
    return runs[i] if 0 <= i < len(runs) else sentinel


@lru_cache(maxsize=16384)
def _parse_once(message: str, head_before: int | None) -> Fields | None:
    return _parse(message, head_before)


def _parse(message: str, head_before: int | None) -> Fields | None:
    text = normalize(message)
    if not text:
        return None
    result = parse_tree(text)
    if result is not None:
        return result
    limit = len(normalize(message[:head_before])) if head_before is not None else len(text)
    for m in _HEADS.finditer(text):
        start = m.start()
        if start >= limit:
            break
        if start == 0:
            continue
        pre = PRELUDE_TAIL.search(text, max(0, start - _PRELUDE_REACH), start)
        begin = pre.start() if pre else start
        result = parse_tree(text[begin:])
        if result is not None:
            return result
    return None


# Damaged timeout messages: the fields that survive, read one by one.
_SALVAGE_HEAD = re.compile(
    r"Watchdog\s*caught|Caught\s*collective\s*operation\s*timeout|timed\s*out\s*in\s*blocking\s*wait"
    r"|Timeout\s*at\s*NCCL\s*work|detected\s*by\s*watchdog\s*at\s*work|either\s*an\s*error\s*or\s*timeout"
    r"|failure\s*detected\s*by\s*watchdog"
)
_SALVAGE_FIELDS = (
    ("seq", re.compile(r"SeqNum\s*=\s*(\d+)")),
    ("op_type", re.compile(r"OpType\s*=\s*(_?[A-Z][A-Z_]*)")),
    ("numel_in", re.compile(r"NumelIn\s*=\s*(\d+)")),
    ("numel_out", re.compile(r"NumelOut\s*=\s*(\d+)")),
    ("tensor_shape", re.compile(r"TensorShape\s*=\s*(\[[\d,\s]*\])")),
    ("timeout_ms", re.compile(r"Timeout\s*\(\s*ms\s*\)\s*=\s*(\d+)")),
    ("ran_for_ms", re.compile(r"ran\s*for\s*(\d+)\s*milli")),
    ("seq", re.compile(r"(?:at\s*work|NCCL\s*work|sequence\s*id)\s*:\s*(\d+)")),
    ("last_enqueued", re.compile(r"last\s*enqueued\s*(?:NCCL\s*)?work\s*:\s*(-?\d+)")),
    ("last_completed", re.compile(r"last\s*completed\s*(?:NCCL\s*)?work\s*:\s*(-?\d+)")),
)


def salvage(message: str, prefixed: bool = False) -> Fields | None:
    """Read what survives of a damaged timeout message (cut, glued, garbled), or None.

    ``prefixed`` tells that the line carried PyTorch's own prefixes (a c10/glog header, a
    ``[rankN]:``), which makes a line cut inside the opening phrase believable.
    """
    text = normalize(message)
    head = _SALVAGE_HEAD.search(text)
    if head is None or _RETYPED.search(text):
        return None
    out: Fields = {"kind": Kind.WATCHDOG_TIMEOUT, "form": "damaged", "_incomplete": True}
    pre = PRELUDE_TAIL.search(text, max(0, head.start() - _PRELUDE_REACH), head.start())
    found = False
    for name, rx in _SALVAGE_FIELDS:
        if name in out:
            continue
        m = rx.search(text, head.start())
        if m:
            out[name] = m[1] if name in ("op_type", "tensor_shape") else int(m[1])
            found = True
    if not found:
        # Only the phrase survives. A line cut inside it counts; prose or code quoting it
        # ("How do I fix the Watchdog caught ... error?") does not.
        before = text[: pre.start()] if pre else text[: head.start()]
        rest = re.sub(r"\s+", "", text[head.start() :])
        cut = any(c.startswith(rest) or rest.startswith(c) for c in _CUT_PHRASES)
        if before.strip() or not (prefixed or pre) or not cut:
            return None
    if pre:
        out.update(_parse_prelude(pre.group(0)))
    return out


# The opening phrases of the timeout families without spaces, up to their first value.
_CUT_PHRASES = (
    "Watchdogcaughtcollectiveoperationtimeout:WorkNCCL(",
    "Caughtcollectiveoperationtimeout:WorkNCCL(",
    "TimeoutatNCCLwork:",
    "detectedbywatchdogatwork:",
    "failuredetectedbywatchdogatworksequenceid:",
)


def _parse_prelude(text: str) -> Fields:
    out: Fields = {}
    for m in re.finditer(r"\[\s*(?:Rank\s*\d+|PG\s[^\[\]]*?Rank\s*\d+)\s*\]", text):
        fields = transformer().pg_prefix([Token("PG_PREFIX", m.group(0))])
        fields.pop("_eras", None)
        for key, value in fields.items():
            out.setdefault(key, value)
    return out
