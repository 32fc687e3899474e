"""What an NCCL message says: its severity, error class, reason, peer, interface and device.

Input: the text NCCL (or a framework wrapping it) printed after its prefix: the message of a
``NCCL WARN`` / ``NCCL INFO`` line, or the reason of an error a framework raised. Output: flat
fields for the event (``severity``, ``error_class``, ``reason``, ``cuda_error``,
``peer_address``/``peer_port``, ``interface``, ``device``, ``nccl_version``, ``source_file`` /
``source_line``).

A WARN is not always a failure: NCCL warns on healthy runs about libraries and devices it skips
and fallbacks it takes. Each family of WARN text is an ``error`` or a ``notice`` by what it
means (the tables below, each entry with the kind of line it stands for); a WARN nobody listed
as a notice is an error. INFO lines are ``info``, except NCCL's error-return traces
(``init.cc:1388 -> 2``), which only print on an error path.
"""

from __future__ import annotations

import re

from nccl_triage.parse.fields_common import NCCL_RESULTS, Fields

# WARN text that NCCL prints on healthy runs: what it skips, falls back from, or retries.
_NOTICES = re.compile(
    "|".join(  # noqa: FLY002 - one alternative a line, each with what it stands for
        (
            r"Failed to open libibverbs",  # no InfiniBand library: NCCL uses sockets
            r"NET/IB\s*:\s*Unable to open device",  # an IB device it skips
            r"Call to ibv_open_device failed",  # the same, from the verbs wrapper
            r"NET/IB\s*:\s*No device found",
            r"NET/Plugin",  # no network plugin, or an older plugin API: the built-in is used
            r"No plugin found|Failed to find ncclNetPlugin|ncclNetPlugin_v\d+ symbol",
            r"Could not find real path of",  # a PCI path of a virtual NIC (topology only)
            r"Cannot get incoming CPU",  # FastSocket plugin: CPU affinity unknown
            r"Maximum retry reached for (?:accept|connect)",  # FastSocket: it retries on
            r"\bretrying\b|will retry",  # NCCL retries the call itself
            r"[Tt]opology|XML|topo file",  # topology files it cannot read: it probes instead
            r"GPU Direct RDMA (?:Disabled|not supported)|GDRCOPY|NCCL_GDR",
            r"[Ii]gnoring|is deprecated|has been deprecated|will be removed",
            r"NVLS (?:multicast )?support is not available",
            r"Unable to set (?:the )?(?:CPU )?affinity",
        )
    )
)
# What a failure's text tells about its class (when no ncclResult number says it).
_CLASSES = (
    (
        # a CUDA call NCCL made failed (its IPC handles, registering host memory for SHM)
        re.compile(
            r"unhandled cuda error|Cuda failure|CUDA error|CUDA IPC handle|register host buffer",
            re.IGNORECASE,
        ),
        "ncclUnhandledCudaError",
    ),
    (re.compile(r"unhandled system error|system call", re.IGNORECASE), "ncclSystemError"),
    (re.compile(r"internal (?:check failed|error)", re.IGNORECASE), "ncclInternalError"),
    (re.compile(r"invalid argument", re.IGNORECASE), "ncclInvalidArgument"),
    (re.compile(r"invalid usage|Duplicate GPU", re.IGNORECASE), "ncclInvalidUsage"),
    (
        re.compile(r"remote process exited|network error|remote error", re.IGNORECASE),
        "ncclRemoteError",
    ),
)
_TRACE = re.compile(r"^(?:([\w./+-]+:\d+)\s*)?->\s*(\d+)\b")
_CUDA_FAILURE = re.compile(r"Cuda failure\s*(?:\d+\s*)?'([^']*)'")
# "10.0.0.4<52638>", "[fe80::1%ib0]<50000>", "100.96.188.199<41468>"
_PEER = re.compile(r"(?P<addr>\[?[0-9A-Fa-f:.]*[0-9A-Fa-f][0-9A-Fa-f:.%\w]*\]?)<(?P<port>\d+)>")
_INTERFACE = re.compile(
    r"(?:Using (?:interface |\[\d+\])?|interface |OOB |on interface )"
    r"(?P<iface>[A-Za-z][\w.-]*?)(?::[\d.]+|:\d+/|:[0-9a-fA-F]*:|\b)"
)
_DEVICE = re.compile(r"\b(?:on dev |device |hca )(?P<dev>mlx\w+|[A-Za-z]+\d+(?:_\w+)?)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+[\w.+-]*)")
_SOURCE = re.compile(r"^([\w./+-]+):(\d+)$")


def severity_of(level: str, message: str) -> str:
    """``error``, ``notice`` or ``info`` for an NCCL line of ``level`` saying ``message``."""
    if level == "WARN":
        return "notice" if _NOTICES.search(message) else "error"
    if _TRACE.match(message.strip()):
        return "error"  # an error returned up NCCL's call stack
    return "info"


def error_class(text: str) -> str | None:
    """The ncclResult_t a failure's text names or implies, or None."""
    m = re.search(r"\bnccl(?:Unhandled\w+|System|Internal|Invalid\w+|Remote)Error\b", text)
    if m:
        return m.group(0)
    for rx, name in _CLASSES:
        if rx.search(text):
            return name
    return None


def read_message(level: str, message: str, source_location: str | None = None) -> Fields:
    """The fields of an NCCL line of ``level`` whose text after the prefix is ``message``."""
    text = message.strip()
    out: Fields = {"severity": severity_of(level, text)}
    if source_location:
        src = _SOURCE.match(source_location)
        if src:
            out["source_file"], out["source_line"] = src[1], int(src[2])
    trace = _TRACE.match(text)
    if trace:
        if trace[1] and "source_file" not in out:
            src = _SOURCE.match(trace[1])
            if src:
                out["source_file"], out["source_line"] = src[1], int(src[2])
        code = int(trace[2])
        out["error_class"] = NCCL_RESULTS.get(code, f"ncclResult {code}")
        return out
    if level == "WARN":
        out.update(read_reason(text))
    else:
        version = _VERSION.search(text)
        if version:
            out["nccl_version"] = version[1]
    return out


def read_reason(text: str) -> Fields:
    """What a failure's reason says: its class, a CUDA error, the peer, interface, device."""
    out: Fields = {}
    if text:
        out["reason"] = text
    cls = error_class(text)
    if cls:
        out["error_class"] = cls
    cuda = _CUDA_FAILURE.search(text)
    if cuda:
        out["cuda_error"] = cuda[1]
    peer = _PEER.search(text)
    if peer:
        out["peer_address"] = peer["addr"].strip("[]")
        out["peer_port"] = int(peer["port"])
    iface = _INTERFACE.search(text)
    if iface:
        out["interface"] = iface["iface"]
    dev = _DEVICE.search(text)
    if dev:
        out["device"] = dev["dev"]
    version = _VERSION.search(text)
    if version:
        out["nccl_version"] = version[1]
    return out
