"""The library API of ``import nccl_triage``: what notebooks and scripts call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nccl_triage
from conftest import FIXTURES

LORA = FIXTURES / "lora-oom-hidden-by-timeout.log"


def test_triage_a_path_a_text_and_a_job() -> None:
    by_path = nccl_triage.triage(LORA)
    assert by_path.verdict == "nccl_timeout"
    assert by_path.findings[0].rule.cause == "oom_hidden"
    by_text = nccl_triage.triage(LORA.read_text(encoding="utf-8"))
    assert [f.rule.id for f in by_text.findings] == [f.rule.id for f in by_path.findings]
    job = nccl_triage.triage([LORA, FIXTURES / "two-node-wrong-ifname.log"])
    assert job.verdict == "nccl_timeout" and job.findings


def test_rules_as_a_ruleset_or_directories(tmp_path: Path) -> None:
    rules = nccl_triage.load_ruleset(only=["oom-behind-timeout"])
    report = nccl_triage.triage(LORA, rules=rules)
    assert [f.rule.id for f in report.findings] == ["oom-behind-timeout"]
    assert isinstance(rules, nccl_triage.Ruleset)
    assert isinstance(report, nccl_triage.Report)


def test_batch_gives_a_table(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(LORA.read_bytes())
    (tmp_path / "b.log").write_text("all good\n", encoding="utf-8")
    table = nccl_triage.triage_batch([tmp_path], workers=1)
    assert sorted(table["verdict"]) == ["clean", "nccl_timeout"]


def test_importing_the_package_imports_nothing_heavy() -> None:
    code = (
        "import sys, nccl_triage; "
        "print(sorted(m for m in ('lark', 'pandas', 'jinja2', 'yaml', 'click') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
