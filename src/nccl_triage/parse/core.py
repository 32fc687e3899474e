"""Candidate lines to events: Lark grammar, wrapped-line joining, salvage and deduplication.

Input: :class:`~nccl_triage.ingest.scan.Candidate` lines of one input. Output: :class:`Event`
objects, one per distinct occurrence (the same timeout seen in a watchdog line, a status line
and a ``what():`` line is one event whose other lines are kept as ``occurrences``), and the
candidate lines the grammar could not read (``unparsed``).

Only this module imports lark. The parser is built once (LALR, contextual lexer).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import LarkError, VisitError

from nccl_triage.ingest.anchors import ANCHORS
from nccl_triage.ingest.reader import segments
from nccl_triage.ingest.scan import Candidate
from nccl_triage.model import Event, Kind, Line, Occurrence, Unparsed
from nccl_triage.parse.anatomy import peel

Fields = dict[str, Any]

MAX_OCCURRENCES = 50  # extra evidence lines kept per event (the count goes on in ``repeats``)
MAX_UNPARSED = 10_000


@cache
def parser() -> Lark:
    """Return the grammar's LALR parser (built once per process)."""
    text = resources.files("nccl_triage.parse.grammar").joinpath("nccl.lark").read_text("utf-8")
    return Lark(text, parser="lalr", lexer="contextual", maybe_placeholders=False)


# ----------------------------------------------------------------------------- transformer

_PG_ID = re.compile(
    r"\[\s*PG\s+ID\s+(?P<pg>\S+)\s+PG\s+GUID\s*(?P<guid>[^\s(\]]*)\s*(?:\((?P<desc>[^)]*)\))?"
    r"\s*Rank\s*(?P<rank>\d+)\s*\]"
)
_PG_NAME = re.compile(
    r"\[\s*PG\s+(?P<pg>[^\s(\]]+)\s*(?:\((?P<desc>[^)]*)\))?\s*Rank\s*(?P<rank>\d+)\s*\]"
)
_WORK_RANK = re.compile(r"\[\s*Rank\s*(?P<rank>\d+)\s*\]")
_COUNTERS = re.compile(
    r"[Ll]ast\s*enqueued\s*(?:NCCL\s*)?work:\s*(-?\d+),\s*last\s*completed\s*(?:NCCL\s*)?work:\s*(-?\d+)"
)
_SIGNAL = re.compile(r"Signal\s+(\d+)\s+\((SIG\w+)\)")
_ERROR_TRACE = re.compile(r"(?:([\w./+-]+:\d+)\s*)?->\s*(\d+)\b")
_NCCL_RESULTS = {  # ncclResult_t, the number at the end of an error trace
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
_WORK_KEYS = {
    "SeqNum": "seq",
    "OpType": "op_type",
    "NumelIn": "numel_in",
    "NumelOut": "numel_out",
    "TensorShape": "tensor_shape",
}
_INFO_PATTERNS = (  # what an NCCL INFO line can tell (nranks, version, interfaces, settings)
    (
        re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) cudaDev (\d+)"),
        ("nccl_rank", "nranks", "cuda_dev"),
    ),
    (re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)"), ("nccl_version",)),
    (re.compile(r"NET/(Socket|IB) : Using (.+)"), ("net", "interfaces")),
    (re.compile(r"Bootstrap : Using (.+)"), ("bootstrap_interface",)),
    (re.compile(r"(NCCL_\w+) set by environment to (\S+?)\.?$"), ("env_name", "env_value")),
)


class _NotAMessage(Exception):
    """Raised by the transformer when a parse tree turns out not to be a log message."""


class _ToFields(Transformer[Token, Fields]):
    """Turns a parse tree into a flat dict of event fields (``kind`` included)."""

    # --- structure
    def start(self, items: list[Fields]) -> Fields:
        return items[0]

    def message(self, items: list[Fields]) -> Fields:
        body = dict(items[-1])
        eras = list(body.pop("_eras", []))
        for pre in items[:-1]:
            eras.extend(pre.pop("_eras", []))
            for key, value in pre.items():
                if key == "exception_type" and "exception_type" in body:
                    continue
                if body.get(key) is None:
                    body[key] = value
        body["_eras"] = eras
        return body

    def pg_prefix(self, items: list[Token]) -> Fields:
        text = str(items[0])
        m = _PG_ID.match(text)
        if m:
            return {
                "pg": m["pg"],
                "pg_guid": m["guid"] or None,
                "pg_desc": m["desc"],
                "pg_rank": int(m["rank"]),
                "_eras": [("2.5", "")],
            }
        m = _PG_NAME.match(text)
        if m:
            era = ("2.4", "2.4") if m["desc"] else ("2.3", "2.4")
            return {"pg": m["pg"], "pg_desc": m["desc"], "pg_rank": int(m["rank"]), "_eras": [era]}
        m = _WORK_RANK.match(text)
        return {"pg_rank": int(m["rank"])} if m else {}

    def exc_class(self, items: list[Token]) -> Fields:
        name = str(items[0]).rstrip(": ")
        eras = []
        if name.endswith("DistBackendError"):
            eras.append(("2.1", ""))
        return {"exception_type": name, "_eras": eras}

    def what(self, items: list[Token]) -> Fields:
        return {"form": "what"}

    def tag(self, items: list[Token]) -> Fields:
        return {}

    def tail(self, items: list[Token]) -> str:
        return str(items[0]).strip()

    def inner_text(self, items: list[Token]) -> Fields:
        return {"kind": "text", "message": str(items[0]).strip()}

    # --- F1
    def work(self, items: list[Fields]) -> Fields:
        out: Fields = {}
        for item in items:
            out.update(item)
        eras: list[tuple[str, str]] = []
        if "seq" not in out:
            eras.append(("", "1.8"))
        if "tensor_shape" in out:
            eras.append(("", "1.10"))
        if "numel_in" in out:
            eras.append(("2.1", ""))
        elif "seq" in out:
            eras.append(("1.9", "2.0"))
        out["_eras"] = eras
        return out

    def work_field(self, items: list[Any]) -> Fields:
        key = _WORK_KEYS.get(str(items[0]))
        if key is None:
            return {}
        value = items[1]
        if key == "tensor_shape":
            return {key: value}
        if key == "op_type":
            return {key: str(value)}
        return {key: int(value)}

    def timeout_field(self, items: list[Token]) -> Fields:
        return {"timeout_ms": int(items[0])}

    def shape(self, items: list[Token]) -> str:
        return "[" + ", ".join(str(i) for i in items) + "]"

    def ran_for(self, items: list[Token]) -> Fields:
        return {"ran_for_ms": int(items[0])}

    def _timeout(self, items: list[Any], form: str) -> Fields:
        out: Fields = {"kind": Kind.WATCHDOG_TIMEOUT, "form": form}
        eras: list[tuple[str, str]] = []
        tail: str | None = None
        for item in items:
            if isinstance(item, dict):
                eras.extend(item.pop("_eras", []))
                out.update(item)
            elif isinstance(item, str):
                tail = item
        if tail and not any(isinstance(item, dict) for item in items):
            # "timeout: {work}" in a print() or prose. A line cut at the colon has no tail; one
            # cut inside the descriptor ("timeout: WorkN") is incomplete, and may be joined.
            if not (tail.startswith("WorkNCCL") or "WorkNCCL(".startswith(tail)):
                raise _NotAMessage(tail)
            out["_incomplete"] = True
        if "ran_for_ms" not in out and form in ("watchdog", "caught"):
            out["_incomplete"] = True
        if "timeout_ms" not in out:
            out["_incomplete"] = True
        if tail:
            out["tail"] = tail
        out["_eras"] = eras
        return out

    def watchdog(self, items: list[Any]) -> Fields:
        return self._timeout(items, "watchdog")

    def caught(self, items: list[Any]) -> Fields:
        out = self._timeout(items, "caught")
        out["_eras"].append(("", "2.0"))
        return out

    def blocking_wait(self, items: list[Any]) -> Fields:
        out = self._timeout(items, "blocking_wait")
        env = out.pop("blocking_env", None)
        if env is None:
            out["_eras"].append(("2.5", ""))
        elif env.startswith("TORCH_"):
            out["_eras"].append(("2.2", "2.5"))
        else:
            out["_eras"].append(("2.1", "2.1"))
        return out

    def blocking_env(self, items: list[Token]) -> Fields:
        return {"blocking_env": str(items[0])}

    # --- F2
    def last_enqueued(self, items: list[Token]) -> Fields:
        return {"last_enqueued": int(items[0])}

    def last_completed(self, items: list[Token]) -> Fields:
        return {"last_completed": int(items[0])}

    def last_started(self, items: list[Token]) -> Fields:
        out: Fields = {"last_started": int(items[0])}
        if len(items) > 1:
            out["last_started_op"] = str(items[1])
        return out

    def _status(self, items: list[Any], form: str, era: tuple[str, str]) -> Fields:
        out: Fields = {"kind": Kind.WATCHDOG_STATUS, "form": form, "seq": int(items[0])}
        for item in items[1:]:
            if isinstance(item, dict):
                out.update(item)
        out["_eras"] = [era]
        return out

    def status_timeout_at(self, items: list[Any]) -> Fields:
        return self._status(items, "timeout_at", ("2.3", "2.6"))

    def status_exception(self, items: list[Any]) -> Fields:
        return self._status(items, "exception_detected", ("2.4", "2.5"))

    def status_failure(self, items: list[Any]) -> Fields:
        return self._status(items, "failure_detected", ("2.6", ""))

    def desync_header(self, items: list[Fields]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, **items[0]}

    def lagging(self, items: list[Any]) -> Fields:
        return {"form": "lagging_ranks", "ranks": _ranks(items[0])}

    def culprits(self, items: list[Any]) -> Fields:
        return {"form": "culprits"}

    def desync_unfinished(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": "joined_not_finished",
            "ranks": _ranks(items[0]),
            "seq": int(items[1]),
        }

    def desync_unjoined(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": "finished_not_joined",
            "ranks": _ranks(items[0]),
            "seq": int(items[1]) + 1,
        }

    def desync_snapshot(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, "form": "snapshot"}

    def desync_state(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, "form": f"{items[1]}_ranks", "seq": int(items[0])}

    def desync_state_ranks(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": str(items[1]),
            "ranks": _ranks(items[0]),
            "op_type": str(items[2]),
        }

    def desync_timeout_at(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": "timeout_at",
            "op_type": str(items[0]),
            "seq": int(items[1]),
        }

    def desync_failed(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, "form": "report_failed"}

    # --- F3
    def thread_death(self, items: list[Any]) -> Fields:
        inner = dict(items[-1])
        era = items[0]
        if inner.get("kind") == Kind.WATCHDOG_TIMEOUT:
            inner.setdefault("form", "thread_death")
            if inner.get("form") == "watchdog":
                inner["form"] = "thread_death"
            inner.setdefault("_eras", []).append(era)
            return inner
        out: Fields = {"kind": Kind.WATCHDOG_EXCEPTION, "_eras": [era]}
        if inner.get("kind") == "text":
            out["message"] = inner["message"]
            if _looks_cut(inner["message"]):
                out["_incomplete"] = True  # a wrapped line: let the caller try joining the next
        else:
            out["inner_kind"] = str(inner.get("kind"))
            for key in ("message", "errstr", "nccl_version", "cuda_error"):
                if key in inner:
                    out[key] = inner[key]
        return out

    def owner_nccl(self, items: list[Any]) -> tuple[str, str]:
        return ("", "2.2")

    def owner_pg(self, items: list[Any]) -> tuple[str, str]:
        return ("2.3", "")

    def aborted(self, items: list[Any]) -> Fields:
        rank = next((int(i) for i in items if isinstance(i, Token) and i.type == "INT"), None)
        inner = next((i for i in items if isinstance(i, dict)), None)
        if inner is not None and inner.get("kind") == Kind.WATCHDOG_TIMEOUT:
            out = dict(inner)
            out["form"] = "aborted"
            if rank is not None and out.get("pg_rank") is None:
                out["pg_rank"] = rank
            return out
        out = {"kind": Kind.NCCL_ERROR, "form": "communicator_aborted", "aborted_rank": rank}
        if inner is not None:
            out["message"] = inner.get("message") or str(inner.get("kind"))
            if inner.get("kind") == "text" and _looks_cut(inner["message"]):
                out["_incomplete"] = True
        return out

    def teardown_failed(self, items: list[Any]) -> Fields:
        return {"kind": Kind.TEARDOWN, "form": "operations_failed"}

    def teardown_down(self, items: list[Any]) -> Fields:
        return {"kind": Kind.TEARDOWN, "form": "taking_process_down"}

    def terminate(self, items: list[Token]) -> Fields:
        exc = str(items[0]).strip("'\"")
        eras = [("", "2.0")] if exc == "std::runtime_error" else []
        if exc == "c10::DistBackendError":
            eras = [("2.1", "")]
        return {"kind": Kind.TERMINATE, "exception_type": exc, "_eras": eras}

    # --- F4
    def watchdog_stuck(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.HEARTBEAT_TIMEOUT,
            "form": "watchdog_stuck",
            "heartbeat_timeout_s": int(items[0]),
        }

    def heartbeat_monitor(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.HEARTBEAT_TIMEOUT,
            "form": "heartbeat_monitor",
            "_eras": [("2.3", "2.4")],
        }

    def no_heartbeat(self, items: list[Any]) -> Fields:
        return {"kind": Kind.HEARTBEAT_TIMEOUT, "form": "no_heartbeat", "_eras": [("2.3", "2.4")]}

    def monitor_timeout(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.HEARTBEAT_TIMEOUT,
            "form": "monitor_timeout",
            "_eras": [("2.2", "2.2")],
        }

    def dump_signal(self, items: list[Any]) -> Fields:
        origin = next(i for i in items if isinstance(i, dict))
        tail = next((i for i in items if isinstance(i, str)), "")
        out: Fields = {"_eras": [("2.5", "")]}
        m = _COUNTERS.search(tail)
        if m:
            out["last_enqueued"], out["last_completed"] = int(m[1]), int(m[2])
        if origin.get("local"):
            # The local rank's own timeout: the work that timed out is the first not completed.
            out.update(kind=Kind.WATCHDOG_TIMEOUT, form="dump_signal", _incomplete=True)
            if "last_completed" in out:
                out["seq"] = out["last_completed"] + 1
        else:
            out.update(kind=Kind.DUMP_SIGNAL, form="remote", from_rank=origin["from_rank"])
        return out

    def origin_local(self, items: list[Any]) -> Fields:
        return {"local": True}

    def origin_remote(self, items: list[Token]) -> Fields:
        return {"from_rank": int(items[0])}

    def dump_global_timeout(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DUMP_SIGNAL, "form": "global_timeout", "_eras": [("2.3", "2.3")]}

    def dump_global_signal(self, items: list[Any]) -> Fields:
        out: Fields = {
            "kind": Kind.DUMP_SIGNAL,
            "form": "global_signal",
            "from_rank": int(items[0]),
        }
        tail = next((i for i in items if isinstance(i, str)), "")
        m = _COUNTERS.search(tail)
        if m:
            out["last_enqueued"], out["last_completed"] = int(m[1]), int(m[2])
        return out

    def dump_first_pg(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DUMP_SIGNAL,
            "form": "first_pg",
            "message": items[0] if items else None,
        }

    def dump_observed(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DUMP_SIGNAL, "form": "observed"}

    def dump_broadcast(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DUMP_SIGNAL, "form": "broadcast"}

    def dump_flag_failed(self, items: list[Any]) -> Fields:
        tail = items[-1] if isinstance(items[-1], str) else ""
        m = re.search(r"with error:\s*(.+)", tail)
        return {
            "kind": Kind.SOCKET_ERROR,
            "form": "should_dump_check_failed",
            "error": m[1].strip() if m else None,
        }

    def terminating(self, items: list[Any]) -> Fields:
        reason = items[-1] if items and isinstance(items[-1], str) else ""
        return {"kind": Kind.PROCESS_TERMINATED, "reason": reason.rstrip(".")}

    def monitor_disabled(self, items: list[Any]) -> Fields:
        return {"kind": Kind.HEARTBEAT_TIMEOUT, "form": "monitor_disabled"}

    def gil_hang(self, items: list[Any]) -> Fields:
        return {"kind": Kind.HEARTBEAT_TIMEOUT, "form": "gil_hang"}

    def fr_preparing(self, items: list[Any]) -> Fields:
        return {"kind": Kind.FLIGHT_RECORDER, "form": "preparing_dump"}

    def fr_stack(self, items: list[Any]) -> Fields:
        return {"kind": Kind.FLIGHT_RECORDER, "form": "stack_trace", "_eras": [("2.7", "")]}

    def fr_missing(self, items: list[Any]) -> Fields:
        return {"kind": Kind.FLIGHT_RECORDER, "form": "stack_trace_missing", "_eras": [("2.7", "")]}

    def fr_dump_wait(self, items: list[Any]) -> Fields:
        return {"kind": Kind.FLIGHT_RECORDER, "form": "dump_wait_timeout", "wait_ms": int(items[0])}

    def fr_not_joining(self, items: list[Any]) -> Fields:
        tail = items[0] if items else ""
        m = re.match(r",?\s*(?:sequence\s*number\s*:\s*)?(\d+)(?:\s*at\s*entry\s*(\d+))?", tail)
        out: Fields = {
            "kind": Kind.FLIGHT_RECORDER,
            "form": "not_all_joining",
            "seq": int(m[1]) if m else None,
        }
        if m and m[2]:
            out["record_id"] = int(m[2])
        return out

    # --- F5
    def _nccl_error(self, items: list[Any], form: str) -> Fields:
        out: Fields = {"kind": Kind.NCCL_ERROR, "form": form}
        for item in items:
            if isinstance(item, Token):
                if item.type == "SRC_LOC":
                    out["source_location"] = str(item)
                elif item.type == "ERR_STR":
                    out["errstr"] = str(item).strip()
                elif item.type == "VERSION":
                    out["nccl_version"] = str(item)
        return out

    def nccl_error_in(self, items: list[Any]) -> Fields:
        return self._nccl_error(items, "error_in")

    def nccl_timeout_in(self, items: list[Any]) -> Fields:
        return self._nccl_error(items, "timeout_in")

    def nccl_error_async(self, items: list[Any]) -> Fields:
        return self._nccl_error(items, "async_error")

    def nccl_detail(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.NCCL_ERROR,
            "form": "detail",
            "nccl_code": str(items[0]),
            "message": items[1] if len(items) > 1 else None,
        }

    def nccl_unknown(self, items: list[Any]) -> Fields:
        return {"kind": Kind.NCCL_ERROR, "form": "detail", "nccl_code": "unknown"}

    def nccl_last_error(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.NCCL_ERROR,
            "form": "last_error",
            "last_error": items[0] if items else None,
        }

    def nccl_lib(self, items: list[Any]) -> Fields:
        origin = str(items[0])
        m = re.match(r"([\w.-]+):(\d+):(\d+)\s*\[(\d+)\]", origin)
        level = next(str(i) for i in items if isinstance(i, Token) and i.type == "NCCL_LEVEL")
        src = next((str(i) for i in items if isinstance(i, Token) and i.type == "SRC_LOC"), None)
        message = items[-1] if isinstance(items[-1], str) else ""
        out: Fields = {
            "kind": Kind.NCCL_WARN if level == "WARN" else Kind.NCCL_INFO,
            "host": m[1] if m else None,
            "pid": int(m[2]) if m else None,
            "cuda_dev": int(m[4]) if m else None,
            "level": level,
            "source_location": src,
            "message": message,
        }
        if level != "WARN":
            for rx, names in _INFO_PATTERNS:
                hit = rx.search(message)
                if hit:
                    for name, value in zip(names, hit.groups(), strict=True):
                        out[name] = int(value) if value.isdigit() else value
                    break
            else:
                # "NCCL INFO init.cc:82 -> 3": an error return traced back up NCCL's call stack
                m = _ERROR_TRACE.match(message)
                if m:
                    out["form"] = "error_trace"
                    out["source_location"] = src or m[1]
                    out["nccl_code"] = _NCCL_RESULTS.get(int(m[2]), f"ncclResult {m[2]}")
        return out

    def nccl_version(self, items: list[Token]) -> Fields:
        return {"kind": Kind.NCCL_INFO, "level": "INFO", "nccl_version": str(items[0])}

    def cuda_error(self, items: list[Any]) -> Fields:
        return {"kind": Kind.CUDA_ERROR, "cuda_error": items[0] if items else None}

    def cuda_failure(self, items: list[Any]) -> Fields:
        text = items[0] if items else ""
        return {"kind": Kind.CUDA_ERROR, "cuda_error": text.strip(" '")}

    def mismatch(self, items: list[Any]) -> Fields:
        tail = items[0] if items else ""
        out: Fields = {"kind": Kind.COLLECTIVE_MISMATCH}
        for i, m in enumerate(_FINGERPRINT.finditer(tail)):
            if i == 2:
                break
            fingerprint = _balanced(tail, m.end())
            out[f"rank_{'ab'[i]}"] = int(m[1])
            out[f"fingerprint_{'ab'[i]}"] = fingerprint
            op = re.search(r"OpType\s*=\s*(_?[A-Z][A-Z_]*)", fingerprint)
            if op:
                out[f"op_type_{'ab'[i]}"] = op[1]
        return out

    # --- F6
    def worker_failed(self, items: list[Any]) -> Fields:
        ints = [i for i in items if isinstance(i, Token)]
        code = int(ints[0])
        out: Fields = {
            "kind": Kind.WORKER_FAILED,
            "exit_code": code,
            "local_rank": int(ints[1]),
            "pid": int(ints[2]),
            "entrypoint": items[-1],
        }
        m = _START_METHOD.fullmatch(items[-1])
        if m:  # function mode: "of fn: <qualname> (start_method: <spawn|fork>)"
            out["entrypoint"], out["start_method"] = m[1], m[2]
        if code < 0:
            out["signal"] = _signame(-code)
        return out

    def closing_signal(self, items: list[Token]) -> Fields:
        return {
            "kind": Kind.AGENT_SIGNAL,
            "form": "closing",
            "pid": int(items[0]),
            "signal": str(items[1]),
        }

    def death_signal(self, items: list[Any]) -> Fields:
        num = int(items[0])
        return {"kind": Kind.AGENT_SIGNAL, "form": "death", "signal": _signame(num)}

    def signal_exception(self, items: list[Token]) -> Fields:
        return {
            "kind": Kind.AGENT_SIGNAL,
            "form": "death",
            "pid": int(items[1]),
            "signal": _signame(int(items[2])),
        }

    def worker_group(self, items: list[Any]) -> Fields:
        state = next(str(i) for i in items if isinstance(i, Token) and i.type == "GROUP_STATE")
        return {"kind": Kind.AGENT_SIGNAL, "form": "worker_group", "state": state}

    def no_error_file(self, items: list[Any]) -> Fields:
        return {"kind": Kind.WORKER_FAILED, "form": "no_error_file", "local_rank": int(items[0])}

    def child_failed_header(self, items: list[Any]) -> Fields:
        if len(items) > 1 and not str(items[0]).rstrip().endswith(":"):
            # "import ChildFailedError, record", "raise ChildFailedError(": code, not the
            # traceback's last line ("...errors.ChildFailedError: ")
            raise _NotAMessage(str(items[1]))
        return {"kind": Kind.CHILD_FAILED, "form": "header"}

    def root_cause(self, items: list[Any]) -> Fields:
        return {"kind": Kind.CHILD_FAILED, "form": "root_cause"}

    def failures(self, items: list[Any]) -> Fields:
        return {"kind": Kind.CHILD_FAILED, "form": "failures"}

    def field_rank(self, items: list[Token]) -> Fields:
        return {"kind": "child_field", "rank": int(items[0]), "local_rank": int(items[1])}

    def field_exitcode(self, items: list[Token]) -> Fields:
        code = int(items[0])
        out: Fields = {"kind": "child_field", "exit_code": code, "pid": int(items[1])}
        if code < 0:
            out["signal"] = _signame(-code)
        return out

    def field_host(self, items: list[str]) -> Fields:
        return {"kind": "child_field", "host": items[0]}

    def field_time(self, items: list[str]) -> Fields:
        return {"kind": "child_field", "failure_time": items[0]}

    def field_traceback(self, items: list[str]) -> Fields:
        text = items[0].strip('"')
        out: Fields = {"kind": "child_field", "traceback": text}
        m = _SIGNAL.search(text)
        if m:
            out["signal"] = m[2]
        return out

    def field_error_file(self, items: list[str]) -> Fields:
        return {"kind": "child_field", "error_file": items[0]}

    # --- F7
    def store_clients(self, items: list[Token]) -> Fields:
        return {
            "kind": Kind.STORE_TIMEOUT,
            "form": "waiting_for_clients",
            "timeout_s": int(items[0]),
            "joined": int(items[1]),
            "expected": int(items[2]),
        }

    def store_barrier(self, items: list[Any]) -> Fields:
        out: Fields = {
            "kind": Kind.STORE_TIMEOUT,
            "form": "store_based_barrier",
            "message": items[-1],
        }
        m = re.match(r"on\s*rank\s*:\s*(\d+)", items[-1])
        if m:
            out["rank"] = int(m[1])
        return out

    def client_timeout(self, items: list[Any]) -> Fields:
        tail = items[-1]
        out: Fields = {"kind": Kind.STORE_TIMEOUT, "form": "client_connect", "message": tail}
        m = re.search(r"\(([^,()=]+),\s*(\d+)\)|^\s*(\S+?):(\d+)\b", tail)
        if m:
            out["peer"] = f"{m[1] or m[3]}:{m[2] or m[4]}"
        ints = [str(i) for i in items if isinstance(i, Token) and i.type in ("INT", "TIME_UNIT")]
        amount = (ints[0], ints[1]) if len(ints) == 2 else None
        t = re.search(r"(?:after\s*|timeout=)(\d+)\s*(ms|s)\b", tail)
        if amount is None and t:
            amount = (t[1], t[2])
        if amount:
            out["timeout_ms"] = int(amount[0]) * (1 if amount[1] == "ms" else 1000)
        return out

    def unique_id(self, items: list[Any]) -> Fields:
        tail = items[-1]
        m = re.search(r"got error:?\s*(.*)", tail)
        return {
            "kind": Kind.STORE_TIMEOUT,
            "form": "unique_id_exchange",
            "rank": _ranks(items[0])[0] if _ranks(items[0]) else None,
            "error": (m[1].strip() or None) if m else None,
        }

    def store_wait(self, items: list[Any]) -> Fields:
        out: Fields = {"kind": Kind.STORE_TIMEOUT, "form": "store_wait", "message": items[-1]}
        if isinstance(items[0], Token) and items[0].type == "INT":  # "wait timeout after Nms"
            out["timeout_ms"] = int(items[0])
        return out

    def socket_timeout(self, items: list[Any]) -> Fields:
        return {"kind": Kind.STORE_TIMEOUT, "form": "socket_timeout"}

    def connect_failed(self, items: list[Any]) -> Fields:
        out: Fields = {"kind": Kind.SOCKET_ERROR, "form": "connect_failed", "message": items[-1]}
        # "[::ffff:10.0.0.5]:40323 (errno: ...)" or "any network address of (host, port)."
        m = re.match(r"(\[[^\]]*\]:\d+)|.*?\(([^,()]+),\s*(\d+)\)", items[-1])
        if m:
            out["peer"] = m[1] or f"{m[2]}:{m[3]}"
        return out

    def listen_failed(self, items: list[Any]) -> Fields:
        return {"kind": Kind.SOCKET_ERROR, "form": "listen_failed", "message": items[-1]}

    def recv_failed(self, items: list[Any]) -> Fields:
        tail = items[-1] if items and isinstance(items[-1], str) else ""
        m = re.search(r"\)\s*:\s*(.+)$", tail)
        return {
            "kind": Kind.SOCKET_ERROR,
            "form": "recv_failed",
            "error": m[1].strip() if m else None,
        }

    def rendezvous(self, items: list[Any]) -> Fields:
        name = str(items[0]).rstrip(": ").rsplit(".", 1)[-1]
        return {
            "kind": Kind.RENDEZVOUS_ERROR,
            "exception_type": name,
            "message": items[1] if len(items) > 1 else None,
        }

    # --- F8
    def gloo_timeout(self, items: list[Token]) -> Fields:
        return {
            "kind": Kind.GLOO_ERROR,
            "form": "timeout",
            "timeout_ms": int(items[1]),
            "operation": str(items[2]),
        }

    def gloo_closed(self, items: list[Any]) -> Fields:
        return {"kind": Kind.GLOO_ERROR, "form": "connection_closed", "peer": str(items[-1])}

    def gloo_read_error(self, items: list[Any]) -> Fields:
        return {"kind": Kind.GLOO_ERROR, "form": "read_error", "message": items[-1]}

    def gloo_app_timeout(self, items: list[Any]) -> Fields:
        return {"kind": Kind.GLOO_ERROR, "form": "application_timeout"}

    def gloo_no_address(self, items: list[Any]) -> Fields:
        return {"kind": Kind.GLOO_ERROR, "form": "no_address", "interface": items[-1]}

    # --- environment
    def env_deprecated(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.ENV_WARNING,
            "form": "deprecated",
            "env_name": str(items[0]),
            "replacement": str(items[1]),
        }

    def env_no_effect(self, items: list[Any]) -> Fields:
        return {"kind": Kind.ENV_WARNING, "form": "no_effect", "env_name": str(items[0])}


def _looks_cut(text: str) -> bool:
    """Tell whether a free-text tail looks cut by a line wrap (short, or an open bracket)."""
    return len(text) < 16 or text.count("[") > text.count("]") or text.count("(") > text.count(")")


_START_METHOD = re.compile(r"(.+?)\s*\(\s*start_method\s*:\s*(\w+)\s*\)")
_FINGERPRINT = re.compile(r"Rank\s*(\d+)\s*is\s*running\s*collective:\s*CollectiveFingerPrint\(")


def _balanced(text: str, start: int) -> str:
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


def _ranks(token: Any) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", str(token))]


_SIGNALS = {
    1: "SIGHUP",
    2: "SIGINT",
    6: "SIGABRT",
    7: "SIGBUS",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}


def _signame(num: int) -> str:
    return _SIGNALS.get(num, f"SIG{num}")


@cache
def _transformer() -> _ToFields:
    return _ToFields()


# ----------------------------------------------------------------------------- one message

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
)
# Prelude tokens that may stand right before a head: exception classes, what():, PG prefixes.
_PRELUDE_TAIL = re.compile(
    r"(?:(?:[A-Za-z_][\w.:]*(?:Error|Exception)\s*:|what\(\)\s*:|\[\s*(?:Rank\s*\d+|PG\s[^\[\]]*?Rank\s*\d+)\s*\]"
    r"|\[c10d\]|Warning\s*:)\s*)+$"
)
# Preludes are short: looking further back than this before a head would make the search
# quadratic on a long glued line.
_PRELUDE_REACH = 512
_REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
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
    """
    text = normalize(message)
    if not text:
        return None
    result = _parse(text)
    if result is not None:
        return result
    limit = len(normalize(message[:head_before])) if head_before is not None else len(text)
    for m in _HEADS.finditer(text):
        start = m.start()
        if start >= limit:
            break
        if start == 0:
            continue
        pre = _PRELUDE_TAIL.search(text, max(0, start - _PRELUDE_REACH), start)
        begin = pre.start() if pre else start
        result = _parse(text[begin:])
        if result is not None:
            return result
    return None


def _parse(text: str) -> Fields | None:
    try:
        tree = parser().parse(text)
    except LarkError:
        return None
    try:
        return _transformer().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, _NotAMessage):
            return None
        raise


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
    pre = _PRELUDE_TAIL.search(text, max(0, head.start() - _PRELUDE_REACH), head.start())
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
        fields = _transformer().pg_prefix([Token("PG_PREFIX", m.group(0))])
        fields.pop("_eras", None)
        for key, value in fields.items():
            out.setdefault(key, value)
    return out


# ----------------------------------------------------------------------------- eras

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


def era_of(line: Line, constraints: Iterable[tuple[str, str]]) -> str | None:
    """Narrow the PyTorch release range from a line's format features."""
    lo, hi = 0, len(_VERSIONS) - 1
    narrowed = False
    header = next((p.text for p in line.prefixes if p.kind == "header"), "")
    cons = list(constraints)
    if header.startswith("[") and re.match(r"\[[FEWIV] ", header):
        cons.append(("", "2.3"))
    elif header.startswith("[") and re.match(r"\[[FEWIV]\d", header):
        cons.append(("2.4", ""))
    if any(
        p.kind == "rank" or (p.kind == "tee" and p.text.startswith("[rank")) for p in line.prefixes
    ):
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


# ----------------------------------------------------------------------------- candidates


_STRONG_START = re.compile(
    r"\s*(?:\[rank\d+\]|\[[A-Za-z_][\w.-]*\d+\]:|\[[FEWIV]\d{0,4}[ \d:.]*[\w.+-]+:\d+\]"
    r"|[VIWEFC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ |\[?\d{4}-\d\d-\d\d|frame #|Exception raised from|terminate called"
    r"|Traceback|File \"|[\w.-]+:\d+:\d+ \[\d+\]|\(\w+ pid=|[\w.]+(?:Error|Exception):|\[\d+\] |=====|-----)"
)
_ANCHOR_RE = re.compile("|".join(re.escape(a) for a in sorted(ANCHORS, key=len, reverse=True)))
MAX_JOIN = 4


class LineParser:
    """The grammar over one input's candidate lines: joins wrapped messages, reads blocks.

    Events go to :attr:`dedupe`; lines that hold an anchor but no message to :attr:`unparsed`.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.consumed_until = 0
        self.dedupe = Deduper()
        self.unparsed: list[Unparsed] = []
        self.candidates = 0

    def feed(self, cand: Candidate) -> None:
        """Parse one candidate line (joined with its neighbours when a message was wrapped)."""
        if cand.lineno <= self.consumed_until:
            return
        self.candidates += 1
        segs = segments(cand.raw)
        for i, seg in enumerate(segs):
            if not _ANCHOR_RE.search(seg):
                continue
            last = i == len(segs) - 1
            self._feed_segment(cand, seg, first=i == 0, last=last)

    def _feed_segment(self, cand: Candidate, text: str, first: bool, last: bool) -> None:
        line = peel(Line(self.source, cand.lineno, text))
        after = [_decode(raw) for raw in cand.after] if last else []
        fields, used = self._parse_with_joins(line, after)
        start_line = line
        if first and _continues_previous(cand, text, line, fields is not None):
            prev = peel(Line(self.source, cand.lineno - 1, _decode(cand.before[-1]) + text))
            joined, used_b = self._parse_with_joins(prev, after)
            whole = fields is None or (
                _has_own_prefix(prev)
                and not any(p.kind == "lead" for p in prev.prefixes)
                and _parse(normalize(prev.message + "".join(after[:used_b]))) is not None
            )
            if joined is not None and not joined.get("_incomplete") and whole:
                fields, used, start_line = joined, used_b, prev
        if fields is None:
            fields = salvage(line.message, prefixed=_has_own_prefix(line))
            used = 0
            if fields is None:
                if len(self.unparsed) < MAX_UNPARSED:
                    self.unparsed.append(Unparsed(cand.lineno, text))
                return
        if used:
            self.consumed_until = max(self.consumed_until, cand.lineno + used)
        kind = fields.get("kind")
        if kind == Kind.CHILD_FAILED and fields.get("form") in ("root_cause", "failures"):
            self._child_block(start_line, fields, [_decode(r) for r in cand.after], cand.lineno)
            return
        if (
            kind == Kind.NCCL_ERROR
            and fields.get("form") == "last_error"
            and not fields.get("last_error")
        ):
            value = (
                peel(Line(self.source, cand.lineno + 1, _decode(cand.after[0]))).message
                if cand.after
                else ""
            )
            if value.strip():
                fields["last_error"] = normalize(value)
                self.consumed_until = max(self.consumed_until, cand.lineno + 1)
        if kind == "child_field":
            return  # a ChildFailedError record line outside a block: nothing to pin it on
        self.dedupe.add(make_event(start_line, fields, self._joined_text(start_line, after, used)))

    def _joined_text(self, line: Line, after: list[str], used: int) -> str:
        if not used:
            return line.text.strip()
        return normalize(line.text + "".join(after[:used]))

    def _parse_with_joins(self, line: Line, after: list[str]) -> tuple[Fields | None, int]:
        fields = parse_message(line.message)
        if fields is not None and not fields.get("_incomplete"):
            return fields, 0
        message = line.message
        own = len(message)
        for k in range(min(MAX_JOIN, len(after))):
            nxt = after[k]
            if not nxt.strip() or _STRONG_START.match(nxt):
                break
            message += nxt
            joined = parse_message(message, head_before=own)
            if joined is not None and not joined.get("_incomplete"):
                return joined, k + 1
        return fields, 0

    def _child_block(self, line: Line, head: Fields, after: list[str], lineno: int) -> None:
        """Read the records of a ChildFailedError block (``Root Cause`` or ``Failures:``)."""
        role = "root_cause" if head.get("form") == "root_cause" else "other"
        record: Fields | None = None
        record_line = lineno
        used = 0
        for offset, raw in enumerate(after, start=1):
            text = raw.strip()
            if not text:
                break
            if re.fullmatch(r"[=\-*]{5,}", text) or re.match(
                r"(?:Other\s+)?Failures:|Root Cause", text
            ):
                break
            used = offset
            if re.fullmatch(r"\[\d+\]:", text):
                if record:
                    self._add_child(line, record, role, record_line)
                record, record_line = {}, lineno + offset
                continue
            if text == "<NO_OTHER_FAILURES>":
                break
            fields = parse_message(text)
            if fields is None or fields.get("kind") != "child_field":
                continue
            if record is None:
                record, record_line = {}, lineno + offset
            record.update(
                {k: v for k, v in fields.items() if k != "kind" and not k.startswith("_")}
            )
        if record:
            self._add_child(line, record, role, record_line)
        self.consumed_until = max(self.consumed_until, lineno + used)

    def _add_child(self, line: Line, record: Fields, role: str, lineno: int) -> None:
        fields: Fields = {"kind": Kind.CHILD_FAILED, "form": role, **record}
        rank = record.get("rank")
        text = ", ".join(f"{k}={v}" for k, v in record.items() if v is not None)
        row = Line(line.source, lineno, text, message=text, rank=rank)
        self.dedupe.add(make_event(row, fields, line.text.strip() + " " + text))


def _continues_previous(cand: Candidate, text: str, line: Line, parsed: bool) -> bool:
    """Tell whether a candidate line may be the second half of a line hard-wrapped before it."""
    if not cand.before:
        return False
    if _only_prefixes(cand.before[-1]):
        return True  # a wrap right after the prefixes: they are no line of their own
    if _STRONG_START.match(text):
        return False
    return (
        not parsed  # a wrap in the middle of a word
        or any(p.kind == "lead" for p in line.prefixes)  # inside the header: text before it
        or (not _has_own_prefix(line) and _parse(normalize(line.message)) is None)
    )


def _only_prefixes(raw: bytes) -> bool:
    """Tell whether a physical line holds PyTorch's prefixes (and PG prefixes) but no message."""
    if not raw.rstrip().endswith((b"]", b"]:")):
        return False  # every prefix ends so: most lines are ruled out without peeling them
    line = peel(Line("", 0, _decode(raw)))
    message = normalize(line.message)
    return _has_own_prefix(line) and (not message or _PRELUDE_TAIL.match(message) is not None)


def _has_own_prefix(line: Line) -> bool:
    """Tell whether PyTorch's own prefixes were peeled off a line (a header, ``[rankN]:``)."""
    return any(p.kind in ("header", "tee", "excepthook") for p in line.prefixes)


def _decode(raw: bytes) -> str:
    return segments(raw)[-1]


def make_event(line: Line, fields: Fields, text: str) -> Event:
    """Build an :class:`Event` from a peeled line and the grammar's fields."""
    f = dict(fields)
    eras = f.pop("_eras", [])
    incomplete = bool(f.pop("_incomplete", False))
    f.pop("tail", None)
    repeats = 0
    m = _REPEATED.search(line.text)
    if m:
        repeats = int(m[1])
    kind = str(f.pop("kind"))
    core: dict[str, Any] = {}
    for name in (
        "pg",
        "pg_guid",
        "pg_desc",
        "pg_rank",
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
    ):
        if name in f:
            core[name] = f.pop(name)
    rank = f.pop("rank", None)
    host = f.pop("host", None)
    pid = f.pop("pid", None)
    local_rank = f.pop("local_rank", None)
    if kind == Kind.CHILD_FAILED:
        # the record's rank is the failed rank, not the rank of the line printing it
        rank = rank if rank is not None else line.rank
    else:
        rank = line.rank if line.rank is not None else rank
    if rank is None and core.get("pg_rank") is not None and core.get("pg") in (None, "0"):
        rank = core["pg_rank"]  # "[Rank N]" in the default process group is the global rank
    detail: dict[str, str | int | None] = {}
    for key, value in f.items():
        if isinstance(value, list):  # rank lists of the desync report: "3", "0, 1, 2"
            value = ", ".join(str(v) for v in value)
        if value is None or isinstance(value, (str, int)):
            detail[key] = value
    return Event(
        kind=kind,
        source=line.source,
        line=line.lineno,
        text=text,
        rank=rank,
        local_rank=line.local_rank if line.local_rank is not None else local_rank,
        host=line.host or host,
        pid=pid if pid is not None else line.pid,
        time=line.time,
        ts=line.ts,
        partial=incomplete,
        pytorch_era=era_of(line, eras),
        detail=detail,
        repeats=repeats,
        **core,
    )


# ----------------------------------------------------------------------------- deduplication


_MERGE_FIELDS = (
    "pg",
    "pg_guid",
    "pg_desc",
    "pg_rank",
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
    "host",
    "pid",
    "local_rank",
    "time",
    "ts",
)
_FORM_RANK = {
    "watchdog": 0,
    "blocking_wait": 1,
    "caught": 2,
    "thread_death": 3,
    "aborted": 4,
    "what": 5,
    "timeout_at": 6,
    "exception_detected": 6,
    "failure_detected": 6,
    "dump_signal": 7,
    "damaged": 8,
}
_MASK = re.compile(r"\d+")


class Deduper:
    """Collapses repeats: one event per distinct timeout (rank, work) or message."""

    def __init__(self) -> None:
        self.timeouts: list[Event] = []
        self._by_seq: dict[int | None, list[Event]] = {}
        self._others: dict[tuple[Any, ...], Event] = {}
        self._order: list[Event] = []

    def add(self, ev: Event) -> None:
        """Keep a new event, or fold it into the one it repeats."""
        if ev.kind in (Kind.WATCHDOG_TIMEOUT, Kind.WATCHDOG_STATUS):
            self._add_timeout(ev)
            return
        key: tuple[Any, ...] = (
            ev.kind,
            ev.rank,
            ev.pg_rank,
            ev.detail.get("form"),
            ev.form,
            _MASK.sub("#", _strip_header(ev.text)),
        )
        if ev.kind == Kind.CHILD_FAILED:
            key = (ev.kind, ev.rank, ev.form, ev.detail.get("exit_code"), ev.pid)
        same = self._others.get(key)
        if same is None:
            self._others[key] = ev
            self._order.append(ev)
        else:
            _add_occurrence(same, ev)

    def _add_timeout(self, ev: Event) -> None:
        candidates = self._by_seq.get(ev.seq, []) if ev.seq is not None else self.timeouts
        match = next((t for t in candidates if _same_timeout(t, ev)), None)
        if match is None and ev.seq is not None:
            match = next((t for t in self._by_seq.get(None, []) if _same_timeout(t, ev)), None)
            if match is not None:
                self._by_seq[None].remove(match)
                self._by_seq.setdefault(ev.seq, []).append(match)
        if match is None:
            ev.kind = Kind.WATCHDOG_TIMEOUT
            if ev.form in ("timeout_at", "exception_detected", "failure_detected"):
                ev.partial = True  # only the work number: no op type, sizes or timeout
            self.timeouts.append(ev)
            self._by_seq.setdefault(ev.seq, []).append(ev)
            self._order.append(ev)
            return
        _merge_timeout(match, ev)

    def events(self) -> list[Event]:
        """All events, in input order."""
        return sorted(self._order, key=lambda e: e.line)


def _strip_header(text: str) -> str:
    return re.sub(r"^.*?\d\d:\d\d:\d\d\.\d+\s+\S+:\d+\]\s*", "", text)


def _same_timeout(a: Event, b: Event) -> bool:
    if a.rank is not None and b.rank is not None:
        if a.rank != b.rank:
            return False
    elif a.pg_rank is not None and b.pg_rank is not None and a.pg_rank != b.pg_rank:
        # without a global rank, "[Rank N]" is all there is to tell ranks apart (the same work
        # can show two different "[Rank N]" in its watchdog and status lines: corpus 006)
        return False
    for name in ("seq", "op_type", "timeout_ms"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and y is not None and x != y:
            return False
    return not (a.pg is not None and b.pg is not None and a.pg != b.pg)


def _merge_timeout(into: Event, ev: Event) -> None:
    better = _FORM_RANK.get(ev.form or "", 9) < _FORM_RANK.get(into.form or "", 9)
    if better:
        # the more informative line becomes the event's own line; the old one an occurrence
        into.occurrences.insert(0, Occurrence(into.line, into.rank, into.text))
        into.line, into.text, into.form = ev.line, ev.text, ev.form
        if ev.time is not None:  # the time of the event's own line
            into.time, into.ts = ev.time, ev.ts
        into.partial = ev.partial and into.partial
    else:
        _add_occurrence(into, ev)
        if not ev.partial and ev.ran_for_ms is not None and into.partial:
            into.partial = into.ran_for_ms is None and ev.ran_for_ms is None
    for name in _MERGE_FIELDS:
        if getattr(into, name) is None and getattr(ev, name) is not None:
            setattr(into, name, getattr(ev, name))
    if into.rank is None:
        into.rank = ev.rank
    if into.partial and all(
        getattr(into, n) is not None for n in ("op_type", "timeout_ms", "ran_for_ms")
    ):
        into.partial = False
    into.repeats = max(into.repeats, ev.repeats)
    if ev.pytorch_era and (into.pytorch_era is None or len(ev.pytorch_era) < len(into.pytorch_era)):
        into.pytorch_era = ev.pytorch_era
    into.occurrences.sort(key=lambda o: o.line)


def _add_occurrence(into: Event, ev: Event) -> None:
    if len(into.occurrences) < MAX_OCCURRENCES:
        into.occurrences.append(Occurrence(ev.line, ev.rank, ev.text))
    into.repeats += max(ev.repeats, 0)
