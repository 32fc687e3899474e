"""parse.py: near-misses that are not events, damaged lines, prefixes, repeats and deduplication."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage.model import Event
from nccl_triage.parse.messages import parse_message
from nccl_triage.pipeline import parse_text

HEADER = "[rank3]:[E1022 03:48:07.493651427 ProcessGroupNCCL.cpp:607] "
WATCHDOG = (
    "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600006 milliseconds before timing out."
)
LINE = HEADER + WATCHDOG  # item 12 of the format reference without the tee prefix
WORK = {
    "seq": 4,
    "op_type": "ALLREDUCE",
    "numel_in": 1,
    "numel_out": 1,
    "timeout_ms": 600000,
    "ran_for_ms": 600006,
}
FULL = {
    "line": 1,
    "rank": 3,
    "pg_rank": 3,
    "time": "10-22 03:48:07.493651427",
    "partial": False,
    **WORK,
}


def timeouts(text: str) -> list[Event]:
    return [e for e in parse_text(text).events if e.kind == "watchdog_timeout"]


def one_timeout(text: str) -> Event:
    result = parse_text(text)
    assert [e.kind for e in result.events] == ["watchdog_timeout"]
    return result.events[0]


def fields(ev: Event, names: Any = FULL) -> dict[str, Any]:
    return {name: getattr(ev, name) for name in names}


# ----------------------------------------------------------------------------- near-misses

NEAR_MISSES = {
    "retyped-descriptor": "I keep getting Watchdog caught collective operation timeout: WorkNCCL(...) "
    "ran for 600000+ milliseconds before timing out.",
    "placeholder-N": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N, "
    "OpType=ALLREDUCE, Timeout(ms)=N) ran for N milliseconds before timing out.",
    "placeholder-angle": "Timeout at NCCL work: <seq>, last enqueued NCCL work: <n>, "
    "last completed NCCL work: <n>.",
    "question": "How do I fix the Watchdog caught collective operation timeout error?",
    "bare-phrase": "Watchdog caught collective operation timeout",
    "prose-watchdog": "The NCCL watchdog thread terminated with exception after a while, any idea?",
    "prose-timeout-ms": "You can check the WorkNCCL( descriptor in the log; it has Timeout(ms)=600000",
    "code-comment": 'dist.init_process_group("nccl", timeout=timedelta(seconds=600))  # Timeout(ms)=600000',
    "code-print": 'print(f"Watchdog caught collective operation timeout: {work}")',
    "prose-enqueued": 'Last enqueued work is reported in the logs as "last enqueued NCCL work"',
    "traceback-frame": '  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", '
    "line 2050, in all_reduce",
    "traceback-source": "    work = group.allreduce([tensor], opts)",
    "nccl-info-channel": "node-b07:88121:88121 [0] NCCL INFO Channel 00/24 :    0   1   2   3   4   5",
    "nccl-info-rings": "node-b07:88121:88121 [0] NCCL INFO Connected all rings",
    "nccl-info-init-start": "node-b07:88121:88121 [0] NCCL INFO ncclCommInitRank comm 0x5621 rank 3 "
    "nranks 8 cudaDev 3 busId 3b000 - Init START",
    "nccl-tests-summary": "# Avg bus bandwidth    : 187.42 ",
    "env-export": "export TORCH_NCCL_BLOCKING_WAIT=1 NCCL_DEBUG=WARN",
    "root-cause-prose": "Root Cause: the dataloader hung on rank 2",
    "exitcode-prose": "The job failed (exitcode: 1) yesterday",
    "closing-signal-prose": "I am sending a closing signal to the workers",
    "cuda-error-prose": "no CUDA error was reported",
    "dump-signal-prose": "We never received a dump signal.",
    "child-failed-import": "from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record",
    "child-failed-raise": "    raise ChildFailedError(",
    "glog-banner": "WARNING: Logging before InitGoogleLogging() is written to STDERR",
    "progress-bar": "Epoch 3:  45%|████▌     | 450/1000 [10:00<12:13,  1.33s/it, loss=0.231]",
}


@pytest.mark.parametrize("text", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_miss_gives_no_event(text: str) -> None:
    assert parse_text(text + "\n").events == []


def test_near_misses_inside_a_log_leave_the_real_timeout_alone() -> None:
    log = "\n".join([*NEAR_MISSES.values(), LINE, ""])
    ev = one_timeout(log)
    assert fields(ev, WORK) == WORK
    assert ev.line == len(NEAR_MISSES) + 1


# ----------------------------------------------------------------------------- hard wraps


@pytest.mark.parametrize(
    "cut",
    [
        20,  # inside the header's timestamp: "[rank3]:[E1022 03:48" / ":07.49..."
        72,  # mid-word: "[Rank 3] Wat" / "chdog caught"
        118,  # inside "collective"
        152,  # mid-number: "SeqNum=" / "4, ..."
        len(HEADER + WATCHDOG.split("Timeout(ms)=60")[0]) + len("Timeout(ms)=60"),  # "600000"
        len(HEADER + WATCHDOG.split("ran for 60")[0]) + len("ran for 60"),  # "600006"
    ],
)
def test_wrapped_over_two_lines(cut: int) -> None:
    ev = one_timeout(f"before\n{LINE[:cut]}\n{LINE[cut:]}\nafter\n")
    assert fields(ev) == {**FULL, "line": 2}
    assert ev.text == LINE


def test_wrap_before_the_final_period_needs_no_join() -> None:
    ev = one_timeout(f"{LINE[:-1]}\n.\n")
    assert fields(ev) == FULL
    assert ev.text == LINE[:-1]


@pytest.mark.parametrize("cuts", [(70, 150), (100, 195), (150, 210), (175, 232)])
def test_wrapped_over_three_lines(cuts: tuple[int, int]) -> None:
    a, b = cuts
    ev = one_timeout(f"{LINE[:a]}\n{LINE[a:b]}\n{LINE[b:]}\nnext line\n")
    assert fields(ev) == FULL
    assert ev.text == LINE


def test_wrap_does_not_swallow_the_next_message() -> None:
    second = LINE.replace("rank3", "rank5").replace("Rank 3", "Rank 5")
    log = f"{LINE[:100]}\n{LINE[100:]}\n{second}\n"
    assert [(e.rank, e.line, e.seq) for e in timeouts(log)] == [(3, 1, 4), (5, 3, 4)]


def test_glued_after_a_progress_bar() -> None:
    bar = " 45%|████▌     | 450/1000 [10:00<12:13,  1.33s/it]"
    ev = one_timeout(bar + LINE + "\n")
    assert fields(ev) == FULL


def test_cut_before_ran_for_keeps_what_survives() -> None:
    cut = LINE.index(" ran for")
    ev = one_timeout(LINE[:cut] + "\nSaving checkpoint to /ckpt/step_1200\n")
    assert fields(ev) == {**FULL, "ran_for_ms": None, "partial": True}


def test_cut_inside_the_descriptor_keeps_what_survives() -> None:
    cut = LINE.index("NumelIn=") + len("NumelIn=")
    ev = one_timeout(LINE[:cut] + "\n")
    assert fields(ev) == {
        **FULL,
        "numel_in": None,
        "numel_out": None,
        "timeout_ms": None,
        "ran_for_ms": None,
        "partial": True,
    }


def test_cut_inside_the_opening_phrase_of_a_real_line() -> None:
    # corpus case 023: the line stops at "collecti"; the prefixes make it a real timeout line
    ev = one_timeout(HEADER + "[Rank 3] Watchdog caught collecti\n")
    assert fields(ev, ("rank", "pg_rank", "seq", "op_type", "partial")) == {
        "rank": 3,
        "pg_rank": 3,
        "seq": None,
        "op_type": None,
        "partial": True,
    }


def test_cut_thread_death_is_still_a_timeout() -> None:
    line = (
        "[rank1]:[E ProcessGroupNCCL.cpp:1182] [Rank 1] NCCL watchdog thread terminated with "
        "exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=880, "
        "OpType=BROADCAST, Num"
    )
    ev = one_timeout(line + "\n")
    assert fields(ev, ("rank", "seq", "op_type", "partial")) == {
        "rank": 1,
        "seq": 880,
        "op_type": "BROADCAST",
        "partial": True,
    }


# ----------------------------------------------------------------------------- CR, CRLF, ANSI


def test_carriage_return_redraws_keep_the_physical_line_number() -> None:
    log = f"first\nsecond\nstep 1/10\rstep 2/10\r{LINE}\r 46%|████▌     | 460/1000\nlast\n"
    ev = one_timeout(log)
    assert fields(ev) == {**FULL, "line": 3}
    assert ev.text == LINE


def test_crlf_line_endings() -> None:
    ev = one_timeout(f"a\r\n{LINE}\r\nb\r\n")
    assert fields(ev) == {**FULL, "line": 2}
    assert ev.text == LINE


@pytest.mark.parametrize("esc", ["\x1b", ""], ids=["with-esc", "esc-lost"])
def test_ansi_colour_codes(esc: str) -> None:
    coloured = f"{esc}[31m{HEADER}{esc}[0m{esc}[1m{WATCHDOG}{esc}[0m"
    ev = one_timeout(coloured + "\n")
    assert fields(ev) == FULL
    assert ev.text == LINE


# ----------------------------------------------------------------------------- repeats


def test_same_timeout_in_what_thread_death_and_cluster_repeat_is_one_event() -> None:
    pg = "[PG ID 0 PG GUID 0(default_pg) Rank 3]"
    death = f"{pg} Process group watchdog thread terminated with exception: {WATCHDOG}"
    log = "\n".join(
        [
            LINE,
            f"[rank3]:[E1022 03:48:07.512 ProcessGroupNCCL.cpp:1595] {death}",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {death}",
            f"(RayWorkerWrapper pid=4009) {LINE} [repeated 14x across cluster]",
            "",
        ]
    )
    events = parse_text(log).events
    assert [e.kind for e in events] == ["watchdog_timeout", "terminate"]
    ev = events[0]
    assert fields(ev) == FULL
    assert ev.form == "watchdog"
    assert [o.line for o in ev.occurrences] == [2, 4, 5]
    assert ev.repeats == 14
    assert (ev.pg, ev.pg_desc) == ("0", "default_pg")  # learnt from the thread-death line


def test_status_line_merges_into_the_watchdog_line() -> None:
    status = (
        "[rank3]:[E1022 03:48:07.49 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 3] "
        "Exception (either an error or timeout) detected by watchdog at work: 4, "
        "last enqueued NCCL work: 5, last completed NCCL work: 3."
    )
    ev = one_timeout(f"{status}\n{LINE}\n")
    assert fields(ev) == {**FULL, "line": 2}
    assert (ev.form, ev.pg, ev.last_enqueued, ev.last_completed) == ("watchdog", "0", 5, 3)
    assert [o.line for o in ev.occurrences] == [1]


def test_rank_seen_only_in_a_status_line_is_a_timeout() -> None:
    status = (
        "[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 4, "
        "last enqueued NCCL work: 4, last completed NCCL work: 3."
    )
    found = timeouts(f"{LINE}\n{status}\n")
    assert [(e.rank, e.seq, e.form, e.partial) for e in found] == [
        (3, 4, "watchdog", False),
        (1, 4, "timeout_at", True),
    ]
    assert (found[1].last_enqueued, found[1].last_completed, found[1].line) == (4, 3, 2)


def test_two_ranks_two_process_groups_are_separate_timeouts() -> None:
    def death(pg: str, pg_rank: int) -> str:
        return (
            f"[rank3]:[E1022 03:48:09.1 ProcessGroupNCCL.cpp:1595] {pg} Process group watchdog "
            f"thread terminated with exception: " + WATCHDOG.replace("Rank 3", f"Rank {pg_rank}")
        )

    rank5 = LINE.replace("rank3", "rank5").replace("Rank 3", "Rank 5")
    log = "\n".join(
        [
            death("[PG ID 0 PG GUID 0(default_pg) Rank 3]", 3),
            death("[PG ID 2 PG GUID 9 Rank 1]", 1),
            rank5,
            "",
        ]
    )
    found = timeouts(log)
    assert [(e.rank, e.pg, e.pg_rank, e.seq) for e in found] == [
        (3, "0", 3, 4),
        (3, "2", 1, 4),
        (5, None, 5, 4),
    ]


# ----------------------------------------------------------------------------- prefixes


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload)


PREFIXED = {
    # id: (line, rank, local_rank, pg, pg_rank, time, host, pid)
    "tee": (f"[default3]:{LINE}", 3, 3, None, 3, FULL["time"], None, None),
    "tee-role-rank": (f"[rank1]:{LINE}", 3, 1, None, 3, FULL["time"], None, None),
    "srun": (f"3: {LINE}", 3, None, None, 3, FULL["time"], None, None),
    "srun-tee": (f"0: [default3]:{LINE}", 3, 3, None, 3, FULL["time"], None, None),
    "ray": (f"(RayWorkerWrapper pid=4009) {LINE}", 3, None, None, 3, FULL["time"], None, 4009),
    "ray-ip": (
        f"(RayWorkerWrapper pid=4009, ip=10.0.0.7) [E ProcessGroupNCCL.cpp:475] {WATCHDOG}",
        3,
        None,
        None,
        3,
        None,
        "10.0.0.7",
        4009,
    ),
    "docker-json": (
        _json({"log": LINE + "\n", "stream": "stderr", "time": "2024-10-22T03:48:07Z"}),
        3,
        None,
        None,
        3,
        FULL["time"],
        None,
        None,
    ),
    "k8s-json": (
        _json(
            {
                "log": f"[default3]:{LINE}\n",
                "stream": "stderr",
                "kubernetes": {"pod_name": "trainer-3"},
            }
        ),
        3,
        3,
        None,
        3,
        FULL["time"],
        "trainer-3",
        None,
    ),
    "iso-then-c10": (
        f"2024-10-22T03:48:07.493Z {LINE}",
        3,
        None,
        None,
        3,
        FULL["time"],
        None,
        None,
    ),
    "iso-only": (
        f"2024-10-22T03:48:07.493Z [E ProcessGroupNCCL.cpp:475] {WATCHDOG}",
        3,
        None,
        None,
        3,
        "2024-10-22T03:48:07.493Z",
        None,
        None,
    ),
    "hf-logger": (
        f"2024-10-22 03:48:07,493 - ERROR - __main__ - {WATCHDOG}",
        3,
        None,
        None,
        3,
        "2024-10-22 03:48:07,493",
        None,
        None,
    ),
    "glog": (
        f"E1022 03:48:07.493651 12345 ProcessGroupNCCL.cpp:737] {WATCHDOG}",
        3,
        None,
        None,
        3,
        "10-22 03:48:07.493651",
        None,
        None,
    ),
    "viewer-number": (f"[1757] {LINE}", 3, None, None, 3, FULL["time"], None, None),
    "cat-n": (f"  1757\t{LINE}", 3, None, None, 3, FULL["time"], None, None),
    "markdown-quote": (f"> {LINE}", 3, None, None, 3, FULL["time"], None, None),
    "determined": (
        f"fa88a9df [rank=3] || [E ProcessGroupNCCL.cpp:475] {WATCHDOG}",
        3,
        None,
        None,
        3,
        None,
        None,
        None,
    ),
    "sub-pg": (
        "[rank5]:[E1022 03:48:07.493651427 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 9 Rank 1] "
        "Process group watchdog thread terminated with exception: "
        + WATCHDOG.replace("Rank 3", "Rank 1"),
        5,
        None,
        "2",
        1,
        FULL["time"],
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", PREFIXED.values(), ids=PREFIXED.keys())
def test_stacked_prefixes(case: tuple[Any, ...]) -> None:
    line, *expected = case
    ev = one_timeout(line + "\n")
    assert (ev.rank, ev.local_rank, ev.pg, ev.pg_rank, ev.time, ev.host, ev.pid) == tuple(expected)
    assert fields(ev, WORK) == WORK


def test_agent_line_names_the_worker_pid_not_its_own() -> None:
    log = (
        "W0409 07:28:49.531000 1359 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 1365 closing signal SIGTERM\n"
        "E0409 07:28:50.101000 1359 torch/distributed/elastic/multiprocessing/api.py:869] "
        "failed (exitcode: -6) local_rank: 3 (pid: 1368) of binary: /usr/bin/python3\n"
        "W0409 07:28:51.101000 1359 site-packages/torch/distributed/elastic/agent/server/api.py:719] "
        "Received 15 death signal, shutting down workers\n"
    )
    events = parse_text(log).events
    assert [(e.kind, e.pid, e.local_rank, e.detail.get("signal")) for e in events] == [
        ("agent_signal", 1365, None, "SIGTERM"),
        ("worker_failed", 1368, 3, "SIGABRT"),
        ("agent_signal", 1359, None, "SIGTERM"),  # no pid in the message: the agent's own
    ]


def test_glog_thread_id_is_not_a_pid() -> None:
    line = (
        "E0517 08:24:03.805000 140617718325696 torch/distributed/elastic/multiprocessing/api.py:826] "
        "Sending process 970611 closing signal SIGTERM\n"
    )
    [ev] = parse_text(line).events
    assert ev.pid == 970611


# ----------------------------------------------------------------------------- properties

OPS = st.sampled_from(
    [
        "ALLREDUCE",
        "BROADCAST",
        "_ALLGATHER_BASE",
        "_REDUCE_SCATTER_BASE",
        "COALESCED",
        "SEND",
        "RECV",
        "ALLTOALL_BASE",
        "GATHER",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_parse_message_never_raises(text: str) -> None:
    result = parse_message(text)
    assert result is None or isinstance(result.get("kind"), str)


@settings(max_examples=150, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("[]():=,. \t-_WorkNCCLSeqOpTypemsRank0123456789")),
        max_size=200,
    )
)
def test_parse_message_never_raises_on_grammar_shaped_text(text: str) -> None:
    parse_message(text)


@settings(max_examples=100, deadline=None)
@given(
    rank=st.integers(0, 4095),
    seq=st.integers(0, 10**9),
    op=OPS,
    numel=st.integers(0, 2**64 - 1),
    timeout=st.integers(1, 10**8),
    extra=st.integers(0, 10**6),
    data=st.data(),
)
def test_generated_watchdog_line_round_trips_hard_wrapped(
    rank: int, seq: int, op: str, numel: int, timeout: int, extra: int, data: st.DataObject
) -> None:
    line = (
        f"[rank{rank}]:[E1022 03:48:07.493651427 ProcessGroupNCCL.cpp:607] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
        f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout}) ran for {timeout + extra} "
        "milliseconds before timing out."
    )
    # a terminal hard-wraps every line at its width (whatever the width: mid-word, mid-number)
    width = data.draw(st.integers(60, len(line)), label="terminal width")
    pieces = [line[i : i + width] for i in range(0, len(line), width)]
    ev = one_timeout("step 10\n" + "\n".join(pieces) + "\nstep 11\n")
    expected = {
        "line": 2,
        "rank": rank,
        "pg_rank": rank,
        "seq": seq,
        "op_type": op,
        "numel_in": numel,
        "numel_out": numel,
        "timeout_ms": timeout,
        "ran_for_ms": timeout + extra,
        "partial": False,
        "time": FULL["time"],
    }
    assert fields(ev, expected) == expected


def test_a_long_glued_line_parses_in_linear_time() -> None:
    import time

    from nccl_triage.parse.grammar import parser
    from nccl_triage.parse.messages import parse_message

    parser()
    start = time.perf_counter()
    for junk in ("x" * 65536, "ab:1:2 " * 9000, "ChildFailedError" * 4000):
        parse_message(junk + " [Rank 0] Watchdog caught collective operation timeout: ")
    # quadratic searches took minutes here; linear ones take milliseconds
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize(
    "line",
    [
        # WARNs carry the source location before the level; hosts may be printed without pid:tid
        "gpu-node7 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.0.0.9<52905> failed : Connection reset by peer",
        "[2025-11-24 11:20:21] gpu-node7 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.0.0.9<52905> failed : Connection reset by peer",
        "2025-11-24T03:20:21.001125857Z gpu-node7 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.0.0.9<52905> failed : Connection reset by peer",
    ],
)
def test_libnccl_warn_without_pid_and_tid(line: str) -> None:
    events = parse_text(line + "\n").events
    assert [e.kind for e in events] == ["nccl_warn"]
    assert "Connection reset by peer" in (events[0].detail.get("reason") or "")


def test_a_bracketed_number_in_a_report_is_not_an_nccl_origin() -> None:
    text = "\t   - [3] joined but didn't finish collective #41207 (count from 1)\n"
    assert [e.kind for e in parse_text(text).events] == ["desync_report"]


def test_the_shipped_parser_tables_are_those_of_the_grammar() -> None:
    """``python -m nccl_triage.parse.grammar`` rewrites them after a grammar change; the parser
    they give reads every message as the parser built from the grammar does."""
    import marshal

    from lark.exceptions import LarkError

    from nccl_triage.parse import grammar

    shipped = grammar._HERE / grammar.TABLES
    blob = marshal.loads(shipped.read_bytes())
    assert blob["stamp"] == grammar.stamp(grammar._grammar_text())
    grammar._plain(blob)  # nothing but plain data
    loaded = grammar._load_tables(shipped, blob["stamp"])
    built = grammar._build(grammar._grammar_text())
    assert loaded is not None

    def tree(p: Any, text: str) -> object:
        try:
            return p.parse(text)
        except LarkError as exc:
            return type(exc).__name__

    texts = [*_reference_messages(), "not a message", "NCCL WARN", ""]
    assert [tree(loaded, t) for t in texts] == [tree(built, t) for t in texts]


@pytest.mark.parametrize(
    "damage", [b"", b"\x00\x01", b"not marshal at all", "truncated", "a list", "code"]
)
def test_tables_for_another_grammar_or_damaged_are_not_used(tmp_path: Any, damage: Any) -> None:
    import marshal

    from nccl_triage.parse import grammar

    path = tmp_path / "t.marshal"
    grammar.write_tables(path)
    want = grammar.stamp(grammar._grammar_text())
    assert grammar._load_tables(path, "another stamp") is None
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "a list":
        path.write_bytes(marshal.dumps([want]))
    elif damage == "code":  # a code object where the tables should be: never run, no tables
        code = compile("1", "x", "eval")
        path.write_bytes(marshal.dumps({"stamp": want, "data": code, "memo": {}}))
    else:
        path.write_bytes(damage)
    assert grammar._load_tables(path, want) is None
    with pytest.raises(TypeError):
        grammar._plain({"a": [1, (2, {3: object()})]})


def test_identical_lines_are_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """40,000 repeats of one watchdog line: parsed for its shape once, one event, every line
    counted."""
    from nccl_triage.parse import messages

    calls = []
    real = messages.parse_tree
    monkeypatch.setattr(messages, "parse_tree", lambda text: calls.append(text) or real(text))
    messages._parse_once.cache_clear()
    messages._shapes.clear()
    messages._seen.clear()
    line = (
        "[rank0]:[E1121 10:11:12.123456789 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=4194304, "
        "NumelOut=4194304, Timeout(ms)=600000) ran for 600051 milliseconds before timing out.\n"
    )
    result = parse_text(line * 40_000)
    # the message, its shape (numbers as sentinels), its numbers one up and one down
    assert len(calls) == 4
    assert len(result.events) == 1 and result.lines == 40_000


@pytest.mark.parametrize(
    ("line", "kind", "form"),
    [
        # nccl-tests' CUDACHECK / NCCLCHECK (src/common.h): "%s: Test CUDA failure %s:%d '%s'"
        (
            "gpu-2: Test NCCL failure common.cu:958 'unhandled system error'",
            "nccl_error",
            "test_nccl_failure",
        ),
        (
            "gpu-2: Test CUDA failure common.cu:1045 'invalid device ordinal'",
            "nccl_error",
            "test_cuda_failure",
        ),
        # DDP's check of the model across ranks (torch/distributed/utils.py), two eras
        (
            "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 2 params, while rank 1 has inconsistent 3 params.",
            "collective_mismatch",
            "ddp_model",
        ),
        (
            "RuntimeError: params[0] in this process with sizes [10, 10] appears not to match sizes of the same param in process 0.",
            "collective_mismatch",
            "ddp_model",
        ),
    ],
)
def test_test_failures_and_model_mismatches(line: str, kind: str, form: str) -> None:
    events = parse_text(line + "\n").events
    assert [(e.kind, e.form) for e in events] == [(kind, form)]


def test_nccl_error_wrapped_where_its_comma_was() -> None:
    text = (
        "torch.distributed.DistBackendError: NCCL error in:\n"
        "/opt/conda/work/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691\n"
        "internal error - please report this issue to the NCCL developers, NCCL version 2.19.3\n"
    )
    [ev] = parse_text(text).events
    assert ev.kind == "nccl_error" and ev.detail.get("nccl_version") == "2.19.3"


def test_nccl_info_lines_with_hex_ids_are_read_by_shape() -> None:
    """An Init COMPLETE line (hex communicator ids) is parsed once per shape, not per line."""
    from nccl_triage.parse import messages

    messages._seen.clear()

    line = (
        "gpu-node-003:4007:4097 [1] NCCL INFO comm 0x55d1c0a2b0 rank 1 nranks 4 cudaDev 1 "
        "nvmlDev 1 busId 18000 commId 0x9a3c41e7 - Init COMPLETE"
    )
    parse_message(line)
    shape = messages._NUMBERS.sub("#", line)
    assert messages._shapes.get(shape) not in (None, messages._UNTRUSTED)
    other = line.replace("0x55d1c0a2b0", "0x7f3a00c1d2e8").replace("rank 1 ", "rank 3 ")
    assert parse_message(other) == messages._parse(other, None)
    assert parse_message(other)["nccl_rank"] == 3


def test_a_message_seen_word_for_word_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fields of a message seen before are a copy of the first ones: neither its shape nor
    the grammar is asked again, and a caller changing its fields changes no later result."""
    from nccl_triage.parse import messages

    monkeypatch.setattr(messages, "_seen", {})  # (this test's own: it fills it with fakes)
    line = "gpu-node-003:4000:4000 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"
    first = parse_message(line)
    assert first is not None and first == messages._parse(line, None)
    first["nccl_version"] = "changed"
    calls = []
    monkeypatch.setattr(messages, "_by_shape", lambda m: calls.append(m))
    again = parse_message(line)
    assert calls == [] and again == messages._parse(line, None)
    assert again is not parse_message(line)  # (a copy each time)
    monkeypatch.setattr(messages, "_MAX_SEEN", 1)  # full: forgotten, then read again
    parse_message(line + " ")
    assert parse_message(line) is None and calls == [line + " ", line]


def _reference_lines() -> list[str]:
    """The single-line examples of ``data/reference_examples.yaml``."""
    import yaml

    path = Path(__file__).parent / "data" / "reference_examples.yaml"
    data = yaml.safe_load(path.read_text("utf-8"))
    return [
        e["line"]
        for section in data.values()
        for e in section
        if isinstance(e, dict) and isinstance(e.get("line"), str)
    ]


def _reference_messages() -> list[str]:
    from nccl_triage.model import Line
    from nccl_triage.parse.anatomy import peel

    lines = _reference_lines()
    # and the lines of the mined logs that hold an anchor: real messages of every family
    from nccl_triage.parse.lines import ANCHOR_RE

    for log in sorted((Path(__file__).parent / "corpus").glob("*/*.log")):
        text = log.read_text("utf-8", errors="replace")
        lines += [line for line in text.splitlines() if ANCHOR_RE.search(line)][:20]
    return sorted({peel(Line("x", 1, text)).message for text in lines})


REFERENCE_MESSAGES = _reference_messages()


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(REFERENCE_MESSAGES), st.lists(st.integers(0, 10**12), min_size=1))
def test_a_message_read_by_its_shape_is_the_grammars_reading(
    message: str, numbers: list[int]
) -> None:
    """Another message of a learnt shape (other numbers) gets exactly what the grammar gives."""
    import re

    from nccl_triage.parse import messages

    parse_message(message)  # learns the shape
    values = iter(numbers * 100)
    other = re.sub(r"\d+", lambda m: str(next(values)), message)
    assert parse_message(other) == messages._parse(other, None)
    # hex numbers are numbers of the shape too ("comm 0x55d1c0a2b0"): other hex numbers
    values = iter(numbers * 100)
    other = re.sub(
        r"0[xX][0-9a-fA-F]+|\d+",
        lambda m: hex(next(values)) if m[0][1:2] in ("x", "X") else str(next(values)),
        message,
    )
    assert parse_message(other) == messages._parse(other, None)


def _flattenable_lines() -> list[str]:
    """Reference and mined lines that start a message of their own and read as one event."""
    from nccl_triage.parse.lines import _NEXT_MESSAGE

    out = []
    for line in sorted(set(_reference_lines())):
        line = line.strip()
        if _NEXT_MESSAGE.match("x " + line, 1) and len(parse_text(line + "\n").events) == 1:
            out.append(line)
    return out


FLATTENABLE = _flattenable_lines()


def _readings(text: str) -> list[tuple[Any, ...]]:
    return sorted(
        (e.kind, str(e.form), str(e.rank), str(e.seq), str(e.op_type), str(e.timeout_ms))
        for e in parse_text(text).events
    )


def test_a_flattened_block_is_read_message_by_message() -> None:
    # an error block whose newlines a chat paste turned into spaces (PyTorch 1.13's tear-down)
    block = [
        (
            "[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800123 "
            "milliseconds before timing out."
        ),
        (
            "[E ProcessGroupNCCL.cpp:325] Some NCCL operations have failed or timed out. Due to the "
            "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data. To avoid this inconsistency, we are taking the entire "
            "process down."
        ),
        "terminate called after throwing an instance of 'std::runtime_error'",
    ]
    flat = parse_text(" ".join(block) + "\n").events
    assert [(e.kind, e.line) for e in flat] == [
        ("watchdog_timeout", 1),
        ("teardown", 1),
        ("terminate", 1),
    ]
    assert flat[0].text == block[0]  # the message, not the whole line


def test_a_prefix_before_a_message_is_no_split() -> None:
    line = (
        "[rank1]:   what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog "
        "thread terminated with exception: CUDA error: an illegal memory access was encountered"
    )
    [ev] = parse_text(line + "\n").events
    assert ev.rank == 1 and ev.text == line


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(FLATTENABLE), min_size=2, max_size=4),
    st.lists(st.sampled_from([" ", "  ", "\t", " \t "]), min_size=3, max_size=3),
)
def test_flattened_reference_lines_read_as_the_lines_do(lines: list[str], gaps: list[str]) -> None:
    """Any few real messages flattened into one line give the events they give one per line."""
    flat = lines[0] + "".join(g + line for g, line in zip(gaps, lines[1:], strict=False))
    assert _readings(flat + "\n") == _readings("\n\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("line", "kind", "field", "value"),
    [
        # nccl-tests and NCCL 2.26's RAS banner: the version with what it was compiled with
        ("NCCL version 2.26.2 compiled with CUDA 12.4", "nccl_info", "nccl_version", "2.26.2"),
        # torchelastic 1.9-1.10 wrote the worker group's state in lower case
        (
            (
                "INFO:torch.distributed.elastic.agent.server.local_elastic_agent:[default] Worker "
                "group failed"
            ),
            "agent_signal",
            "state",
            "FAILED",
        ),
    ],
)
def test_version_suffixes_and_lower_case_group_states(
    line: str, kind: str, field: str, value: str
) -> None:
    [ev] = parse_text(line + "\n").events
    assert ev.kind == kind and ev.detail.get(field) == value


def test_rich_log_records_of_accelerate_s_launcher() -> None:
    # https://github.com/huggingface/accelerate/issues/1214: rich's handler puts the level
    # first and where the record came from at the end, and wraps what does not fit
    log = (
        " WARNING  Sending process 14 closing signal SIGTERM         api.py:699\n"
        " ERROR    failed (exitcode: -9) local_rank: 5 (pid: 22) of  api.py:673\n"
        "          binary: /opt/conda/bin/python\n"
    )
    closing, failed = parse_text(log).events
    assert (closing.kind, closing.form, closing.detail["signal"]) == (
        "agent_signal",
        "closing",
        "SIGTERM",
    )
    assert failed.kind == "worker_failed" and failed.detail["signal"] == "SIGKILL"


@pytest.mark.parametrize(
    ("line", "field", "value", "absent"),
    [
        # https://github.com/horovod/horovod/issues/610: a CUDA call failed (cudaIpcOpenMemHandle's
        # cudaErrorInvalidValue), not an invalid argument to NCCL
        (
            (
                "localhost:95772:95782 [0] transport/p2p.cu:526 WARN failed to open CUDA IPC handle "
                ": 11 invalid argument"
            ),
            "error_class",
            "ncclUnhandledCudaError",
            None,
        ),
        # an InfiniBand device is no network interface
        (
            (
                "node:1:2 [0] misc/ibvwrap.cc:262 NCCL WARN Call to ibv_modify_qp failed with 110 "
                "Connection timed out, on dev mlx5_0:1, curr state INIT, next state RTR"
            ),
            "device",
            "mlx5_0",
            "interface",
        ),
    ],
)
def test_what_an_nccl_warning_names(line: str, field: str, value: str, absent: str | None) -> None:
    [ev] = parse_text(line + "\n").events
    assert ev.detail.get(field) == value
    assert absent is None or absent not in ev.detail


BF12 = (Path(__file__).parent / "corpus/blind-forums/bf12.log").read_text("utf-8").splitlines()[0]


@pytest.mark.parametrize(
    "line",
    [
        # https://github.com/NVIDIA/nccl/issues/2190 ... without NCCL's prefix, behind Ray's
        (
            "(Runner pid=868697) Error while creating shared memory segment /dev/shm/nccl-UmqSM9 "
            "(size 7340384)"
        ),
        # an InfiniBand completion error quoted inside a sentence of a forum post
        # (tests/corpus/blind-forums/bf12.log, verbatim)
        BF12,
        # a libnccl line in a markdown code span
        "`graph/topo.h:230 NCCL WARN Could not find NET with id 0`",
    ],
)
def test_nccl_errors_without_their_prefix_or_inside_prose(line: str) -> None:
    [ev] = parse_text(line + "\n").events
    assert ev.kind == "nccl_warn" and ev.detail.get("severity") == "error"


_START_PIECES = [
    " ",
    "\t",
    "\u00a0",
    "[",
    "]",
    "[rank3]:",
    "[E1022 10:11:12.123 ProcessGroupNCCL.cpp:632]",
    "[W socket.cpp:1]",
    "[Rank 0]",
    "host:1:2 [0] NCCL INFO",
    "NCCL WARN",
    "gpu-node.3:40:41",
    " [7] ",
    "INFO",
    "WARN",
    "NCCL ",
    "[default0]:",
    "what():",
    "terminate called after throwing",
    "Exception raised from c10",
    "Traceback (most recent call last):",
    "torch.distributed.DistBackendError:",
    "x",
    "rank",
    "E",
]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_START_PIECES), max_size=14))
def test_the_cheap_test_never_misses_where_a_message_may_start(pieces: list[str]) -> None:
    """Wherever _NEXT_MESSAGE finds the start of another message, the cheap test says so."""
    from nccl_triage.parse.lines import _NEXT_MESSAGE, _may_start_another

    text = "".join(pieces)
    if _NEXT_MESSAGE.search(text):
        assert _may_start_another(text)


@pytest.mark.parametrize(
    "text",
    [
        "x [E1022 10:11:12.123 ProcessGroupNCCL.cpp:632] a",
        "x [W socket.cpp:1] a",
        "x [I ProcessGroupNCCL.cpp:9] a",
        "x [F c10d.py:3] a",
        "x [rank3]:[E socket.cpp:1] a",
        "x\t[rank3]: a",
        "x\u00a0[rank3]: a",
        "x terminate called after throwing an instance",
        "x what(): boom",
        "x Exception raised from c10d",
        "x Traceback (most recent call last):",
        "x host:1:2 [0] NCCL INFO a",
        "x host:1:2 [0] WARN a",
        "x torch.distributed.DistBackendError: a",
    ],
)
def test_each_start_of_a_message_passes_the_cheap_test(text: str) -> None:
    from nccl_triage.parse.lines import _NEXT_MESSAGE, _may_start_another

    assert _NEXT_MESSAGE.search(text)
    assert _may_start_another(text)


def test_evolve_is_dataclasses_replace() -> None:
    """The pipeline's copy of an event or a line with some fields changed is ``replace``'s."""
    import dataclasses

    from nccl_triage.model import Detail, Event, Line, Occurrence, evolve

    ev = Event(
        "watchdog_timeout",
        "a.log",
        12,
        "text",
        rank=3,
        seq=7,
        detail=Detail({"x": 1}),
        occurrences=(Occurrence(13, 3, "again"),),
    )
    for changes in ({}, {"rank": 5}, {"repeats": 2, "occurrences": ()}, {"kind": "nccl_error"}):
        assert evolve(ev, **changes) == dataclasses.replace(ev, **changes)
        assert evolve(ev, **changes) is not ev
    line = Line("a.log", 3, "[rank1]: x", "x", rank=1)
    assert evolve(line, lineno=9) == dataclasses.replace(line, lineno=9)
    with pytest.raises(TypeError):
        evolve(ev, no_such_field=1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "[E1022 10:11:12.123456 ProcessGroupNCCL.cpp:632] ",
                "10:11:12.5 f.py:3]",
                "]",
                "x ",
                "12:34:56.7 ",
                "a:1] ",
                "\n",
                " ",
                "[rank0]:",
                "1",
            ]
        ),
        max_size=10,
    )
)
def test_the_dedupe_key_drops_what_the_header_pattern_drops(pieces: list[str]) -> None:
    """The header is found by a search for its end: the text ``^.*?`` + the end would drop."""
    import re

    from nccl_triage.parse.dedupe import _strip_header

    text = "".join(pieces)
    old = re.sub(r"^.*?\d\d:\d\d:\d\d\.\d+\s+\S+:\d+\]\s*", "", text)
    assert _strip_header(text) == old


@pytest.mark.parametrize(("learnt", "other"), [(2, 1), (1, 2), (7, 2), (0, 3)])
def test_a_field_looked_up_from_a_number_is_not_read_by_shape(learnt: int, other: int) -> None:
    """An NCCL error code's class comes from the code: a shape learnt from one code (whose
    class the text names too) does not give its class to a message of another code."""
    from nccl_triage.parse import messages

    text = "RuntimeError: NCCL Error {}: unhandled system error (run with NCCL_DEBUG=INFO)"
    messages._shapes.clear()  # (each case learns its shape from its own code)
    messages._seen.clear()
    messages._parse_once.cache_clear()
    parse_message(text.format(learnt))
    message = text.format(other)
    assert parse_message(message) == messages._parse(message, None)


def test_events_are_built_as_the_dataclass_builds_them() -> None:
    """Event's own ``__init__`` (slots set directly) takes the dataclass's parameters, in
    order, with its defaults (a fresh ``detail`` each time), and the event stays frozen."""
    import dataclasses
    import inspect

    from nccl_triage.model import Detail, Event

    names = [f.name for f in dataclasses.fields(Event)]
    assert list(inspect.signature(Event.__init__).parameters)[1:] == names
    a, b = Event("k", "s", 1, "t"), Event("k", "s", 1, "t")
    assert a == b and a.detail == Detail() and a.detail is not b.detail
    assert (a.rank, a.partial, a.occurrences, a.repeats) == (None, False, (), 0)
    full = Event(*[f"v{i}" for i in range(len(names))])
    assert [getattr(full, n) for n in names] == [f"v{i}" for i in range(len(names))]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rank = 3  # type: ignore[misc]
