"""The pipeline reads only the segments of a redrawn line that hold an anchor: the report is
the one reading every segment gives, on random logs of progress bars, losses and failures and
on a generated torchrun log."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl_triage import pipeline
from nccl_triage.model import Report
from nccl_triage.pipeline import Triage
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import load_ruleset

RULES = load_ruleset()
BENCH = Path(__file__).resolve().parent.parent / "bench"


def report(data: bytes, every_segment: bool) -> str:
    with pytest.MonkeyPatch.context() as m:
        if every_segment:
            m.setattr(pipeline, "segment_bounds", lambda raw: None)
        triage = Triage(RULES, "<log>")
        for i in range(0, len(data), 4096):
            triage.feed(data[i : i + 4096])
        triage.close()
        return json.dumps(report_json(triage.report(), RULES.template_dirs), sort_keys=True)


SEGMENTS = [
    b"[default3]:",
    b"[rank1]:",
    b"  7%|\xe2\x96\x8b         | 7/100 [00:07<01:33,  1.00s/it]",
    b" 10%|#         | 10/100 [00:10<01:30,  1.00s/it]",
    b"{'loss': 3.9509, 'grad_norm': 1.56, 'learning_rate': 1.5e-06, 'epoch': 0.01}",
    b"{'eval_loss': 0.81, 'epoch': 1.0}",
    b"Saving model checkpoint to /ckpt/checkpoint-100",
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    b"gpu-node-1:4821:4903 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC/read",
    b"gpu-node-1:4821:4903 [1] NCCL WARN NET/IB : Got completion with error 12",
    b"[2024-10-22 10:07:47,900][train.py:412][INFO] rank=4 step=45 loss=3.93",
    (
        b"[E1022 10:11:12.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
        b"operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        b"Timeout(ms)=600000) ran for 600051 milliseconds before timing out."
    ),
    b"\x1b[31mNCCL WARN\x1b[0m colour",
    b"[0mplain",
    b"bad \xff byte",
    b"Generating train split: 45%|####5     | 450/1000 [00:04<00:05, 99.0 examples/s]",
    b"",
]


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=6), max_size=40))
    return b"\n".join(b"\r".join(parts) for parts in lines) + b"\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=logs())
def test_reading_the_anchored_segments_gives_the_same_report(data: bytes) -> None:
    assert report(data, every_segment=False) == report(data, every_segment=True)


def test_a_generated_torchrun_log_gives_the_same_report() -> None:
    spec = importlib.util.spec_from_file_location("gen_torchrun_log", BENCH / "gen_torchrun_log.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    data = "".join(gen.generate(3 << 20, 1)).encode()
    assert data.count(b"\r") > 1000  # redrawn bars, losses after them
    fast = report(data, every_segment=False)
    assert fast == report(data, every_segment=True)
    assert json.loads(fast)["verdict"] == "nccl_timeout"


def held_back_report(data: bytes, defer: int | None, before: int, after: int, step: int) -> str:
    """The reports with ``defer`` candidates held back from the long-range classifier (None:
    none ever, every line classified at once) and windows of ``before`` and ``after`` lines:
    one every ``step`` bytes (as the live analyser asks for them mid-stream; 0: none) and the
    final one, signal events included. Each run learns its line shapes afresh."""

    def shown(got: Report) -> list[Any]:
        signals = [e.to_dict() for e in got.signals]  # (the report's JSON shows few of them)
        return [report_json(got, RULES.template_dirs), signals]

    with pytest.MonkeyPatch.context() as m:
        shapes: dict[bytes, Any] = {}
        m.setattr(pipeline, "_shapes_of", lambda _ruleset: shapes)
        if defer is None:
            real_open = Triage.open

            def at_once(
                self: Triage, source: str | None = None, rank_hint: int | None = None
            ) -> None:
                real_open(self, source, rank_hint)
                for inp in self._inputs.values():
                    if not inp.signals.events and inp.deferred == []:
                        inp.deferred = None  # (before its first line)

            m.setattr(Triage, "open", at_once)
        else:
            m.setattr(pipeline, "DEFER_LINES", defer)
        m.setattr(pipeline, "CONTEXT_BEFORE", before)
        m.setattr(pipeline, "CONTEXT_AFTER", after)
        triage = Triage(RULES, "<log>")
        size = step or 4096
        reports = []
        for i in range(0, len(data), size):
            triage.feed(data[i : i + size])
            if step:
                reports.append(shown(triage.report()))
        triage.close()
        reports.append(shown(triage.report()))
        return json.dumps(reports, sort_keys=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=logs(),
    defer=st.sampled_from([3, 1_000_000]),
    before=st.sampled_from([2, 3000]),
    after=st.sampled_from([1, 300]),
    step=st.sampled_from([0, 97]),
)
def test_candidates_held_back_from_the_classifier_change_no_report(
    data: bytes, defer: int, before: int, after: int, step: int
) -> None:
    """An input's candidate lines may wait for the long-range signal classifier (until more
    than ``defer`` wait, a report is asked for, or the input ends) and be dropped when every
    one of them lies in the windows read: the report is the one of classifying each at once,
    whatever the windows (narrow: lines outside them between failures) and the reports asked
    for on the way."""
    expected = held_back_report(data, None, before, after, step)
    assert held_back_report(data, defer, before, after, step) == expected


def test_a_small_log_read_whole_by_its_window_needs_no_long_range_classification() -> None:
    """The saving itself: a log whose failure's window holds every line classifies none of
    them twice; a log without a failure classifies them all."""
    failing = b"\n".join([SEGMENTS[4]] * 20 + [SEGMENTS[11]]) + b"\n"
    clean = b"\n".join([SEGMENTS[4]] * 20) + b"\n"
    for data, classified in ((failing, False), (clean, True)):
        triage = Triage(RULES, "<log>")
        triage.feed(data)
        triage.close()
        assert bool(triage._input(None).signals.events) == classified


@given(
    linenos=st.lists(st.integers(0, 60), max_size=30),
    cuts=st.lists(st.integers(0, 70), max_size=8, unique=True),
)
def test_lines_within_the_windows_read(linenos: list[int], cuts: list[int]) -> None:
    """Whether a line lies in the windows read, as a search of every window says."""
    from nccl_triage.pipeline import _inside

    edges = sorted(cuts)
    ranges = [(edges[i], edges[i + 1]) for i in range(0, len(edges) - 1, 2)]  # sorted, disjoint
    inside = _inside(ranges)
    assert [inside(n) for n in linenos] == [any(lo <= n < hi for lo, hi in ranges) for n in linenos]
