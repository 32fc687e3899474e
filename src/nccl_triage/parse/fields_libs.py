"""The transformer's half for everything else.

NCCL's errors and log lines, CUDA errors, collective fingerprints, torchrun, stores and
sockets, Gloo and environment warnings.

Input: Lark parse trees of those families. Output: flat dicts of event fields.
"""

from __future__ import annotations

import re
from typing import Any

from lark import Token, Transformer

from nccl_triage.model import Kind
from nccl_triage.parse.fields_common import (
    ERROR_TRACE,
    FINGERPRINT,
    INFO_PATTERNS,
    NCCL_RESULTS,
    SIGNAL,
    START_METHOD,
    Fields,
    NotAMessage,
    balanced,
    ranks,
    signame,
)
from nccl_triage.parse.nccl_text import read_message, read_reason


class LibraryFields(Transformer[Token, Fields]):
    """Fields of the other message families (a mixin of the grammar's transformer)."""

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

    # --- NCCL errors as frameworks raise them
    def _nccl_raised(self, form: str, reason: str, **extra: Any) -> Fields:
        out: Fields = {"kind": Kind.NCCL_ERROR, "form": form, **read_reason(reason)}
        out.update({k: v for k, v in extra.items() if v is not None})
        return out

    def nccl_failure(self, items: list[Any]) -> Fields:
        src = _token(items, "SRC_LOC")
        reason = (_token(items, "QUOTED") or "").strip("'\"")
        return self._nccl_raised("failure", reason, **_source(src))

    def nccl_test_failure(self, items: list[Any]) -> Fields:
        # nccl-tests' own checks: its NCCL calls, and the CUDA calls it makes around them
        src = _token(items, "SRC_LOC")
        reason = (_token(items, "QUOTED") or "").strip("'\"")
        lib = _token(items, "TEST_LIB")
        return self._nccl_raised(f"test_{(lib or 'nccl').lower()}_failure", reason, **_source(src))

    def nccl_error_code(self, items: list[Any]) -> Fields:
        code = int(_token(items, "INT") or 0)
        reason = _text(items)
        out = self._nccl_raised("error_code", reason)
        out["error_class"] = NCCL_RESULTS.get(code, out.get("error_class") or f"ncclResult {code}")
        return out

    def nccl_error_text(self, items: list[Any]) -> Fields:
        return self._nccl_raised("error_text", _text(items))

    def nccl_call_failed(self, items: list[Any]) -> Fields:
        call = _token(items, "NCCL_CALL") or _token(items, "NCCL_FN") or ""
        return self._nccl_raised("call_failed", _text(items), nccl_call=call.split("(")[0])

    def nccl_async_abort(self, items: list[Any]) -> Fields:
        return self._nccl_raised("async_abort", _text(items))

    def nccl_symbol(self, items: list[Any]) -> Fields:
        symbol = _token(items, "NCCL_FN") or ""
        return {
            "kind": Kind.NCCL_ERROR,
            "form": "undefined_symbol",
            "nccl_call": symbol,
            "reason": f"undefined symbol: {symbol}",
        }

    def nccl_no_library(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.NCCL_ERROR,
            "form": "no_library",
            "reason": "Unable to load NCCL library",
        }

    def nccl_cuda_failure(self, items: list[Any]) -> Fields:
        src = _token(items, "SRC_LOC")
        reason = (_token(items, "QUOTED") or "").strip("'\"")
        out = self._nccl_raised("cuda_failure", reason, **_source(src))
        out["cuda_error"] = reason
        out.setdefault("error_class", "ncclUnhandledCudaError")
        return out

    # --- libnccl's own lines
    def nccl_bare(self, items: list[Any]) -> Fields:
        message = f"{items[0]} {_text(items)}".rstrip()  # the error's head and what follows
        out: Fields = {"kind": Kind.NCCL_WARN, "form": "bare", "level": "WARN", "message": message}
        out.update(read_message("WARN", message))
        return out

    def nccl_lib(self, items: list[Any]) -> Fields:
        origin = _token(items, "NCCL_ORIGIN") or ""
        m = re.match(r"([\w.-]+):(\d+)(?::(\d+))?\s*\[(\d+)\]", origin)
        dev = _token(items, "RANK_LIST")
        level = _token(items, "NCCL_LEVEL") or "INFO"
        src = _token(items, "SRC_LOC") or _token(items, "LIB_SRC")
        message = items[-1] if isinstance(items[-1], str) else ""
        out: Fields = {
            "kind": Kind.NCCL_WARN if level == "WARN" else Kind.NCCL_INFO,
            "host": m[1] if m else None,
            "pid": int(m[2]) if m else None,
            "cuda_dev": int(m[4])
            if m
            else (int(dev.strip("[] ")) if dev and dev.strip("[] ").isdigit() else None),
            "level": level,
            "source_location": src,
            "message": message,
        }
        out.update(read_message(level, message, src))
        if level != "WARN":
            for rx, names in INFO_PATTERNS:
                hit = rx.search(message)
                if hit:
                    for name, value in zip(names, hit.groups(), strict=True):
                        out[name] = int(value) if value.isdigit() else value
                    break
            else:
                # "NCCL INFO init.cc:82 -> 3": an error return traced back up NCCL's call stack
                m = ERROR_TRACE.match(message)
                if m:
                    out["form"] = "error_trace"
                    out["source_location"] = src or m[1]
                    out["nccl_code"] = NCCL_RESULTS.get(int(m[2]), f"ncclResult {m[2]}")
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
        for i, m in enumerate(FINGERPRINT.finditer(tail)):
            if i == 2:
                break
            fingerprint = balanced(tail, m.end())
            out[f"rank_{'ab'[i]}"] = int(m[1])
            out[f"fingerprint_{'ab'[i]}"] = fingerprint
            op = re.search(r"OpType\s*=\s*(_?[A-Z][A-Z_]*)", fingerprint)
            if op:
                out[f"op_type_{'ab'[i]}"] = op[1]
        return out

    def ddp_model_mismatch(self, items: list[Any]) -> Fields:
        text = _text(items)
        out: Fields = {"kind": Kind.COLLECTIVE_MISMATCH, "form": "ddp_model", "message": text}
        # "but Rank 1 has 212 params, while rank 0 has inconsistent 0 params."
        m = re.search(r"Rank (\d+) has (\d+) params, while rank (\d+) has inconsistent (\d+)", text)
        if m:
            out.update(rank_a=int(m[1]), rank_b=int(m[3]))
        return out

    def horovod_mismatch(self, items: list[Any]) -> Fields:
        return {
            "kind": Kind.COLLECTIVE_MISMATCH,
            "form": "horovod_mismatch",
            "op_type_a": _token(items, "OPTYPE"),
            "message": _text(items),
        }

    def horovod_stall(self, items: list[Any]) -> Fields:
        text = _text(items)
        missing = sorted(
            {
                int(r)
                for m in re.finditer(r"missing ranks:\s*([\d,\s]+)", text)
                for r in re.findall(r"\d+", m[1])
            }
        )
        out: Fields = {"kind": Kind.COLLECTIVE_MISMATCH, "form": "stalled_ops", "message": text}
        if missing:
            out["missing_ranks"] = ", ".join(map(str, missing))
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
        }
        # without an entry point: "... of" and the rest wrapped onto the next line (rich)
        if isinstance(items[-1], str) and not isinstance(items[-1], Token):
            out["entrypoint"] = items[-1]
            m = START_METHOD.fullmatch(items[-1])
            if m:  # function mode: "of fn: <qualname> (start_method: <spawn|fork>)"
                out["entrypoint"], out["start_method"] = m[1], m[2]
        if code < 0:
            out["signal"] = signame(-code)
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
        return {"kind": Kind.AGENT_SIGNAL, "form": "death", "signal": signame(num)}

    def signal_exception(self, items: list[Token]) -> Fields:
        return {
            "kind": Kind.AGENT_SIGNAL,
            "form": "death",
            "pid": int(items[1]),
            "signal": signame(int(items[2])),
        }

    def worker_group(self, items: list[Any]) -> Fields:
        state = next(str(i) for i in items if isinstance(i, Token) and i.type == "GROUP_STATE")
        state = state.upper()  # "Worker group failed" (1.9-1.10), "FAILED" later
        return {"kind": Kind.AGENT_SIGNAL, "form": "worker_group", "state": state}

    def no_error_file(self, items: list[Any]) -> Fields:
        return {"kind": Kind.WORKER_FAILED, "form": "no_error_file", "local_rank": int(items[0])}

    def child_failed_header(self, items: list[Any]) -> Fields:
        if len(items) > 1 and not str(items[0]).rstrip().endswith(":"):
            # "import ChildFailedError, record", "raise ChildFailedError(": code, not the
            # traceback's last line ("...errors.ChildFailedError: ")
            raise NotAMessage(str(items[1]))
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
            out["signal"] = signame(-code)
        return out

    def field_host(self, items: list[str]) -> Fields:
        return {"kind": "child_field", "host": items[0]}

    def field_time(self, items: list[str]) -> Fields:
        return {"kind": "child_field", "failure_time": items[0]}

    def field_traceback(self, items: list[str]) -> Fields:
        text = items[0].strip('"')
        out: Fields = {"kind": "child_field", "traceback": text}
        m = SIGNAL.search(text)
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
        error = (m[1].strip() or None) if m else None
        # "... got error: Socket Timeout" waited too long; "... Connection reset by peer" lost
        # the store (rank 0 gone or unreachable): a socket error, not a wait
        timed_out = error is None or re.search(r"(?i)time(?:d)?[ _-]?out", error) is not None
        return {
            "kind": Kind.STORE_TIMEOUT if timed_out else Kind.SOCKET_ERROR,
            "form": "unique_id_exchange",
            "rank": ranks(items[0])[0] if ranks(items[0]) else None,
            "error": error,
        }

    def store_wait(self, items: list[Any]) -> Fields:
        out: Fields = {"kind": Kind.STORE_TIMEOUT, "form": "store_wait", "message": items[-1]}
        if isinstance(items[0], Token) and items[0].type == "INT":  # "wait timeout after Nms"
            out["timeout_ms"] = int(items[0])
        return out

    def store_wait_s(self, items: list[Any]) -> Fields:
        # gloo's store (Horovod's HTTP store): "Wait timeout after 30 seconds for key(s): 0."
        out = self.store_wait(items)
        n = next(i for i in items if isinstance(i, Token) and i.type == "INT")
        out["timeout_ms"] = int(n) * 1000
        return out

    def socket_timeout(self, items: list[Any]) -> Fields:
        return {"kind": Kind.STORE_TIMEOUT, "form": "socket_timeout"}

    def wait_for_input(self, items: list[Any]) -> Fields:
        # "waitForInput: socket SocketImpl(...) timed out after 1800000ms": a store read timed out
        tail = items[-1] if items and isinstance(items[-1], str) else ""
        t = re.search(r"timed out after (\d+)\s*ms", tail)
        if t is None:
            return {"kind": Kind.SOCKET_ERROR, "form": "wait_for_input", "message": tail}
        return {
            "kind": Kind.STORE_TIMEOUT,
            "form": "wait_for_input",
            "timeout_ms": int(t[1]),
            "message": tail,
        }

    def connect_failed(self, items: list[Any]) -> Fields:
        # "... to [::ffff:10.0.0.5]:40323 (errno: 110 ...)" is one attempt of several (a
        # warning); "... to any network address of (host, port)." is the end of them
        final = str(items[-1]).lstrip().startswith("any ")
        form = "connect_failed_all" if final else "connect_failed"
        out: Fields = {"kind": Kind.SOCKET_ERROR, "form": form, "message": items[-1]}
        # "[::ffff:10.0.0.5]:40323 (errno: ...)" or "any network address of (host, port)."
        m = re.match(r"(\[[^\]]*\]:\d+)|.*?\(([^,()]+),\s*(\d+)\)", items[-1])
        if m:
            out["peer"] = m[1] or f"{m[2]}:{m[3]}"
        return out

    def listen_failed(self, items: list[Any]) -> Fields:
        # "... to bind to [::]:29500 (errno: 98 - Address already in use)." per address;
        # "... to listen on any local network address." when none is left
        tail = str(items[-1])
        final = tail.lstrip().startswith("on any")
        out: Fields = {
            "kind": Kind.SOCKET_ERROR,
            "form": "listen_failed_all" if final else "listen_failed",
            "message": items[-1],
        }
        errno = re.search(r"errno:\s*(\d+)|code:\s*-(\d+)", tail)
        if errno:
            out["errno"] = int(errno[1] or errno[2])
        return out

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
        # RendezvousTimeoutError -> timeout, ...ConnectionError -> connection, ...ClosedError ->
        # closed (the rendezvous was shut down, most often after another node failed)
        form = re.sub(r"^Rendezvous|Error$", "", name).lower() or "error"
        return {
            "kind": Kind.RENDEZVOUS_ERROR,
            "form": form,
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


def _token(items: list[Any], kind: str) -> str | None:
    """The text of the first token of type ``kind`` among a rule's items, or None."""
    return next((str(i) for i in items if isinstance(i, Token) and i.type == kind), None)


def _text(items: list[Any]) -> str:
    """The free text (``tail``) of a rule's items, or ''."""
    return next((i for i in reversed(items) if isinstance(i, str) and not isinstance(i, Token)), "")


def _source(location: str | None) -> dict[str, Any]:
    """``source_file`` and ``source_line`` of a ``file:line`` location."""
    if not location or ":" not in location:
        return {}
    file, _, line = location.rpartition(":")
    return {"source_file": file, "source_line": int(line)} if line.isdigit() else {}
