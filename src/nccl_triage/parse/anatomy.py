"""Line anatomy: peel the stacked prefixes off a line and keep what they say.

Input: a :class:`Line` with its decoded ``text``. Output: the same line with ``message`` (the
text after the outer prefixes), ``prefixes`` (outermost first), and the rank, local rank, role,
host, pid, severity and time that the prefixes carry. Section 1 of the format reference lists
the layers: log-viewer line numbers, JSON log lines, timestamps, launcher prefixes (srun
``--label``, Ray actors, job systems), torchrun's tee prefix, the C++ ``[rankN]:`` global rank,
Python's excepthook ``[rankN]: ``, and the c10 / glog / Python logging headers. A progress bar
or any unknown prefix glued in front of a header is skipped as ``lead``.

The process-group prefix (``[PG ID 0 PG GUID 0(default_pg) Rank 3]``) belongs to the message
and is left for the grammar, which needs it inside nested messages too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime

from nccl_triage.model import Line, Prefix, PrefixKind

_LEVELS = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"

# Outer layers, tried in order at the current position until none applies.
# "[1757] " (web log viewers), cat -n; not NCCL's device tag ("[3] NCCL WARN", "[3] include/...")
_VIEWER_LINE = re.compile(r"\[(\d+)\] (?!NCCL |[\w/.+-]+\.(?:cc|cu|h|c|cpp):\d+ )|\s*(\d+)\t")
# markdown quote markers and an inline-code backtick before a pasted line
_QUOTE = re.compile(r"(?:(?:> ?)+|`+)(?=\S)")
_SPACE = re.compile(r"\s+")
_ISO = re.compile(
    r"\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d)(?::(\d\d)(?:[.,](\d+))?)?(Z|[+-]\d\d:?\d\d)?\]?"
    r"(?=[\s|\]-]|$)\s*"
)
_MONTHDAY_TS = re.compile(  # vLLM and friends: "INFO 02-03 13:14:04 llm_engine.py:706] "
    rf"({_LEVELS}) ((\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?) [\w./-]+:\d+\] "
)
_PY_OLD = re.compile(rf"({_LEVELS}):([\w.]+):")  # "WARNING:torch.distributed.run:"
_PY_21 = re.compile(rf"([\w.]+): \[({_LEVELS})\] ")  # "torch.distributed.elastic...: [ERROR] "
_HF = re.compile(rf"- ({_LEVELS}) - ([\w.<>]+) - ")  # "- INFO - __main__ - "
# Hugging Face transformers' own format: "[INFO|trainer.py:3478] 2024-03-14 05:13:20,402 >> "
_HF_TRANSFORMERS = re.compile(
    rf"\[({_LEVELS})\|[\w./-]+:\d+\] (\d{{4}})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d+))? >> "
)
_LOGURU = re.compile(rf"\| ({_LEVELS}|SUCCESS|TRACE)\s*\| ([\w.<>:]+) - ")
# "2023-09-07 09:14:40,098 ERROR train.py:308 ...", but not NCCL 1.x's own "WARN src/reduce.cu:126"
# "ERROR message", and rich's handler (accelerate, Lightning): "ERROR    message    api.py:673"
_LEVEL_WORD = re.compile(rf"({_LEVELS}) +(?=\S)(?![\w/.+-]+\.(?:cu|cc):\d+ )")
_RICH_WHERE = re.compile(r"\s{2,}[\w.-]+\.py:\d+\s*$")
_JOBSYS = re.compile(r"([0-9a-f]{6,}) \[rank=(\d+)\] \|\| ")  # Determined: "fa88a9df [rank=1] || "
_RAY = re.compile(r"\((\w+) pid=(\d+)(?:, ip=([0-9a-fA-F.:]+))?\)\s*")
_SRUN = re.compile(r"(\d{1,5}): ")
# "[default3]:", "[rank0]:" (no space); "[default0]: " before a line that starts with a space
# (tqdm's " 33%|..."), but never "[rank0]: " (the Python excepthook's prefix)
_TEE = re.compile(
    r"\[([A-Za-z_][\w.-]*?)(\d+)\]:(?! )|\[((?!rank\d)[A-Za-z_][\w.-]*?)(\d+)\]: +(?=\S)"
)
_EXCEPTHOOK = re.compile(r"\[rank(\d+)\]: ")  # Python excepthook / torch._logging: with a space
_C10 = (
    re.compile(  # "[E ProcessGroupNCCL.cpp:475] " (<= 2.3), "[E1022 10:11:12.123456789 f.cpp:1] "
        r"\[([FEWIV])(?:(\d{3,4}) (\d\d):(\d\d):(\d\d)(\.\d+)?)? ([\w.+-]+):(\d+)\] ?"
    )
)
_GLOG = re.compile(  # glog builds and torchrun 2.3+: "E0517 08:24:03.805000 140617 path.py:826] "
    r"([VIWEFC])(\d{4}) (\d\d):(\d\d):(\d\d)(\.\d+)? +(\d+) ([\w./+-]+):(\d+)\] ?"
)
# An embedded header: what a glued progress bar or an unknown launcher prefix hides.
_EMBEDDED = re.compile(
    r"\[rank\d+\]:\[[FEWIV]"
    r"|\[[A-Za-z_][\w.-]*\d+\]:\[rank\d+\]:"
    r"|\[[FEWIV](?:\d{3,4} \d\d:\d\d:\d\d\.\d+)? [\w.+-]+:\d+\] "
    r"|(?<![\w.])[VIWEFC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./+-]+:\d+\] "
)
_FEWIV = frozenset("FEWIV")
_GLOG_TIME = re.compile(r"[VIWEFC]\d{4} \d\d:\d\d:\d\d\.")  # how _EMBEDDED's last one starts


def _may_hide_header(rest: str) -> bool:
    """Whether _EMBEDDED may find a header in ``rest``: cheap tests that never miss one.

    Every header holds a ``]``; the first two of _EMBEDDED a ``[rank``, the third a ``[`` and a
    level letter, the last a glog time.
    """
    if "]" not in rest:
        return False
    if "[rank" in rest:
        return True
    i = rest.find("[")
    while i >= 0:
        if rest[i + 1 : i + 2] in _FEWIV:
            return True
        i = rest.find("[", i + 1)
    return _GLOG_TIME.search(rest) is not None


_PID_MAX = 1 << 22  # Linux PID_MAX_LIMIT
_RANK_HINT = re.compile(r"\brank[=_: ]?(\d+)\b", re.IGNORECASE)
_JSON_KEYS = ("log", "message", "msg", "MESSAGE", "textPayload")
_MAX_LAYERS = 12


def peel(line: Line) -> Line:
    """Fill ``line``'s prefix fields from its text and return it."""
    text = line.text
    pos = 0
    prefixes: list[Prefix] = []
    tee_rank: int | None = None
    hint_rank: int | None = None
    final = False
    for layer in range(_MAX_LAYERS):
        if final:
            break
        rest = text[pos:]
        if layer == 0:
            m = _VIEWER_LINE.match(rest)
            if m:
                prefixes.append(Prefix(PrefixKind.VIEWER_LINE, m.group(0)))
                pos += m.end()
                continue
            if rest.startswith("{") and rest.rstrip().endswith("}"):
                inner = _json_payload(rest, line)
                if inner is not None:
                    prefixes.append(Prefix(PrefixKind.JSON, rest))
                    text, pos = inner, 0
                    continue
        found = _ANY_LAYER.match(rest)
        if found is not None:  # the first layer, in the order they are tried, that starts here
            which = _LAYER_AT.get(found.lastindex or 0)
            if which is None:  # (cannot be: each layer is one group)
                break
            rx = _LAYER_RX[which]
            m = rx.match(rest)
            if m is None:  # (cannot be: the same pattern)
                break
            if which <= _QUOTE_AT:  # spaces, markdown quotes
                pos += m.end()
                continue
            if rx is _ISO:
                _set_time(
                    line,
                    m.group(0).strip().strip("[]"),
                    "iso",
                    int(m[2]),
                    int(m[3]),
                    m[4],
                    m[5],
                    m[6],
                    m[7],
                )
                prefixes.append(Prefix(PrefixKind.TIMESTAMP, m.group(0)))
                pos += m.end()
                continue
            if rx is _HF_TRANSFORMERS:
                line.severity = line.severity or m[1][0]
                _set_time(
                    line,
                    m.group(0)[m.group(0).index("]") + 2 : -4],
                    "iso",
                    int(m[3]),
                    int(m[4]),
                    m[5],
                    m[6],
                    m[7],
                    m[8],
                )
                prefixes.append(Prefix(PrefixKind.HEADER, m.group(0)))
                pos += m.end()
                final = True
                continue
            if rx is _MONTHDAY_TS:
                line.severity = line.severity or m[1][0]
                _set_time(line, m[2], "iso", int(m[3]), int(m[4]), m[5], m[6], m[7], m[8])
                prefixes.append(Prefix(PrefixKind.HEADER, m.group(0)))
                pos += m.end()
                final = True
                continue
            if rx is _C10:
                line.severity = m[1]
                if m[2]:
                    md = int(m[2])
                    stamp = f"{md // 100:02d}-{md % 100:02d} {m[3]}:{m[4]}:{m[5]}{m[6] or ''}"
                    _set_time(line, stamp, "c10", md // 100, md % 100, m[3], m[4], m[5], m[6])
                prefixes.append(Prefix(PrefixKind.HEADER, m.group(0)))
                pos += m.end()
                final = True
                continue
            if rx is _GLOG:
                line.severity = m[1]
                md = int(m[2])
                stamp = f"{md // 100:02d}-{md % 100:02d} {m[3]}:{m[4]}:{m[5]}{m[6] or ''}"
                _set_time(line, stamp, "glog", md // 100, md % 100, m[3], m[4], m[5], m[6])
                if line.pid is None and m[8].endswith(".py") and int(m[7]) <= _PID_MAX:
                    # torchrun 2.6+ writes its process id here; 2.3-2.5 a thread id (a pthread
                    # address, far above any pid), and glog-built C++ a thread id (reference §1c).
                    line.pid = int(m[7])
                prefixes.append(Prefix(PrefixKind.HEADER, m.group(0)))
                pos += m.end()
                final = True
                continue
            kind, _rx, handler = _SIMPLE[which - _SIMPLE_AT]
            prefixes.append(Prefix(kind, m.group(0)))
            pos += m.end()
            result = handler(line, m)
            if kind == "tee" and result is not None:
                tee_rank = result
            elif kind == "jobsys" and result is not None:
                hint_rank = result
            final = kind in _TERMINAL
            continue
        # Nothing known here: a glued progress bar or a custom prefix may hide a header.
        e = _EMBEDDED.search(rest) if _may_hide_header(rest) else None
        if e and e.start() > 0:
            lead = rest[: e.start()]
            prefixes.append(Prefix(PrefixKind.LEAD, lead))
            h = _RANK_HINT.search(lead)
            if h and hint_rank is None:
                hint_rank = int(h[1])
            pos += e.start()
            continue
        break
    line.message = text[pos:]
    if prefixes and prefixes[-1].kind == PrefixKind.LOGGER and prefixes[-1].text.endswith("  "):
        # rich's handler right-aligns where the record came from: "...   api.py:673"
        line.message = _RICH_WHERE.sub("", line.message)
    line.prefixes = tuple(prefixes)
    if line.rank is None:
        line.rank = hint_rank
    if line.rank is None and tee_rank is not None and line.role == "rank":
        # torchtitan's "--role rank" tee prefix looks like the C++ global-rank prefix; with
        # nothing better, it is the best rank there is (local and global agree on one node).
        line.rank = tee_rank
    return line


def _json_payload(text: str, line: Line) -> str | None:
    if text[1:].lstrip(" \t\n\r")[:1] not in ('"', "}"):
        return None  # no JSON object (a Python dict printed with quotes ', a loss dict)
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key in _JSON_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            host = obj.get("host") or obj.get("hostname") or obj.get("pod") or obj.get("pod_name")
            k8s = obj.get("kubernetes")
            if host is None and isinstance(k8s, dict):
                host = k8s.get("pod_name") or k8s.get("host")
            if isinstance(host, str):
                line.host = host
            return value.rstrip("\r\n")
    return None


def _on_c10_rank(line: Line, m: re.Match[str]) -> int | None:
    line.rank = int(m[1])
    return None


def _on_tee(line: Line, m: re.Match[str]) -> int | None:
    role, num = (m[1], int(m[2])) if m[1] is not None else (m[3], int(m[4]))
    if role == "rank" and _RANK_AHEAD.match(m.string, m.end()) is None and line.rank is None:
        # "[rank3]:" followed by a c10 header or a message: the C++ global-rank prefix.
        # Two rank-shaped prefixes in a row: this first one is torchrun's tee (a local rank).
        line.rank = num
        return None
    line.role = role
    line.local_rank = num
    return num


_RANK_AHEAD = re.compile(r"\[rank\d+\]:")


def _on_excepthook(line: Line, m: re.Match[str]) -> int | None:
    if line.rank is None:
        line.rank = int(m[1])
    return None


def _on_ray(line: Line, m: re.Match[str]) -> int | None:
    line.pid = int(m[2])
    if m[3]:
        line.host = m[3]
    return None


def _on_jobsys(line: Line, m: re.Match[str]) -> int | None:
    return int(m[2])


def _on_level(line: Line, m: re.Match[str]) -> int | None:
    line.severity = line.severity or m[1][0]
    return None


def _on_py21(line: Line, m: re.Match[str]) -> int | None:
    line.severity = line.severity or m[2][0]
    return None


def _ignore(line: Line, m: re.Match[str]) -> int | None:
    return None


def _on_srun(line: Line, m: re.Match[str]) -> int | None:
    return None


_SIMPLE: tuple[
    tuple[PrefixKind, re.Pattern[str], Callable[[Line, re.Match[str]], int | None]], ...
] = (
    (PrefixKind.EXCEPTHOOK, _EXCEPTHOOK, _on_excepthook),
    (PrefixKind.TEE, _TEE, _on_tee),
    (PrefixKind.LAUNCHER, _RAY, _on_ray),
    (PrefixKind.JOBSYS, _JOBSYS, _on_jobsys),
    (PrefixKind.LOGGER, _PY_OLD, _on_level),
    (PrefixKind.LOGGER, _PY_21, _on_py21),
    (PrefixKind.LOGGER, _HF, _on_level),
    (PrefixKind.LOGGER, _LOGURU, _on_level),
    (PrefixKind.LAUNCHER, _SRUN, _on_srun),
    (PrefixKind.LOGGER, _LEVEL_WORD, _on_level),
)
_TERMINAL = frozenset({PrefixKind.EXCEPTHOOK, PrefixKind.LOGGER})
# Every layer that peel tries in turn at a position, as one pattern: where none starts (a
# message, a loss dict), one match says so instead of a dozen.
# Each layer is a group of it: the group that matched tells the layer (a second match of the
# layer's own pattern gives its fields), instead of a dozen tries.
_LAYER_RX = (
    _SPACE,
    _QUOTE,
    _ISO,
    _HF_TRANSFORMERS,
    _MONTHDAY_TS,
    *(rx for _k, rx, _h in _SIMPLE),
    _C10,
    _GLOG,
)
_QUOTE_AT = _LAYER_RX.index(_QUOTE)
_SIMPLE_AT = _LAYER_RX.index(_SIMPLE[0][1])
assert _LAYER_RX.index(_SPACE) < _QUOTE_AT < _SIMPLE_AT  # (spaces and quotes first)
assert not any(rx.groupindex or rx.flags & ~re.UNICODE for rx in _LAYER_RX)  # one pattern
_ANY_LAYER = re.compile("|".join(f"({rx.pattern})" for rx in _LAYER_RX))
_LAYER_AT: dict[int, int] = {}
for _i in range(len(_LAYER_RX)):
    # each layer's group comes after the groups of the layers before it
    _LAYER_AT[1 + _i + sum(r.groups for r in _LAYER_RX[:_i])] = _i
del _i


def _set_time(
    line: Line,
    text: str,
    clock: str,
    month: int,
    day: int,
    hh: str | None,
    mm: str | None,
    ss: str | None,
    frac: str | None,
) -> None:
    if line.clock in ("c10", "glog") and clock == "iso":
        return  # the process's own clock wins over a log shipper's
    line.time = text
    line.clock = clock
    line.ts = to_seconds(month, day, int(hh or 0), int(mm or 0), int(ss or 0), frac or "")


def to_seconds(month: int, day: int, hh: int, mm: int, ss: int, frac: str = "") -> float | None:
    """Seconds since 1 January of a leap year, from a month/day timestamp without a year.

    c10 and glog headers carry no year; every clock is therefore reduced to the same
    year-less scale, which orders and spaces lines correctly within one job (a job that runs
    across New Year's Eve is the exception).
    """
    try:
        moment = datetime(2000, month, day, hh, mm, ss)
    except ValueError:
        return None
    seconds = (moment - datetime(2000, 1, 1)).total_seconds()
    digits = frac.lstrip(".,")
    return seconds + (float("0." + digits) if digits.isdigit() else 0.0)
