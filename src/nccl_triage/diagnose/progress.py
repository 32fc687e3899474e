"""Progress bars and counters: what a loop was doing, how far it got, how long it had run.

Input: the text of a line (a progress bar may be glued to other text, redrawn with carriage
returns, or behind prefixes). Output: a :class:`Progress` with the bar's description, its
count and total, percentage, elapsed and remaining seconds and rate; or None.

Forms read: tqdm and rich bars (``desc: 39%|███▉ | 26/67 [24:51<30:30, 44.65s/it]``, with or
without a description or a postfix), Lightning's (``Validation DataLoader 0: 100%|...``),
counters printed by training frameworks (mmengine ``Epoch(val) [2][3400/3402] eta: 0:00:02``,
detectron2 ``Inference done 11/94959. ... ETA=1:12:49``) and plain counters of a loop
(``Rank 0 processing scenario 1764 / 3037``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# tqdm / rich: "desc:  39%|███▉      | 26/67 [24:51<30:30, 44.65s/it, loss=0.1]"
_TQDM = re.compile(
    r"(?P<desc>[^|\r\n]{0,160}?)(?::\s*|\s+|^)(?P<pct>\d{1,3})%\s*\|[^|\n]{0,200}\|\s*"
    r"(?P<n>\d+(?:\.\d+)?[kMG]?)/(?P<total>\d+(?:\.\d+)?[kMG]?|\?)"
    r"(?:\s*\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?(?:,\s*(?P<rate>[^,\]]+))?)?"
)
# a bar cut before its counts: "... 0 corrupt:   6%|▋"
_PERCENT = re.compile(r"(?P<desc>[^|\r\n]{0,160}?):\s*(?P<pct>\d{1,3})%\s*\|")
# "Epoch(val)  [2][3400/3402]  eta: 0:00:00", "Iter(test) [1550/4020] eta: 1:57:23"
_MMENGINE = re.compile(
    r"(?P<desc>(?:Epoch|Iter)\((?:train|val|test)\))\s*(?:\[\d+\])?\s*\[\s*(?P<n>\d+)/(?P<total>\d+)\]"
    r"(?:.*?eta:\s*(?P<remaining>[\d:]+(?:\s*days?,\s*[\d:]+)?))?"
)
# detectron2: "Inference done 11/94959. Dataloading: 0.0011 s/iter. ... ETA=1:12:49"
_DONE = re.compile(
    r"(?P<desc>Inference|Evaluation|Prediction)\s+done\s+(?P<n>\d+)/(?P<total>\d+)"
    r"(?:.*?ETA=(?P<remaining>[\d:]+))?"
)
# a loop's own counter: "processing scenario 1764 / 3037", "Evaluating batch 12 of 50"
_COUNTER = re.compile(
    r"(?P<desc>\b[A-Za-z][\w-]*ing\b(?:\s+[A-Za-z_][\w-]*){0,3}?)\s*:?\s*#?"
    r"(?P<n>\d+)\s*(?:/|\bof\b)\s*(?P<total>\d+)\b"
)


@dataclass(frozen=True, slots=True)
class Progress:
    """One reading of a progress bar or counter."""

    desc: str  # what the bar says it does ("Map", "Validation DataLoader 0", "" for none)
    n: float
    total: float | None
    percent: float | None
    elapsed_s: float | None
    remaining_s: float | None
    rate: str | None
    form: str  # tqdm | mmengine | done | counter

    @property
    def finished(self) -> bool:
        """Tell whether the loop had reached its end."""
        return self.total is not None and self.n >= self.total


def parse_progress(text: str) -> Progress | None:
    """Read the last progress bar or counter of a line (a redrawn bar: its latest state)."""
    # Each form's literal is tested first: a search for a bar in a long line without "%"
    # costs half a millisecond (its description is matched lazily from every position).
    bar = _last(_TQDM, text) if "%" in text else None
    if bar is not None:
        total = _number(bar["total"])
        n = _number(bar["n"]) or 0.0
        return Progress(
            desc=_clean(bar["desc"]),
            n=n,
            total=total,
            percent=float(bar["pct"]),
            elapsed_s=_seconds(bar["elapsed"]),
            remaining_s=_seconds(bar["remaining"]),
            rate=bar["rate"].strip() if bar["rate"] else None,
            form="tqdm",
        )
    cut = _last(_PERCENT, text) if "%" in text else None
    if cut is not None:
        return Progress(
            desc=_clean(cut["desc"]),
            n=float(cut["pct"]),
            total=100.0,
            percent=float(cut["pct"]),
            elapsed_s=None,
            remaining_s=None,
            rate=None,
            form="percent",
        )
    for rx, form, needs in (
        (_MMENGINE, "mmengine", ("Epoch(", "Iter(")),
        (_DONE, "done", ("done",)),
        (_COUNTER, "counter", ("/", "of")),
    ):
        m = _last(rx, text) if any(x in text for x in needs) else None
        if m is None:
            continue
        n, total = float(m["n"]), float(m["total"])
        if total <= 0 or n > total * 1.01 or (form == "counter" and total < 2):
            continue
        return Progress(
            desc=_clean(m["desc"]),
            n=n,
            total=total,
            percent=round(100 * n / total, 1),
            elapsed_s=None,
            remaining_s=_seconds(m.groupdict().get("remaining")),
            rate=None,
            form=form,
        )
    return None


def _last(rx: re.Pattern[str], text: str) -> re.Match[str] | None:
    if len(text) > 8192:
        text = text[-8192:]
    last = None
    for last in rx.finditer(text):  # noqa: B007 - the last match is the bar's latest state
        pass
    return last


def _clean(desc: str | None) -> str:
    if not desc:
        return ""
    desc = desc.strip(" \t:\r[]")
    return re.sub(r"\s+", " ", desc)[-120:]


def _number(text: str | None) -> float | None:
    if not text or text == "?":
        return None
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1.0)
    try:
        return float(text.rstrip("kMG")) * scale
    except ValueError:
        return None


def _seconds(text: str | None) -> float | None:
    """``1:22:01`` or ``24:51`` (or ``1 day, 2:03:04``) in seconds; None for ``?``."""
    if not text or "?" in text:
        return None
    days = 0.0
    m = re.match(r"(\d+)\s*days?,\s*(.*)", text)
    if m:
        days, text = float(m[1]), m[2]
    parts = [float(p) for p in text.split(":") if p.strip().isdigit()]
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + p
    return days * 86400 + seconds
