"""The reference documents in docs/ are the code's own, and the JSON report documents itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from nccl_triage.cli import main
from nccl_triage.model.causes import CAUSES
from nccl_triage.model.fields import KIND_FIELDS, fields_of
from nccl_triage.pipeline import triage_path
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import load_ruleset

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "causes": "causes.md",
    "json-output": "json-output.md",
    "log-formats": "log-formats.md",
    "rules": "rules.md",
    "rule-schema": "rule-schema.json",
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_document_is_the_one_the_code_prints(name: str) -> None:
    """After a change: nccl-triage docs NAME > docs/FILE."""
    result = CliRunner().invoke(main, ["docs", name])
    assert result.exit_code == 0
    assert result.stdout == (ROOT / "docs" / FILES[name]).read_text("utf-8")


def test_every_cause_has_its_section_and_every_rule_its_cause() -> None:
    text = (ROOT / "docs" / "causes.md").read_text("utf-8")
    for cause in CAUSES:
        assert f"\n## {cause}\n" in text
    for rule in load_ruleset().rules:
        assert f"`{rule.id}`" in text


def _keys(value: object, out: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if not k.isdigit():  # per-rank maps (facts.last_seq) are keyed by rank
                out.add(k)
            _keys(v, out)
    elif isinstance(value, list):
        for v in value:
            _keys(v, out)


def test_every_field_of_real_reports_is_documented() -> None:
    ruleset = load_ruleset()
    doc = (ROOT / "docs" / "json-output.md").read_text("utf-8")
    documented = set(re.findall(r"`([a-z_][a-z0-9_]*)`", doc))
    logs = sorted((ROOT / "fixtures" / "logs").glob("*.log"))
    logs += sorted((ROOT / "tests" / "corpus").glob("*/*.log"))
    seen: set[str] = set()
    for log in logs:
        _keys(report_json(triage_path(str(log), ruleset), ruleset.template_dirs), seen)
    fr = ROOT / "tests" / "data" / "fr"
    for scenario in sorted(p for p in fr.iterdir() if p.is_dir()):  # with dumps: every field
        report = triage_path(str(logs[0]), ruleset, dumps=[str(scenario)])
        _keys(report_json(report, ruleset.template_dirs), seen)
    # signal events carry their patterns' named groups: documented with the signal files
    signal_groups = {
        g for s in ruleset.signals for p in s.patterns for g in re.findall(r"\(\?P<(\w+)>", p.regex)
    }
    missing = sorted(seen - documented - signal_groups - {"pattern", "count", "last_line"})
    assert missing == [], f"fields not in docs/json-output.md: {missing}"


def test_every_event_carries_only_the_fields_its_kind_declares() -> None:
    """Rules may test only declared fields: a field the grammar sets but no kind declares would
    be invisible to ``rules lint`` and undocumented."""
    ruleset = load_ruleset()
    logs = sorted((ROOT / "fixtures" / "logs").glob("*.log"))
    logs += sorted((ROOT / "tests" / "corpus").glob("*/*.log"))
    logs += sorted((ROOT.parent / "shared" / "corpus").glob("*.log"))
    undeclared: set[tuple[str, str]] = set()
    for log in logs:
        for ev in triage_path(str(log), ruleset).events:
            if ev.kind in KIND_FIELDS:
                undeclared |= {(ev.kind, k) for k in ev.detail if k not in fields_of(ev.kind)}
    assert undeclared == set()


def test_the_help_and_the_guides_point_to_the_documents() -> None:
    assert "docs/causes.md" in CliRunner().invoke(main, ["--help"]).stdout
    for guide in ("README.md", "CONTRIBUTING.md"):
        text = (ROOT / guide).read_text("utf-8")
        assert "docs/causes.md" in text and "docs/json-output.md" in text, guide
        assert "docs/log-formats.md" in text, guide
    assert json.loads((ROOT / "docs" / "rule-schema.json").read_text("utf-8"))


def test_the_readme_shows_what_its_first_command_prints() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    shown = readme.split("What the first command prints:\n\n```\n", 1)[1].split("```", 1)[0]
    result = CliRunner().invoke(
        main, ["triage", "--no-color", str(ROOT / "fixtures/logs/lora-oom-hidden-by-timeout.log")]
    )
    assert result.stdout.replace(str(ROOT) + "/", "") == shown
