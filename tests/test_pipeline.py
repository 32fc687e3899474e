"""The pipeline reads only the segments of a redrawn line that hold an anchor: the report is
the one reading every segment gives, on random logs of progress bars, losses and failures and
on a generated torchrun log."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl_triage import pipeline
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
