"""Fatal signals, and whether the backtrace after one puts the crash inside NCCL.

Input: a message (a line with its prefixes peeled) and the physical lines after it. Output:
the signal's name and the NCCL function or library the crashing frames run through, or None.

A process killed by a segmentation fault, bus error, illegal instruction or floating-point
exception is an NCCL failure when the backtrace printed under the signal runs through NCCL
(``libnccl.so``, RCCL's ``librccl.so``, ``ncclGroupEnd``, ``pncclAllReduce``, a
``ProcessGroupNCCL`` method, Horovod's ``NCCLContext``), or, for Python's faulthandler, when
the crashing thread was inside a collective of ``torch.distributed``. Every handler prints it
its own way: UCX (``Caught signal 11 (...)`` and numbered frames), Open MPI (``*** Process
received signal ***``, ``[ 2] /usr/lib/libnccl.so.2(+0x2b136)[0x7f..]``), gdb (``Thread 787
received signal SIGBUS``, ``#0 0x.. in ncclShmOpen``), abseil and glog (``*** SIGSEGV received
at time=``, ``PC: @ 0x..``), faulthandler (``Fatal Python error: Segmentation fault`` and the
threads' Python frames). An abort is left out: NCCL and the watchdog abort on purpose after
their own message, which is the failure to report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nccl_triage.parse.fields_common import signame

# A fatal signal announced by a handler, a debugger or Python. Group names say which.
HEAD = re.compile(
    r"Caught signal (?P<ucx>\d+) \("
    r"|\*\*\* Process received signal \*\*\*"
    r"|Fatal Python error: (?P<py>Segmentation fault|Bus error|Floating[- ]point exception"
    r"|Illegal instruction)"
    r"|(?:received|terminated with) signal (?P<gdb>SIG(?:SEGV|BUS|ILL|FPE))\b"
    r"|\*\*\* (?P<glog>SIG(?:SEGV|BUS|ILL|FPE)) (?:\(@0x[0-9a-fA-F]+\) )?received"
    r"|(?P<handler>SIG(?:SEGV|BUS|ILL|FPE)) handler"
)
_FATAL = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"}
_BY_NAME = {
    "segmentation fault": "SIGSEGV",
    "bus error": "SIGBUS",
    "illegal instruction": "SIGILL",
    "floating point exception": "SIGFPE",
    "floating-point exception": "SIGFPE",
}
# Open MPI's second line: "Signal: Segmentation fault (11)"
_MPI_SIGNAL = re.compile(r"Signal: [^(]*\((\d+)\)")

# A native frame: an address, or a numbered / @-marked frame of any handler's format.
_NATIVE_FRAME = re.compile(
    r"0x[0-9a-fA-F]{4,}|^\s*(?:\[[\w.-]+:\d+\]\s*)?(?:\[\s*\d+\]|#\d+|\d+:?)\s+\S|\s@\s"
)
# NCCL in a frame: its libraries, its (p)ncclXxx functions, C++ names, mangled names.
_NCCL_IN_FRAME = re.compile(
    r"lib[nr]ccl[\w.-]*\.so|\bp?nccl[A-Z]\w*|\bnccl::|ProcessGroupNCCL|\d+NCCL\w*|/nccl/src/"
    r"|pynccl\w*\.py"
)
# libnccl's own log lines ("host:1:2 [0] NCCL INFO ...") interleave with a backtrace: not frames
_NCCL_LOG = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT)\b")
_NCCL_NAME = re.compile(r"\bp?(nccl[A-Z]\w*)|\b(lib[nr]ccl)[\w.-]*\.so|(ProcessGroupNCCL)")

_PY_THREAD = re.compile(r"\b(Current thread|Thread|Stack)\b[^\"]*most recent call first")
_PY_FRAME = re.compile(r'\bFile "(?P<file>[^"]+)", line \d+ in (?P<func>[\w<>]+)\s*$')
# the collectives of torch.distributed (their Python frame is the top one when NCCL crashes)
_C10D_FILE = re.compile(r"torch/distributed/distributed_c10d\.py$")


def fatal_head(message: str) -> str | None:
    """The signal a fatal-signal line announces (``SIGSEGV``); None for other lines.

    Open MPI names the signal on the next line: its head gives ``?`` until that is read.
    """
    if "ignal" not in message and "SIG" not in message and "Fatal" not in message:
        return None  # most lines: no need for the search
    m = HEAD.search(message)
    if m is None:
        return None
    if m["ucx"]:
        return signame(int(m["ucx"]))
    if m["py"]:
        return _BY_NAME[m["py"].lower()]
    name = m["gdb"] or m["glog"] or m["handler"]
    return name if name else "?"


def nccl_frame(signal: str, after: Sequence[str]) -> tuple[str, str] | None:
    """``(signal, where)`` when the backtrace in ``after`` runs through NCCL, else None.

    ``after`` are the lines after the head, closest first; ``where`` is the NCCL function,
    library or collective the crashing frames name.
    """
    if signal == "?":  # Open MPI: "Signal: Segmentation fault (11)" follows the head
        found = next((m for line in after[:3] if (m := _MPI_SIGNAL.search(line))), None)
        if found is None:
            return None
        signal = signame(int(found[1]))
    if signal not in _FATAL:
        return None
    python = _python_frame(after)
    if python is not None:
        return signal, python
    for line in after:
        if _NCCL_LOG.search(line) or not _NATIVE_FRAME.search(line):
            continue
        if _NCCL_IN_FRAME.search(line):
            name = _NCCL_NAME.search(line)
            return signal, next((g for g in name.groups() if g), "NCCL") if name else "NCCL"
    return None


def _python_frame(after: Sequence[str]) -> str | None:
    """The collective or NCCL call faulthandler shows the crashing thread in, if any.

    The ``Current thread`` (or, single-threaded, ``Stack``) block is the thread that took the
    signal; without one the signal hit a native thread, and a thread waiting in a collective
    is the best evidence of where.
    """
    blocks: list[tuple[str, tuple[str, str] | None]] = []
    top_pending: str | None = None
    for line in after:
        head = _PY_THREAD.search(line)
        if head:
            top_pending = head[1]
            continue
        frame = _PY_FRAME.search(line)
        if frame and top_pending is not None:
            blocks.append((top_pending, (frame["file"], frame["func"])))
            top_pending = None
    current = [top for kind, top in blocks if kind in ("Current thread", "Stack")]
    for top in current or [top for _kind, top in blocks]:
        if top is None:
            continue
        file, func = top
        if _NCCL_IN_FRAME.search(file) or _NCCL_IN_FRAME.search(func):
            return func
        if _C10D_FILE.search(file.replace("\\", "/")):
            return func
    return None
