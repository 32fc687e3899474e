"""The transformer's half for PyTorch's own message families.

The watchdog, status lines, desync reports, tear-down, heartbeat monitor, dump signals and the
flight recorder.

Input: Lark parse trees of those families. Output: flat dicts of event fields.
"""

from __future__ import annotations

import re
from typing import Any

from lark import Token, Transformer

from nccl_triage.model import Kind
from nccl_triage.parse.fields_common import (
    COUNTERS,
    PG_ID,
    PG_NAME,
    WORK_KEYS,
    WORK_RANK,
    Fields,
    NotAMessage,
    looks_cut,
    ranks,
)


class TorchFields(Transformer[Token, Fields]):
    """Fields of PyTorch's own message families (a mixin of the grammar's transformer)."""

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
        m = PG_ID.match(text)
        if m:
            return {
                "pg": m["pg"],
                "pg_guid": m["guid"] or None,
                "pg_desc": m["desc"],
                "pg_rank": int(m["rank"]),
                "_eras": [("2.5", "")],
            }
        m = PG_NAME.match(text)
        if m:
            era = ("2.4", "2.4") if m["desc"] else ("2.3", "2.4")
            return {"pg": m["pg"], "pg_desc": m["desc"], "pg_rank": int(m["rank"]), "_eras": [era]}
        m = WORK_RANK.match(text)
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
        key = WORK_KEYS.get(str(items[0]))
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
                raise NotAMessage(tail)
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
        return {"form": "lagging_ranks", "ranks": ranks(items[0])}

    def culprits(self, items: list[Any]) -> Fields:
        return {"form": "culprits"}

    def desync_unfinished(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": "joined_not_finished",
            "ranks": ranks(items[0]),
            "seq": int(items[1]),
        }

    def desync_unjoined(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": "finished_not_joined",
            "ranks": ranks(items[0]),
            "seq": int(items[1]) + 1,
        }

    def desync_snapshot(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, "form": "snapshot"}

    def desync_state(self, items: list[Any]) -> Fields:
        return {"kind": Kind.DESYNC_REPORT, "form": f"{items[1]}ranks", "seq": int(items[0])}

    def desync_state_ranks(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.DESYNC_REPORT,
            "form": str(items[1]),
            "ranks": ranks(items[0]),
            "op_type": str(items[2]),
        }

    def desync_timeout_at(self, items: list[Any]) -> Fields:
        # the report of a rank whose collective timed out: that timeout, as a status line
        return {
            "kind": Kind.WATCHDOG_STATUS,
            "form": "desync_timeout_at",
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
            if looks_cut(inner["message"]):
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
            if inner.get("kind") == "text" and looks_cut(inner["message"]):
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
        m = COUNTERS.search(tail)
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
        m = COUNTERS.search(tail)
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

    def watchdog_raised(self, items: list[Any]) -> Fields:
        # the C++ trace of an exception the watchdog thread died of (its message was above)
        return {"kind": Kind.WATCHDOG_EXCEPTION, "form": "raised_from_watchdog"}

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
