"""Events: physical lines, their prefixes, and what the grammar and the signals make of them.

Input: nothing (this module does no I/O). Output: the dataclasses the other stages pass on.
Field names of :class:`Event` are those of the JSON report (``docs/json-output.md``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from operator import attrgetter
from typing import Any, TypeVar


class Kind(StrEnum):
    """Event kinds the grammar recognises (the ``kind`` field of an event)."""

    WATCHDOG_TIMEOUT = (
        "watchdog_timeout"  # a collective timed out on one rank (every era, every form)
    )
    WATCHDOG_STATUS = "watchdog_status"  # "Timeout at NCCL work" & co.; merged into a timeout
    DESYNC_REPORT = "desync_report"  # TORCH_NCCL_DESYNC_DEBUG report lines
    FLIGHT_RECORDER = "flight_recorder"  # stack trace of the failed collective, dumps, analyzer
    TEARDOWN = "teardown"  # "Some NCCL operations have failed", "To avoid data inconsistency"
    WATCHDOG_EXCEPTION = "watchdog_exception"  # watchdog thread died of something else (CUDA...)
    TERMINATE = "terminate"  # "terminate called after throwing an instance of ..."
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"  # heartbeat monitor: watchdog stuck / no heartbeat
    DUMP_SIGNAL = "dump_signal"  # a rank told to dump because another rank timed out
    PROCESS_TERMINATED = "process_terminated"  # FATAL "Terminating the process after ... dump"
    NCCL_ERROR = "nccl_error"  # NCCL error in:/NCCL error:/ncclXxx detail/aborted communicator
    NCCL_WARN = "nccl_warn"  # libnccl "NCCL WARN" line
    NCCL_INFO = "nccl_info"  # libnccl INFO lines that matter: init, version, net, env, errors
    CUDA_ERROR = "cuda_error"  # CUDA error surfaced by the watchdog or a RuntimeError
    COLLECTIVE_MISMATCH = "collective_mismatch"  # TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprints
    WORKER_FAILED = "worker_failed"  # torchrun agent: "failed (exitcode: N) local_rank: ..."
    AGENT_SIGNAL = "agent_signal"  # torchrun agent: closing signal / death signal
    CHILD_FAILED = "child_failed"  # ChildFailedError summary record (root cause or other)
    STORE_TIMEOUT = "store_timeout"  # TCPStore/FileStore/barrier/rendezvous timeouts
    SOCKET_ERROR = "socket_error"  # c10d socket connect/listen/recv failures
    RENDEZVOUS_ERROR = "rendezvous_error"  # torch.distributed.elastic rendezvous exceptions
    GLOO_ERROR = "gloo_error"  # Gloo transport timeouts and connection errors
    ENV_WARNING = "env_warning"  # deprecated / ineffective environment variables


# The ways a job fails in NCCL: a rule's ``match: {event: failure}`` triggers on any of these,
# and any of them makes the verdict a failure (``nccl_timeout`` for a timeout, else
# ``nccl_error``). One definition, for the engine, the verdict and every command's exit status.
FAILURE_KINDS = frozenset(
    {
        Kind.WATCHDOG_TIMEOUT,
        Kind.NCCL_ERROR,
        Kind.NCCL_WARN,
        Kind.NCCL_INFO,
        Kind.WATCHDOG_EXCEPTION,
        Kind.HEARTBEAT_TIMEOUT,
        Kind.COLLECTIVE_MISMATCH,
        Kind.STORE_TIMEOUT,
        Kind.SOCKET_ERROR,
        Kind.RENDEZVOUS_ERROR,
        Kind.GLOO_ERROR,
        Kind.DESYNC_REPORT,
        Kind.FLIGHT_RECORDER,
    }
)
# Of these kinds, only some forms or severities are failures: NCCL's own lines when they say an
# error (a WARN of an error family, an error-return trace), the desync report's verdict, the
# flight-recorder analyser's finding. The rest of those kinds are context.
_FAILING_FORMS = {
    # a socket's last attempt (every address tried), or a store error raised from set-up; the
    # per-address warnings before it and a peer's reset after the job ended are context
    Kind.SOCKET_ERROR: frozenset(
        {"connect_failed_all", "listen_failed_all", "raised", "unique_id_exchange"}
    ),
    Kind.RENDEZVOUS_ERROR: frozenset({"timeout", "connection", "state", "error"}),
    Kind.DESYNC_REPORT: frozenset({"report_failed"}),
    Kind.FLIGHT_RECORDER: frozenset({"not_all_joining"}),
}


def is_failure(ev: Event) -> bool:
    """Tell whether an event is a failure of the job in NCCL (one of :data:`FAILURE_KINDS`)."""
    if ev.kind not in FAILURE_KINDS:
        return False
    if ev.kind in (Kind.NCCL_WARN, Kind.NCCL_INFO):
        return ev.detail.get("severity") == "error"
    forms = _FAILING_FORMS.get(Kind(ev.kind))
    return forms is None or ev.form in forms


class PrefixKind(StrEnum):
    """What a layer peeled off the front of a line was (see :mod:`nccl_triage.parse.anatomy`)."""

    VIEWER_LINE = "viewer_line"  # a log viewer's or issue tracker's line number
    JSON = "json"  # a JSON log line (k8s, docker) whose message field holds the line
    TIMESTAMP = "timestamp"  # an ISO / HF / glog / vLLM / loguru timestamp
    LAUNCHER = "launcher"  # srun labels, Ray actors
    JOBSYS = "jobsys"  # a job system's own prefix
    TEE = "tee"  # torchrun's tee prefix ([default3]:), or [rankN]: in PyTorch 2.2+
    EXCEPTHOOK = "excepthook"  # PyTorch's Python excepthook rank prefix ([rank3]: )
    LOGGER = "logger"  # a Python logging / loguru / Hugging Face header
    HEADER = "header"  # a c10 / glog header ([E1121 10:11:12.123 ProcessGroupNCCL.cpp:632])
    LEAD = "lead"  # unknown text before an embedded header (a glued progress bar)


@dataclass(frozen=True, slots=True)
class Prefix:
    """One layer peeled off the front of a line (outermost first)."""

    kind: PrefixKind
    text: str


@dataclass(slots=True)
class Line:
    """One segment of a physical line (a line, or the part of it after a carriage return).

    ``lineno`` is the 1-based physical line of the decompressed input, as ``sed -n Np`` shows it;
    every segment of a line redrawn with carriage returns keeps that number.
    """

    source: str
    lineno: int
    text: str  # decoded, ANSI colour codes removed, without the line ending
    message: str = ""  # text with the outer prefixes peeled off
    prefixes: tuple[Prefix, ...] = ()
    rank: int | None = None  # global rank when a prefix carries it
    local_rank: int | None = None
    role: str | None = None  # torchrun tee role ("default", "rank", a custom template)
    host: str | None = None
    pid: int | None = None
    severity: str | None = None  # E, W, I, F, ... from a c10/glog/Python header
    time: str | None = None  # the timestamp as written
    ts: float | None = None  # seconds, comparable within one log (see anatomy.to_seconds)
    clock: str | None = None  # which clock the time came from: c10, glog, iso, python


@dataclass(frozen=True, slots=True)
class Occurrence:
    """Another line where the same event shows up (a repeat, a what(), a status line)."""

    line: int
    rank: int | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used in evidence lists."""
        return {"line": self.line, "rank": self.rank, "text": self.text}


class Detail(dict[str, str | int | None]):
    """An event's family-specific fields (their names: :mod:`nccl_triage.model.fields`).

    Read-only once built, like the event that holds it: stages after the pipeline never change
    what it emitted.
    """

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("an event's fields are read-only once it is emitted")

    __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[Detail], tuple[dict[str, str | int | None]]]:
        return Detail, (dict(self),)


@dataclass(frozen=True, slots=True)
class Event:
    """A structured event recognised by the grammar, or a context signal.

    The attribute names are the JSON field names of ``docs/json-output.md``; family-specific
    values (exit code, NCCL version, interface, ...) live in ``detail`` and are flattened into
    the JSON object. Frozen: the pipeline builds events and nothing changes them afterwards
    (``dataclasses.replace`` makes a changed copy).
    """

    kind: str
    source: str
    line: int
    text: str
    rank: int | None = None
    local_rank: int | None = None
    pg: str | None = None  # process-group id or name as printed ("0", "3", "default_pg")
    pg_guid: str | None = None
    pg_desc: str | None = None
    pg_rank: int | None = None  # the rank inside that process group ("[Rank N]")
    host: str | None = None
    pid: int | None = None
    time: str | None = None
    ts: float | None = None
    seq: int | None = None
    op_type: str | None = None
    numel_in: int | None = None
    numel_out: int | None = None
    tensor_shape: str | None = None
    timeout_ms: int | None = None
    ran_for_ms: int | None = None
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    form: str | None = None  # how the event was written: watchdog, blocking_wait, status, ...
    partial: bool = False  # damaged line: only the fields that survived are set
    pytorch_era: str | None = None
    detail: Detail = field(default_factory=Detail)
    occurrences: tuple[Occurrence, ...] = ()
    repeats: int = 0  # copies hidden behind "[repeated Nx across cluster]" (not counted)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object of this event: set fields only, ``detail`` flattened."""
        out: dict[str, Any] = {"kind": self.kind, "line": self.line, "rank": self.rank}
        for name in _OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.partial:
            out["partial"] = True
        if self.repeats:
            out["repeats"] = self.repeats
        for key, value in self.detail.items():
            if value is not None and key not in out:
                out[key] = value
        out["text"] = self.text
        if self.occurrences:
            out["occurrences"] = [o.to_dict() for o in self.occurrences]
        return out


_T = TypeVar("_T")


def _direct_init(cls: type[_T]) -> type[_T]:
    """Give a frozen slotted dataclass an ``__init__`` that sets its slots directly.

    The same parameters, defaults and result as the generated one (which goes through
    ``object.__setattr__`` for each field, past the frozen class's guard), at less than half
    its cost: a job's triage builds dozens of events.
    """
    ns: dict[str, Any] = {"_MISSING": object()}
    params: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: not a plain field of __init__")
        ns[f"_set{i}"] = getattr(cls, f.name).__set__  # the slot's own descriptor
        if f.default is not MISSING:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        elif f.default_factory is not MISSING:
            ns[f"_f{i}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            body.append(f"if {f.name} is _MISSING: {f.name} = _f{i}()")
        else:
            params.append(f.name)
        body.append(f"_set{i}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__")
    source = f"def __init__(self, {', '.join(params)}):\n" + "".join(f"    {b}\n" for b in body)
    exec(source, ns)  # noqa: S102 - code made here from the class's own field names
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - (mypy: no method assignment)
    return cls


_direct_init(Event)


_OPTIONAL_FIELDS = (
    "local_rank",
    "pg",
    "pg_guid",
    "pg_desc",
    "pg_rank",
    "host",
    "pid",
    "time",
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
    "pytorch_era",
)


_SHAPES: dict[type, tuple[Any, dict[str, int]]] = {}


def evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the dataclasses here (every field given to ``__init__``).

    The same copy at half the cost: the pipeline copies events per repeat folded in and per
    file of a job, lines per repeated line.
    """
    cls = type(obj)
    shape = _SHAPES.get(cls)
    if shape is None:
        given = fields(cls)  # type: ignore[arg-type]
        assert all(f.init for f in given) and len(given) > 1, cls
        names = [f.name for f in given]
        shape = _SHAPES[cls] = (attrgetter(*names), {n: i for i, n in enumerate(names)})
    get, index = shape
    args = list(get(obj))
    for name, value in changes.items():
        at = index.get(name)
        if at is None:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        args[at] = value
    return cls(*args)
