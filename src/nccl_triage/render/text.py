"""Evidence lines clipped to a width without losing what matters in them.

Input: a log line. Output: the line, or, when it is longer than the width, its start and the
part that carries the numbers a reader needs (the time a collective ran for, its timeout,
OpType, SeqNum, sizes), joined by ``...``. A plain cut would drop the end of a watchdog line,
where ``ran for 1800127 milliseconds`` is.
"""

from __future__ import annotations

import re

WIDTH = 220

_KEEP = re.compile(
    r"ran for \d+ milliseconds(?: before timing out\.?)?|Timeout\(ms\)=\d+|OpType=\w+"
    r"|SeqNum=\d+|Numel(?:In|Out)=\d+|\b(?:[Ee]rror|failure|failed)\b[^.;]{0,60}"
)
_ELLIPSIS = " ... "


def clip(text: str, width: int = WIDTH) -> str:
    """Return ``text`` in at most ``width`` characters, keeping its key numbers."""
    if len(text) <= width:
        return text
    cut_off = [m for m in _KEEP.finditer(text) if m.end() > width - len(_ELLIPSIS)]
    if not cut_off:
        return text[: width - 3] + "..."
    tail = text[cut_off[0].start() :]
    room = width // 2
    if len(tail) > room:  # keep the last span whole; drop what lies between
        last = cut_off[-1]
        tail = text[last.start() : last.end()][:room]
    head = text[: width - len(tail) - len(_ELLIPSIS)]
    return head + _ELLIPSIS + tail
