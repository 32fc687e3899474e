"""Lines of one shape (the same line but for its digits) are read once and the rest filled in:
the reports are those of reading every line in full."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl_triage import pipeline
from nccl_triage.diagnose.signals import digit_blind
from nccl_triage.model import Report
from nccl_triage.pipeline import triage_text
from nccl_triage.ruleset import load_ruleset

RULESET = load_ruleset()

# Signal lines of real families (and near-misses), "D" a run of digits, "R" a rank.
TEMPLATES = [
    "{'loss': D.D, 'grad_norm': D.D, 'learning_rate': D.De-0D, 'epoch': D.D}",
    "[defaultR]:{'loss': D.D, 'grad_norm': D.D, 'epoch': D.D}",
    (
        "[defaultR]:  D%|#         | D/D [D:D<D:D,  D.Ds/it]\r  D%|#  | D/D [D:D<D:D, D.Dit/s]\r"
        "{'loss': D.D, 'epoch': D.D}"
    ),
    "[defaultR]:\r  D%|#  | D/D\r{'eval_loss': D.D, 'epoch': D.D}",
    "[rankR]:[2024-10-2D 1D:0D:D,D] Saving model checkpoint to /ckpt/checkpoint-D",
    "[defaultR]:[INFO|trainer.py:D] 2024-03-1D 0D:1D:2D,D >> Saving model checkpoint to /o/D",
    (
        "W1022 10:0D:D.D D site-packages/torch/distributed/elastic/multiprocessing/api.py:D] "
        "failed (exitcode: -D) local_rank: R (pid: D) of binary: /usr/bin/python3"
    ),
    "Process D exit code 13D Signal D (SIGKILL)",
    "NVRM: Xid (PCI:0000:D:00): D, pid=D, name=python, Ch 0000000D",
    "[defaultR]:Train Epoch: D [D/D (D%)]\tLoss: D.D",
    " iteration      D/   D | consumed samples: D | lm loss: D.DE+00 |",
    "[2022-12-21 10:42:D,D] [INFO] [logging.py:D:log_dist] [Rank R] step=D, skipped=D, lr=[D.D]",
    "[defaultR]:zero_optimization stage D offload stage3_param_persistence_threshold",
    "host:D:D [R] NCCL INFO Channel D/D : D[D] -> D[D] via P2P/IPC/read",
    '{"log": "Saving model checkpoint to /x/D", "host": "node-D"}',
    "{\"msg\": \"{'loss': D.D, 'epoch': D.D}\"}",
    "[defaultR]:step D done in D.D s",
    # lines that are no rank's own output (a traceback), and one whose digits decide it
    (
        '[defaultR]:  File "/usr/local/lib/python3.8/dist-packages/deepspeed/runtime/engine.py", '
        "line D, in _configure_distributed_model"
    ),
    (
        "(RayWorkerVllm pid=D) frame #D: c10::Error::Error(c10::SourceLocation, std::string) + "
        "DxD (DxDfdc6810f617 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)"
    ),
    # patterns whose digits decide (their anchors hold none)
    "[D.D] Xid 7D detected on GPU 0000:D:00.0",
    "Average Precision (AP) @[ IoU=0.50:0.95 ] mAP@.D = 0.D",
    "host:D:D [R] NCCL WARN Cuda failure 99D 'unknown error'",
    "host:D:D [R] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.D<0> [1]lo:12D.0.0.1<0>",
]
FAILURE = (
    "[rankR]:[E10D 10:1D:D.D ProcessGroupNCCL.cpp:632] [Rank R] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=D, OpType=ALLREDUCE, NumelIn=D, NumelOut=D, "
    "Timeout(ms)=600000) ran for 600D milliseconds before timing out."
)


@st.composite
def logs(draw: st.DrawFn) -> list[str]:
    """Lines of a few templates (so that shapes repeat), each with its own digits."""
    chosen = draw(st.lists(st.sampled_from([*TEMPLATES, FAILURE]), min_size=1, max_size=4))
    return draw(st.lists(line(st.sampled_from(chosen)), min_size=1, max_size=60))


@st.composite
def line(draw: st.DrawFn, templates: st.SearchStrategy[str]) -> str:
    template = draw(templates)
    out = []
    for ch in template:
        if ch == "D":
            # one digit (DD is two), so that shapes repeat and their digits differ
            out.append(draw(st.sampled_from("0123456789")))
        elif ch == "R":
            out.append(str(draw(st.integers(0, 3))))
        else:
            out.append(ch)
    return "".join(out)


def full(report: Report) -> tuple[object, ...]:
    return (
        report.verdict,
        [(f.rule.id, [repr(e) for e in f.evidence]) for f in report.findings],
        [repr(e) for e in report.events],
        [repr(e) for e in report.signals],
        report.facts,
    )


def assert_read_alike(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report of reading lines by their shape is the report of reading each in full."""
    by_shape = triage_text(text, RULESET)
    with monkeypatch.context() as m:
        m.setattr(pipeline, "SHAPE_BYTES", -1)
        each = triage_text(text, RULESET)
    assert full(by_shape) == full(each)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(log=logs(), gaps=st.lists(st.integers(0, 80)))
def test_lines_read_by_shape_give_the_report_of_reading_each(
    log: list[str], gaps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    text_lines = []
    for i, line in enumerate(log):
        text_lines.append(line)
        text_lines.extend(["plain output"] * (gaps[i] if i < len(gaps) else 0))
    text = "\n".join(text_lines) + "\n"
    by_shape = triage_text(text, RULESET)
    with monkeypatch.context() as m:
        m.setattr(pipeline, "SHAPE_BYTES", -1)  # every line read in full
        each = triage_text(text, RULESET)
    assert full(by_shape) == full(each)


# Lines whose digits decide whether a signal's pattern matches (its regex holds digits).
DIGITS_DECIDE = [
    "[12.5] Xid 7D detected on GPU 0000:3b:00.0",
    "Average Precision (AP) @[ IoU=0.50:0.95 ] mAP@.D = 0.41",
    "host:1:2 [0] NCCL WARN Cuda failure 99D 'unknown error'",
    "host:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.3<0> [1]lo:12D.0.0.1<0>",
    "Process 4 exit code 13D Signal 9 (SIGKILL)",
    "[default0]:failed (exitcode: -D) local_rank: 0 (pid: 51) of binary: python3",
    "[default1]:zero_optimization stage D offload",
    "[default0]:{'loss': 1.2, 'epoch': 0.D}",
]


@pytest.mark.parametrize("template", DIGITS_DECIDE)
def test_every_digit_is_read_where_it_decides(
    template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each digit in turn, and in reverse: a line of a shape seen before is still searched."""
    for order in ("0123456789", "9876543210"):
        text = "".join(template.replace("D", d) + "\n" for d in order)
        assert_read_alike(text, monkeypatch)


def test_digit_blind_patterns() -> None:
    assert digit_blind(r"\{'loss': -?[\d.]+(?:e-?\d+)?,")
    assert digit_blind(r"x{3}|\w{1,4}|[/-:]|\D")
    assert not digit_blind("exit code 137")
    assert not digit_blind(r"[0-5]")
    assert not digit_blind(r"\x30")
    assert not digit_blind(r"a\{3\}")


def _example_lines() -> list[str]:
    """Every example line of every signal (must match and must not), as the rules give them."""
    return sorted({ex.line for sig in RULESET.signals for ex in sig.examples})


@pytest.mark.parametrize("line", _example_lines())
def test_every_signal_example_with_other_digits_reads_alike(
    line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real lines of every signal, their digits changed at random (the same shape, other
    values), behind prefixes and alone, then a failure: read by shape, they give the report
    of reading each."""
    import random

    rng = random.Random(line)
    variants = []
    for prefix in ("", "[default1]:", "[rank3]:[2024-10-22 10:48:56,326] "):
        for _ in range(4):
            digits = "".join(rng.choice("0123456789") if c.isdigit() else c for c in line)
            variants.append(prefix + digits)
    # and a failure after them: its window reads them again (what each rank printed last)
    failure = FAILURE.replace("R", "1").replace("D", "7")
    text = "\n".join([*variants, failure]) + "\n"
    assert_read_alike(text, monkeypatch)


def test_shapes_are_given_up_where_they_do_not_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose signal lines are each of a new shape pauses shapes (learning each would cost
    more than it saves), then takes them up again; the report is the same throughout."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    lines = [
        f"[default{i % 4}]:Saving model checkpoint to /ckpt/{w}{v}/checkpoint-{i}"
        for i, (w, v) in enumerate((w, v) for v in words for w in words)
    ]
    lines += [f"[default0]:{{'loss': {i}.5, 'epoch': 0.{i}}}" for i in range(40)]
    text = "\n".join(lines) + "\n"
    learnt: list[int] = []
    learn = pipeline.Triage._learn_shape

    def counting(self: pipeline.Triage, inp: object, cand: object, key: bytes) -> bool:
        learnt.append(1)
        return learn(self, inp, cand, key)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(pipeline, "SHAPE_SAMPLE", 8)
        m.setattr(pipeline, "SHAPE_PAUSE", 20)
        m.setattr(pipeline, "SHAPES", 4)  # (a new ruleset's shapes: none learnt yet)
        m.setattr(pipeline.Triage, "_learn_shape", counting)
        by_shape = triage_text(text, RULESET)
        m.setattr(pipeline, "SHAPE_BYTES", -1)
        each = triage_text(text, RULESET)
    assert full(by_shape) == full(each)
    assert 0 < len(learnt) < 64  # paused for some of the 64 new shapes


def test_the_context_searches_are_blind_to_digits() -> None:
    """A window reads a shape's lines by what its first line's searches found (a failure's
    text; not a rank's own output): the searches must not tell the lines apart. Their regexes
    are blind to digits, and a shape holding a grammar anchor written with a digit is searched
    line by line."""
    from nccl_triage.diagnose.context import _NOT_OUTPUT, _NOT_OUTPUT_DIGITS

    assert not digit_blind(_NOT_OUTPUT.pattern)
    pattern = _NOT_OUTPUT.pattern
    for d in _NOT_OUTPUT_DIGITS:
        pattern = pattern.replace(d.decode(), "")
    assert digit_blind(pattern)
    assert pipeline._ANCHORS_BLIND
    assert b"raised from c00d::ProcessGroupNCCL::" in pipeline._DIGIT_ANCHORS


@pytest.mark.parametrize("first", ["0", "5"])
def test_a_digit_that_decides_what_a_rank_printed_is_read_in_every_line(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``12 0x1f ...`` is a frame of a backtrace, ``12 5x1f ...`` a rank's own output: lines of
    one shape that the context's searches tell apart are searched each."""
    other = "5" if first == "0" else "0"
    text = "".join(
        f"[default1]:12 {d}x1f Saving model checkpoint to /ckpt/{i}\n"
        for i, d in enumerate([first, other, first])
    )
    text += FAILURE.replace("R", "1").replace("D", "7") + "\n"
    assert_read_alike(text, monkeypatch)


@pytest.mark.parametrize("first", ["1", "2"])
def test_a_digit_that_decides_whether_the_grammar_reads_a_line(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``c10d`` is one of the grammar's anchors, ``c20d`` none: lines of one shape, one of them
    the grammar's, each read as reading it alone reads it."""
    other = "2" if first == "1" else "1"
    text = "".join(
        f"[rank0]:[E1022 10:11:1{i}.5 ProcessGroupNCCL.cpp:1] Exception raised from c{d}0d"
        f"::ProcessGroupNCCL::checkTimeout: Saving model checkpoint to /ckpt/{i}\n"
        for i, d in enumerate([first, other, first, other])
    )
    text += FAILURE.replace("R", "0").replace("D", "7") + "\n"
    assert_read_alike(text, monkeypatch)
