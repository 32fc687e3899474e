"""What the two halves of the grammar's transformer share: field regexes and small helpers.

Input: nothing. Output: the regular expressions and helpers that
:mod:`nccl_triage.parse.fields_torch` and :mod:`nccl_triage.parse.fields_libs` use to read the
values inside a message.
"""

from __future__ import annotations

import re
from typing import Any

Fields = dict[str, Any]


class NotAMessage(Exception):
    """Raised by the transformer when a parse tree turns out not to be a log message."""


PG_ID = re.compile(
    r"\[\s*PG\s+ID\s+(?P<pg>\S+)\s+PG\s+GUID\s*(?P<guid>[^\s(\]]*)\s*(?:\((?P<desc>[^)]*)\))?"
    r"\s*Rank\s*(?P<rank>\d+)\s*\]"
)
PG_NAME = re.compile(
    r"\[\s*PG\s+(?P<pg>[^\s(\]]+)\s*(?:\((?P<desc>[^)]*)\))?\s*Rank\s*(?P<rank>\d+)\s*\]"
)
WORK_RANK = re.compile(r"\[\s*Rank\s*(?P<rank>\d+)\s*\]")
COUNTERS = re.compile(
    r"[Ll]ast\s*enqueued\s*(?:NCCL\s*)?work:\s*(-?\d+),\s*last\s*completed\s*(?:NCCL\s*)?work:\s*(-?\d+)"
)
SIGNAL = re.compile(r"Signal\s+(\d+)\s+\((SIG\w+)\)")
ERROR_TRACE = re.compile(r"(?:([\w./+-]+:\d+)\s*)?->\s*(\d+)\b")
NCCL_RESULTS = {  # ncclResult_t, the number at the end of an error trace
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
WORK_KEYS = {
    "SeqNum": "seq",
    "OpType": "op_type",
    "NumelIn": "numel_in",
    "NumelOut": "numel_out",
    "TensorShape": "tensor_shape",
}
INFO_PATTERNS = (  # what an NCCL INFO line can tell (nranks, version, interfaces, settings)
    (
        re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) cudaDev (\d+)"),
        ("nccl_rank", "nranks", "cuda_dev"),
    ),
    (re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)"), ("nccl_version",)),
    (re.compile(r"NET/(Socket|IB) : Using (.+)"), ("net", "interfaces")),
    (re.compile(r"Bootstrap : Using (.+)"), ("bootstrap_interface",)),
    (re.compile(r"(NCCL_\w+) set by environment to (\S+?)\.?$"), ("env_name", "env_value")),
)


def looks_cut(text: str) -> bool:
    """Tell whether a free-text tail looks cut by a line wrap (short, or an open bracket)."""
    return len(text) < 16 or text.count("[") > text.count("]") or text.count("(") > text.count(")")


START_METHOD = re.compile(r"(.+?)\s*\(\s*start_method\s*:\s*(\w+)\s*\)")
FINGERPRINT = re.compile(r"Rank\s*(\d+)\s*is\s*running\s*collective:\s*CollectiveFingerPrint\(")


def balanced(text: str, start: int) -> str:
    """Return the text from ``start`` up to the parenthesis closing the one just before it."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return text[start:]  # cut: what there is


def ranks(token: Any) -> list[int]:
    """The rank numbers in a token such as ``[0, 1, 2]`` or ``3``."""
    return [int(x) for x in re.findall(r"\d+", str(token))]


SIGNALS = {
    1: "SIGHUP",
    2: "SIGINT",
    6: "SIGABRT",
    7: "SIGBUS",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}


def signame(num: int) -> str:
    """The name of signal ``num`` (``SIGSEGV``), as torchrun prints it."""
    return SIGNALS.get(num, f"SIG{num}")
