"""The five situations users report most, end to end: the right cause first, with evidence and advice."""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_triage.pipeline import triage_path
from nccl_triage.render.advice import render_advice
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import load_ruleset

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
RULESET = load_ruleset()

CASES = {
    # (fixture, cause first, line of the key evidence, text the advice must contain)
    "fsdp-mixtral-save-allgather-timeout.log": (
        "slow_checkpoint_save",
        7,
        ["30 min", "--ddp_timeout 3600", "local rank 0", "1.8 GiB"],
    ),
    "ddp-sft-safetensors-save-timeout.log": ("slow_checkpoint_save", 4, ["30 min", "1-3"]),
    "zero3-generate-inference-timeout.log": (
        "generate_zero3",
        8,
        ["synced_gpus=True", "12 h", "939,524,096"],
    ),
    "lora-oom-hidden-by-timeout.log": ("oom_hidden", 10, ["rank 2", "rank 0 as the first to die"]),
    "two-node-wrong-ifname.log": (
        "network_interface_misconfig",
        7,
        ["NCCL_SOCKET_IFNAME", "ip -brief addr"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_names_the_cause_with_evidence_and_advice(name: str) -> None:
    cause, evidence_line, advice_bits = CASES[name]
    report = triage_path(str(FIXTURES / name), RULESET)
    assert report.verdict == "nccl_timeout"
    top = report.findings[0]
    assert top.rule.cause == cause
    assert evidence_line in [e.line for e in top.evidence]
    advice = render_advice(top, report.facts, RULESET.template_dirs)
    for bit in advice_bits:
        assert bit in advice, (bit, advice)


def test_json_report_follows_the_spec() -> None:
    report = triage_path(str(FIXTURES / "ddp-sft-safetensors-save-timeout.log"), RULESET)
    data = report_json(report, RULESET.template_dirs)
    assert data["schema"] == "nccl-triage/1.1"
    assert data["verdict"] == "nccl_timeout"
    diag = data["diagnoses"][0]
    assert {"rule", "cause", "severity", "confidence", "title", "evidence", "advice"} <= set(diag)
    assert all({"line", "rank", "text"} == set(e) for e in diag["evidence"])
    timeouts = [e for e in data["events"] if e["kind"] == "watchdog_timeout"]
    assert [e["rank"] for e in timeouts] == [1, 2, 3]
    assert timeouts[0]["op_type"] == "_ALLGATHER_BASE" and timeouts[0]["timeout_ms"] == 1800000
    assert data["summary"]["ranks_timed_out"] == [1, 2, 3]
    assert data["summary"]["first_timeout_line"] == 6


def test_signal_patterns_without_anchors_or_ignoring_case_fire(tmp_path: Path) -> None:
    from nccl_triage.pipeline import triage_text

    (tmp_path / "signals").mkdir()
    (tmp_path / "signals" / "uploader.yaml").write_text(
        "id: uploader\ndescription: team uploader\nignore_case: true\n"
        "patterns:\n  - name: stall\n    regex: 'S3-SYNC: upload stalled'\n",
        encoding="utf-8",
    )
    rules = load_ruleset([tmp_path])
    log = (
        "s3-sync: Upload Stalled after 120 s\n"
        "[E ProcessGroupNCCL.cpp:464] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800917 milliseconds "
        "before timing out.\n"
    )
    report = triage_text(log, rules)
    context = ("progress", "last_output")  # what the window around the failure adds
    assert [s.kind for s in report.signals if s.kind not in context] == ["uploader"]
