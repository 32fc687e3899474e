"""Which PyTorch releases a line's format points to.

Input: a peeled line and the (from, to) release constraints the grammar found in its message.
Output: a release range such as ``2.4``, ``2.2+``, ``<=1.13`` or ``2.0-2.3``, or None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from nccl_triage.model import Line, PrefixKind

_VERSIONS = (
    "1.8",
    "1.9",
    "1.10",
    "1.11",
    "1.12",
    "1.13",
    "2.0",
    "2.1",
    "2.2",
    "2.3",
    "2.4",
    "2.5",
    "2.6",
    "2.7",
    "2.8",
    "2.9",
)
_INDEX = {v: i for i, v in enumerate(_VERSIONS)}
_OLD_C10 = re.compile(r"\[[FEWIV] ")  # "[E ProcessGroupNCCL.cpp:475] ": 2.3 and before
_NEW_C10 = re.compile(r"\[[FEWIV]\d")  # "[E1022 10:11:12.123 ...]": 2.4 and after


def era_of(line: Line, constraints: Iterable[tuple[str, str]]) -> str | None:
    """Narrow the PyTorch release range from a line's format features."""
    lo, hi = 0, len(_VERSIONS) - 1
    narrowed = False
    rank_tee = False
    header = ""
    cons = list(constraints)
    for p in line.prefixes:
        if p.kind == PrefixKind.HEADER and not header:
            header = p.text
        elif p.kind == PrefixKind.TEE and p.text.startswith("[rank"):
            rank_tee = True
    if header.startswith("[") and _OLD_C10.match(header):
        cons.append(("", "2.3"))
    elif header.startswith("[") and _NEW_C10.match(header):
        cons.append(("2.4", ""))
    if rank_tee:
        cons.append(("2.2", ""))
    for a, b in cons:
        new_lo = _INDEX[a] if a else 0
        new_hi = _INDEX[b] if b else len(_VERSIONS) - 1
        if max(lo, new_lo) > min(hi, new_hi):
            continue  # contradicting evidence (a backport, a fork): keep what we had
        lo, hi = max(lo, new_lo), min(hi, new_hi)
        narrowed = True
    if not narrowed:
        return None
    if lo == hi:
        return _VERSIONS[lo]
    if hi == len(_VERSIONS) - 1:
        return f"{_VERSIONS[lo]}+"
    if lo == 0:
        return f"<={_VERSIONS[hi]}"
    return f"{_VERSIONS[lo]}-{_VERSIONS[hi]}"
