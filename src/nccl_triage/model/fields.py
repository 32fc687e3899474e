"""The fields each event kind carries: what a rule's ``where:`` may test, and their types.

Input: nothing. Output: one ``TypedDict`` per event kind for its family-specific fields (the
event's ``detail``), the fields every event has, and :func:`fields_of`, which ``rules lint``
and the loader use to reject a ``where:`` field an event kind does not have.

Signals (context families from ``rules/signals/``) carry :data:`SIGNAL_FIELDS` and the named
groups of their patterns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import TypedDict, get_type_hints

from nccl_triage.model.events import FAILURE_KINDS, Kind

# Every event: where it is, who printed it, what it says.
COMMON_FIELDS: Mapping[str, str] = {
    "kind": "str",
    "line": "int",
    "text": "str",
    "rank": "int",
    "local_rank": "int",
    "host": "str",
    "pid": "int",
    "time": "str",
    "form": "str",
    "partial": "bool",
    "pytorch_era": "str",
    "repeats": "int",
}


class WatchdogTimeoutFields(TypedDict, total=False):
    """A collective that timed out (watchdog, blocking wait, status lines, every era)."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    seq: int
    op_type: str
    numel_in: int
    numel_out: int
    tensor_shape: str
    timeout_ms: int
    ran_for_ms: int
    last_enqueued: int
    last_started: int
    last_completed: int
    exception_type: str


class DesyncReportFields(TypedDict, total=False):
    """``TORCH_NCCL_DESYNC_DEBUG`` report lines."""

    seq: int
    op_type: str
    ranks: str


class FlightRecorderFields(TypedDict, total=False):
    """Flight-recorder lines: the failed collective's stack, dumps, the analyser's output."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    seq: int
    record_id: int
    wait_ms: int


class TeardownFields(TypedDict, total=False):
    """The tear-down lines: some NCCL operations have failed, to avoid data inconsistency."""

    pg_rank: int


class WatchdogExceptionFields(TypedDict, total=False):
    """The watchdog thread died of something other than a timeout (a CUDA error, NCCL)."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    cuda_error: str
    errstr: str
    inner_kind: str
    message: str  # the inner error's text
    nccl_version: str


class TerminateFields(TypedDict, total=False):
    """The C++ runtime: terminate called after throwing an instance of an exception."""

    exception_type: str


class HeartbeatTimeoutFields(TypedDict, total=False):
    """The heartbeat monitor: the watchdog got stuck, or no heartbeat."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    heartbeat_timeout_s: int


class DumpSignalFields(TypedDict, total=False):
    """A rank told to dump its debug info because another rank timed out."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    last_enqueued: int
    last_completed: int
    from_rank: int
    message: str


class ProcessTerminatedFields(TypedDict, total=False):
    """FATAL "Terminating the process after attempting to dump debug info"."""

    pg: str
    pg_guid: str
    pg_desc: str
    pg_rank: int
    reason: str


class NcclErrorFields(TypedDict, total=False):
    """An NCCL error surfaced by PyTorch or another framework, or an aborted communicator."""

    severity: str  # WARN and INFO lines: error | notice | info (error traces are errors)
    error_class: str  # the ncclResult_t: ncclSystemError, ncclRemoteError, ...
    reason: str  # what the line says went wrong
    cuda_error: str  # the text of a "Cuda failure"
    peer_address: str
    peer_port: int
    interface: str
    device: str
    source_file: str  # NCCL's source file and line that printed it
    source_line: int
    nccl_call: str  # the NCCL function named (ncclCommInitRank, a missing symbol)
    signal: str  # a fatal signal inside NCCL's own functions
    aborted_rank: int
    errstr: str
    exception_type: str
    last_error: str
    message: str
    nccl_code: str
    nccl_version: str
    source_location: str


class NcclLogFields(TypedDict, total=False):
    """A libnccl log line (``NCCL WARN`` / ``NCCL INFO``): init, versions, networks, errors."""

    severity: str  # WARN and INFO lines: error | notice | info (error traces are errors)
    error_class: str  # the ncclResult_t: ncclSystemError, ncclRemoteError, ...
    reason: str  # what the line says went wrong
    cuda_error: str  # the text of a "Cuda failure"
    peer_address: str
    peer_port: int
    interface: str
    device: str
    source_file: str  # NCCL's source file and line that printed it
    source_line: int
    bootstrap_interface: str
    cuda_dev: int
    env_name: str
    env_value: str
    interfaces: str
    level: str
    message: str
    nccl_code: str
    nccl_rank: int
    nccl_version: str
    net: str
    nranks: int
    source_location: str


class CudaErrorFields(TypedDict, total=False):
    """A CUDA error surfaced by the watchdog or a RuntimeError."""

    cuda_error: str
    exception_type: str


class CollectiveMismatchFields(TypedDict, total=False):
    """Ranks ran different collectives: PyTorch's fingerprint check, Horovod's checks."""

    message: str
    missing_ranks: str  # Horovod's stall inspector: ranks that never submitted
    exception_type: str
    fingerprint_a: str
    fingerprint_b: str
    op_type_a: str
    op_type_b: str
    rank_a: int
    rank_b: int


class WorkerFailedFields(TypedDict, total=False):
    """torchrun's agent: a worker failed (exit code or signal)."""

    entrypoint: str
    exit_code: int
    signal: str
    start_method: str


class AgentSignalFields(TypedDict, total=False):
    """torchrun's agent: closing signal sent, death signal received, its worker group's state."""

    signal: str
    state: str  # the worker group's state the agent reports (FAILED, SUCCEEDED, ...)


class ChildFailedFields(TypedDict, total=False):
    """A record of torchrun's ChildFailedError summary (root cause or other failure)."""

    error_file: str
    exit_code: int
    failure_time: str
    signal: str
    traceback: str


class StoreTimeoutFields(TypedDict, total=False):
    """TCPStore / FileStore / barrier / rendezvous timeouts."""

    timeout_ms: int
    timeout_s: int
    error: str
    exception_type: str
    expected: int
    joined: int
    message: str
    peer: str


class SocketErrorFields(TypedDict, total=False):
    """c10d socket connect / listen / recv failures."""

    pg: str
    pg_guid: str
    pg_rank: int
    error: str
    errno: int
    exception_type: str
    message: str
    peer: str


class RendezvousErrorFields(TypedDict, total=False):
    """torch.distributed.elastic rendezvous exceptions."""

    exception_type: str
    message: str


class GlooErrorFields(TypedDict, total=False):
    """Gloo transport timeouts and connection errors."""

    timeout_ms: int
    exception_type: str
    message: str
    operation: str
    peer: str


class EnvWarningFields(TypedDict, total=False):
    """Deprecated or ineffective environment variables."""

    env_name: str
    replacement: str


class ProgressFields(TypedDict, total=False):
    """A progress bar or a loop's counter in the lines around a failure (its latest state)."""

    desc: str  # what the bar says it does ("Map", "Validation DataLoader 0", "" for none)
    n: int
    total: int
    percent: int
    elapsed_s: int
    remaining_s: int
    rate: str
    finished: int  # 1 when it had reached its total
    bar_form: str  # tqdm | percent | mmengine | done | counter
    activity: str  # the signals its line matched (evaluation, data_preprocessing, ...)
    first_line: int  # where this bar was first drawn
    first_time: str
    last_line: int


class LastOutputFields(TypedDict, total=False):
    """The last line a rank printed that is its own output (no failure message, no frame)."""

    signals: str  # the signals that line matched


PROGRESS = "progress"
LAST_OUTPUT = "last_output"
# Events of the lines read in full around failures (beside the signals of rules/signals/).
CONTEXT_KINDS: Mapping[str, type] = {PROGRESS: ProgressFields, LAST_OUTPUT: LastOutputFields}

KIND_FIELDS: Mapping[str, type] = {
    Kind.WATCHDOG_TIMEOUT: WatchdogTimeoutFields,
    Kind.DESYNC_REPORT: DesyncReportFields,
    Kind.FLIGHT_RECORDER: FlightRecorderFields,
    Kind.TEARDOWN: TeardownFields,
    Kind.WATCHDOG_EXCEPTION: WatchdogExceptionFields,
    Kind.TERMINATE: TerminateFields,
    Kind.HEARTBEAT_TIMEOUT: HeartbeatTimeoutFields,
    Kind.DUMP_SIGNAL: DumpSignalFields,
    Kind.PROCESS_TERMINATED: ProcessTerminatedFields,
    Kind.NCCL_ERROR: NcclErrorFields,
    Kind.NCCL_WARN: NcclLogFields,
    Kind.NCCL_INFO: NcclLogFields,
    Kind.CUDA_ERROR: CudaErrorFields,
    Kind.COLLECTIVE_MISMATCH: CollectiveMismatchFields,
    Kind.WORKER_FAILED: WorkerFailedFields,
    Kind.AGENT_SIGNAL: AgentSignalFields,
    Kind.CHILD_FAILED: ChildFailedFields,
    Kind.STORE_TIMEOUT: StoreTimeoutFields,
    Kind.SOCKET_ERROR: SocketErrorFields,
    Kind.RENDEZVOUS_ERROR: RendezvousErrorFields,
    Kind.GLOO_ERROR: GlooErrorFields,
    Kind.ENV_WARNING: EnvWarningFields,
    **CONTEXT_KINDS,
}

# Every signal event: which pattern matched, and the run of lines it stands for.
SIGNAL_FIELDS: Mapping[str, str] = {
    "pattern": "str",
    "count": "int",
    "last_line": "int",
    "last_time": "str",
    "duration_s": "int",
}

ANY_FAILURE = "failure"  # ``match: {event: failure}``: any of FAILURE_KINDS


@cache  # a TypedDict's hints are read once per process (rules ask for them per condition)
def _typed(cls: type) -> dict[str, str]:
    return {name: getattr(t, "__name__", str(t)) for name, t in get_type_hints(cls).items()}


def fields_of(kind: str, signal_groups: Iterable[str] | None = None) -> dict[str, str]:
    """The fields an event of ``kind`` may carry, with their types.

    ``failure`` has the fields of every failure kind. A signal id (``signal_groups`` given:
    the named groups of its patterns) has the signal fields and those groups.
    """
    out = dict(COMMON_FIELDS)
    if signal_groups is not None:
        out.update(SIGNAL_FIELDS)
        out.update(dict.fromkeys(signal_groups, "str"))
        return out
    kinds = FAILURE_KINDS if kind == ANY_FAILURE else (kind,)
    for k in kinds:
        cls = KIND_FIELDS.get(k)
        if cls is not None:
            out.update(_typed(cls))
    return out
