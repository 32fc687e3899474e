"""anatomy.peel: every prefix layer of section 1 of the format reference, alone and stacked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage.model import Line
from nccl_triage.parse.anatomy import peel, to_seconds

MSG = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(...)"
C10 = "[E1022 10:11:12.123456789 ProcessGroupNCCL.cpp:1664] "
C10_TIME = "10-22 10:11:12.123456789"
FIELDS = (
    "message",
    "rank",
    "local_rank",
    "role",
    "host",
    "pid",
    "severity",
    "time",
    "clock",
    "kinds",
)


def anatomy(text: str) -> dict[str, Any]:
    line = peel(Line("<t>", 1, text))
    got = {name: getattr(line, name) for name in FIELDS if name != "kinds"}
    got["kinds"] = [p.kind for p in line.prefixes]
    return got


def expect(message: str = MSG, kinds: tuple[str, ...] = (), **given: Any) -> dict[str, Any]:
    out = dict.fromkeys(FIELDS)
    out.update(message=message, kinds=list(kinds), **given)
    return out


CASES = {
    "none": ("plain text, no prefix", expect("plain text, no prefix")),
    # (c) severity/time/file headers
    "c10-old": (f"[E ProcessGroupNCCL.cpp:475] {MSG}", expect(severity="E", kinds=("header",))),
    "c10-timestamped": (
        f"{C10}{MSG}",
        expect(severity="E", time=C10_TIME, clock="c10", kinds=("header",)),
    ),
    "c10-month-not-padded": (  # E126 is 26 January
        f"[E126 01:18:04.728765521 ProcessGroupNCCL.cpp:1316] {MSG}",
        expect(severity="E", time="01-26 01:18:04.728765521", clock="c10", kinds=("header",)),
    ),
    "c10-fatal": (
        f"[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] {MSG}",
        expect(severity="F", time="04-29 14:03:49.385461578", clock="c10", kinds=("header",)),
    ),
    "glog-cpp-thread-id": (
        f"E1028 12:14:08.405081 632355 ProcessGroupNCCL.cpp:737] {MSG}",
        expect(severity="E", time="10-28 12:14:08.405081", clock="glog", kinds=("header",)),
    ),
    "torchrun-2.3-thread-id": (
        (
            "E0517 08:24:03.805000 140617718325696 "
            "torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: -6)"
        ),
        expect(
            "failed (exitcode: -6)",
            severity="E",
            time="05-17 08:24:03.805000",
            clock="glog",
            kinds=("header",),
        ),
    ),
    "torchrun-2.6-pid": (
        (
            "W0409 07:28:49.531000 1359 torch/distributed/elastic/multiprocessing/api.py:897] "
            "Sending process 1365 closing signal SIGTERM"
        ),
        expect(
            "Sending process 1365 closing signal SIGTERM",
            severity="W",
            time="04-09 07:28:49.531000",
            clock="glog",
            pid=1359,
            kinds=("header",),
        ),
    ),
    "python-old": (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 518 closing signal SIGTERM",
        expect("Sending process 518 closing signal SIGTERM", severity="W", kinds=("logger",)),
    ),
    "python-2.1": (
        (
            "[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] "
            "Sending process 270 closing signal SIGTERM"
        ),
        expect(
            "Sending process 270 closing signal SIGTERM",
            severity="W",
            time="2024-04-10 16:02:56,193",
            clock="iso",
            kinds=("timestamp", "logger"),
        ),
    ),
    # (a) torchrun tee, (b) C++ global rank, (b') Python excepthook
    "tee-and-rank": (
        f"[default3]:[rank11]:{C10}{MSG}",
        expect(
            rank=11,
            local_rank=3,
            role="default",
            severity="E",
            time=C10_TIME,
            clock="c10",
            kinds=("tee", "tee", "header"),
        ),
    ),
    "rank-only": (
        f"[rank4]:{C10}{MSG}",
        expect(rank=4, severity="E", time=C10_TIME, clock="c10", kinds=("tee", "header")),
    ),
    "torchtitan-role-rank": (  # "--role rank --tee 3": the first [rankN]: is the local rank
        f"[rank0]:[rank8]:{C10}{MSG}",
        expect(
            rank=8,
            local_rank=0,
            role="rank",
            severity="E",
            time=C10_TIME,
            clock="c10",
            kinds=("tee", "tee", "header"),
        ),
    ),
    "excepthook": (
        "[rank0]: torch.distributed.DistBackendError: NCCL error",
        expect("torch.distributed.DistBackendError: NCCL error", rank=0, kinds=("excepthook",)),
    ),
    # (e) launchers and shippers
    "srun-label": (
        f"12: [rank12]:{C10}{MSG}",
        expect(
            rank=12, severity="E", time=C10_TIME, clock="c10", kinds=("launcher", "tee", "header")
        ),
    ),
    "ray": (
        f"(RayWorkerWrapper pid=4009, ip=10.0.0.7) {MSG}",
        expect(pid=4009, host="10.0.0.7", kinds=("launcher",)),
    ),
    "determined": ("fa88a9df [rank=1] || " + MSG, expect(rank=1, kinds=("jobsys",))),
    "viewer-line-number": (f"[1757] [rank3]:{MSG}", expect(rank=3, kinds=("viewer_line", "tee"))),
    "cat-n": (f"  1757\t[rank3]:{MSG}", expect(rank=3, kinds=("viewer_line", "tee"))),
    "markdown-quote": (f"> > [rank3]:{MSG}", expect(rank=3, kinds=("tee",))),
    "iso-shipper-then-c10": (  # the process's own clock wins over a shipper's
        f"2024-10-22T10:11:13.5Z [rank3]:{C10}{MSG}",
        expect(
            rank=3, severity="E", time=C10_TIME, clock="c10", kinds=("timestamp", "tee", "header")
        ),
    ),
    "iso-shipper-bracketed": (
        f"[2025-11-03 07:12:44] {MSG}",
        expect(time="2025-11-03 07:12:44", clock="iso", kinds=("timestamp",)),
    ),
    "hf-logging": (
        f"2023-09-07 09:14:40,098 - ERROR - __main__ - {MSG}",
        expect(
            severity="E", time="2023-09-07 09:14:40,098", clock="iso", kinds=("timestamp", "logger")
        ),
    ),
    "vllm": (
        f"INFO 02-03 13:14:04 llm_engine.py:706] {MSG}",
        expect(severity="I", time="02-03 13:14:04", clock="iso", kinds=("header",)),
    ),
    "progress-bar-glued": (
        f" 45%|████▌     | 450/1000 [10:00<12:13,  1.33s/it][rank3]:{C10}{MSG}",
        expect(rank=3, severity="E", time=C10_TIME, clock="c10", kinds=("lead", "tee", "header")),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_peel(case: tuple[str, dict[str, Any]]) -> None:
    text, expected = case
    assert anatomy(text) == expected


@pytest.mark.parametrize(
    "payload",
    [
        {
            "log": f"[default3]:[rank3]:{C10}{MSG}\n",
            "stream": "stderr",
            "time": "2024-10-22T10:11:13Z",
        },
        {"log": f"[default3]:[rank3]:{C10}{MSG}\r\n", "kubernetes": {"pod_name": "trainer-3"}},
        {"message": f"[default3]:[rank3]:{C10}{MSG}", "host": "trainer-3"},
    ],
    ids=["docker", "k8s", "shipper-message"],
)
def test_peel_json_log_lines(payload: dict[str, Any]) -> None:
    got = anatomy(json.dumps(payload))
    host = "trainer-3" if "kubernetes" in payload or "host" in payload else None
    assert got == expect(
        rank=3,
        local_rank=3,
        role="default",
        host=host,
        severity="E",
        time=C10_TIME,
        clock="c10",
        kinds=("json", "tee", "tee", "header"),
    )


def test_json_that_is_not_a_log_line_is_left_alone() -> None:
    assert anatomy('{"loss": 1.71, "epoch": 0.02}') == expect('{"loss": 1.71, "epoch": 0.02}')


def test_times_order_within_a_log() -> None:
    early = peel(Line("<t>", 1, f"[rank0]:[E1231 23:59:59.9 ProcessGroupNCCL.cpp:1] {MSG}"))
    c10 = peel(Line("<t>", 2, f"{C10}{MSG}"))
    glog = peel(Line("<t>", 3, f"E1022 10:11:12.623456 632355 ProcessGroupNCCL.cpp:737] {MSG}"))
    assert c10.ts is not None and glog.ts is not None and early.ts is not None
    assert glog.ts - c10.ts == pytest.approx(12.623456 - 12.123456789)
    assert early.ts > glog.ts


def test_to_seconds() -> None:
    assert to_seconds(1, 1, 0, 0, 0) == 0.0
    assert to_seconds(1, 2, 0, 0, 1, ".5") == 86401.5
    assert to_seconds(2, 29, 0, 0, 0) == 59 * 86400.0  # month/day only: a leap year
    assert to_seconds(13, 1, 0, 0, 0) is None
    assert to_seconds(2, 30, 0, 0, 0) is None


_LAYER_PIECES = [
    "[default3]:",
    "[rank3]:",
    "[rank3]: ",
    "[E1022 10:11:12.123456 ProcessGroupNCCL.cpp:632] ",
    "[E ProcessGroupNCCL.cpp:475] ",
    "E0517 08:24:03.805000 140617 api.py:826] ",
    "2024-03-14 05:13:20,402 ",
    "[2024-03-14T05:13:20Z] ",
    "[INFO|trainer.py:3478] 2024-03-14 05:13:20,402 >> ",
    "INFO 02-03 13:14:04 llm_engine.py:706] ",
    "WARNING:torch.distributed.run:",
    "torch.distributed.elastic: [ERROR] ",
    "- INFO - __main__ - ",
    "| INFO     | mod:fn:12 - ",
    "ERROR ",
    "(RayWorker pid=5304, ip=10.0.0.1) ",
    "fa88a9df [rank=1] || ",
    "12: ",
    "> ",
    "`",
    "   ",
    "[E1]:",
    "E",
    "[",
    "1",
    "x",
    "NCCL INFO ",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_LAYER_PIECES), min_size=1, max_size=5))
def test_the_layer_peeled_is_the_first_in_order_that_starts_there(pieces: list[str]) -> None:
    """One pattern finds which layer starts a text: the first of them, in the order peel tries
    them, whose own pattern matches there."""
    from nccl_triage.parse.anatomy import _ANY_LAYER, _LAYER_AT, _LAYER_RX

    text = "".join(pieces)
    first = next((i for i, rx in enumerate(_LAYER_RX) if rx.match(text)), None)
    found = _ANY_LAYER.match(text)
    assert (None if found is None else _LAYER_AT[found.lastindex or 0]) == first


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [*_LAYER_PIECES, "[rank1]:[E", "[W socket.cpp:1] ", "host:1:2 [0] ", "]", "V0", "0"]
        ),
        max_size=8,
    )
)
def test_the_cheap_test_never_misses_an_embedded_header(pieces: list[str]) -> None:
    """Wherever _EMBEDDED finds a header glued behind other text, the cheap test says so."""
    from nccl_triage.parse.anatomy import _EMBEDDED, _may_hide_header

    text = "".join(pieces)
    if _EMBEDDED.search(text):
        assert _may_hide_header(text)
