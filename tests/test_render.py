"""Advice templates render in Jinja's sandbox with StrictUndefined."""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_triage.errors import TemplateError
from nccl_triage.pipeline import triage_text
from nccl_triage.render.advice import human_bytes, human_ms, render_advice
from nccl_triage.ruleset import load_ruleset

LOG = (
    "[E ProcessGroupNCCL.cpp:464] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=10000) ran for 10917 milliseconds before timing out.\n"
)


def finding_with_template(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    rs = load_ruleset()
    report = triage_text(LOG, rs)
    finding = report.findings[0]
    (tmp_path / finding.rule.advice).write_text(body, encoding="utf-8")
    return finding, report.facts, [tmp_path]


def test_hostile_template_is_refused_by_the_sandbox(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(
        tmp_path, "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    )
    with pytest.raises(TemplateError, match=r"sandbox|undefined"):
        render_advice(finding, facts, dirs)


def test_misspelt_variable_is_an_error_not_an_empty_string(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(tmp_path, "{{ triger.rank }}")
    with pytest.raises(TemplateError, match="undefined"):
        render_advice(finding, facts, dirs)


def test_builtin_advice_names_the_numbers() -> None:
    rs = load_ruleset()
    report = triage_text(LOG, rs)
    text = render_advice(report.findings[0], report.facts, rs.template_dirs)
    assert "10.9 s" in text and "10.0 s" in text


def test_human_units() -> None:
    assert human_ms(1_800_000) == "30 min"
    assert human_ms(600_061) == "10.0 min"
    assert human_ms(43_200_000) == "12 h"
    assert human_bytes(2 * 1024**3) == "2.0 GiB"


def test_runaway_loops_are_stopped(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(
        tmp_path,
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    )
    with pytest.raises(TemplateError, match="iterations"):
        render_advice(finding, facts, dirs)


def test_huge_values_are_refused(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(tmp_path, "{{ 'a' * 10**9 }}")
    with pytest.raises(TemplateError, match="too large"):
        render_advice(finding, facts, dirs)


def test_huge_method_arguments_are_refused(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(tmp_path, "{{ 'x'.ljust(10**8) | length }}")
    with pytest.raises(TemplateError, match="too large"):
        render_advice(finding, facts, dirs)
