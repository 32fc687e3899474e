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
    with pytest.raises(TemplateError, match="steps"):
        render_advice(finding, facts, dirs)


def test_huge_values_are_refused(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(tmp_path, "{{ 'a' * 10**9 }}")
    with pytest.raises(TemplateError, match="too large"):
        render_advice(finding, facts, dirs)


def test_huge_method_arguments_are_refused(tmp_path: Path) -> None:
    finding, facts, dirs = finding_with_template(tmp_path, "{{ 'x'.ljust(10**8) | length }}")
    with pytest.raises(TemplateError, match="too large"):
        render_advice(finding, facts, dirs)


# Templates that would exhaust memory, time or the terminal if the sandbox only checked the
# values templates return: each must fail alone, quickly, with the reason.
HOSTILE = {
    "list-doubling-by-extend": (
        "{% set x = [1] %}{% for i in range(100000) %}{% set _ = x.extend(x) %}{% endfor %}",
        "unsafe|not safely|sandbox",
    ),
    "list-append": ("{% set x = [] %}{{ x.append(1) }}", "unsafe|not safely|sandbox"),
    "dict-update": ("{% set d = {} %}{{ d.update(a=1) }}", "unsafe|not safely|sandbox"),
    "percent-width": ("{{ '%0500000000d' % 1 }}", "format width"),
    "percent-star-width": ("{{ '%*d' % (500000000, 1) }}", r"\* width"),
    "percent-precision": ("{{ '%.500000000f' % 1.0 }}", "format width"),
    "format-filter-width": ("{{ '%0500000000d' | format(1) }}", "format width"),
    "brace-format-width": ("{{ '{:500000000}'.format(1) }}", "format width"),
    "center-filter": ("{{ 'a' | center(500000000) }}", "width too large"),
    "indent-filter": ("{{ ('a\n' * 400000) | indent(100) }}", "too large"),
    "replace-empty": ("{{ ('a' * 900000).replace('', 'bb') | length }}", "too large"),
    "replace-filter": ("{{ ('a' * 900000) | replace('a', 'bbbb') | length }}", "too large"),
    "join-of-big-parts": (
        "{{ ([('a' * 900000)] * 1) | join('x') }}{{ [('a' * 600000), ('a' * 600000)] | join }}",
        "too large|longer than",
    ),
    "tilde-join": (
        "{% set x = 'a' * 600000 %}{% set y = x ~ x %}{{ y | length }}",
        "longer than|too large",
    ),
    "set-block-join": (
        "{% set x = 'a' * 600000 %}{% set y %}{{ x }}{{ x }}{% endset %}{{ y | length }}",
        "longer than|too large",
    ),
    "list-of-big-strings": ("{{ [('a' * 500000)] * 100 }}", "too large"),
    "output-flood": ("{% for i in range(1000) %}{{ 'a' * 1000 }}{% endfor %}", "KiB"),
    "string-iteration": (
        "{% for c in 'a' * 900000 %}{% for d in 'b' * 900000 %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "exponential-macro": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
        "steps|longer than|KiB",
    ),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion|steps"),
    "no-lipsum": ("{{ lipsum(100000) }}", "undefined"),
    "exponent": ("{{ 10 ** 100000000 }}", "exponent"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_templates_fail_alone_and_quickly(tmp_path: Path, name: str) -> None:
    body, reason = HOSTILE[name]
    finding, facts, dirs = finding_with_template(tmp_path, body)
    with pytest.raises(TemplateError, match=reason):
        render_advice(finding, facts, dirs)


def test_a_failing_template_costs_only_its_own_advice(tmp_path: Path) -> None:
    from nccl_triage.render.report import render_json_line, render_text

    finding, _facts, dirs = finding_with_template(
        tmp_path, "line one\n{{ trigger.no_such_field }}\n"
    )
    rs = load_ruleset()
    report = triage_text(LOG, rs)
    text = render_text(report, dirs)
    assert "Watchdog caught collective operation timeout" in text  # the evidence still prints
    assert "Advice not rendered" in text
    assert f"{tmp_path / finding.rule.advice}:2" in text  # the template's file:line
    assert "trigger.{" in text and "timeout_ms" in text  # what it may use
    assert "facts.{" in text
    assert "Advice not rendered" in render_json_line(report, dirs)


def test_the_two_hostile_templates_of_the_report_stay_small(tmp_path: Path) -> None:
    """The whole CLI, with a team's hostile template: under 200 MB, under 1 MB of output."""
    import subprocess
    import sys

    log = tmp_path / "job.log"
    log.write_text(LOG, encoding="utf-8")
    for name, body in (
        ("extend", HOSTILE["list-doubling-by-extend"][0]),
        ("width", HOSTILE["percent-width"][0]),
        ("flood", HOSTILE["output-flood"][0]),
    ):
        team = tmp_path / name
        (team / "templates").mkdir(parents=True)
        (team / "templates" / "timeout-too-short.md.j2").write_text(body, encoding="utf-8")
        code = (
            "import re, sys\n"
            "from nccl_triage.cli import main\n"
            "try:\n"
            "    main(['triage', '--rules', sys.argv[1], sys.argv[2]])\n"
            "except SystemExit as e:\n"
            "    code = e.code\n"
            # VmHWM: this process's own peak (ru_maxrss would carry pytest's over exec)
            "status = open('/proc/self/status').read()\n"
            "sys.stderr.write(re.search(r'VmHWM:\\s*(\\d+)', status)[1])\n"
            "sys.exit(code)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(team), str(log)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert len(proc.stdout) < 1_000_000
        out = proc.stdout.decode()
        assert out.startswith(f"{log}: nccl_timeout"), out[:500]
        assert "Advice not rendered" in out, (name, out[-1500:])
        peak_kib = int(proc.stderr.decode().strip().splitlines()[-1])
        assert peak_kib < 200 * 1024, (name, peak_kib)


def test_no_builtin_advice_shows_a_missing_number() -> None:
    """A value a line does not show is left out of the advice, not printed as "?"."""
    import re

    rs = load_ruleset()
    missing = re.compile(r"\b(?:for|after|of|at least|about) \?(?=\W)")
    checked = 0
    for rule in rs.rules:
        for ex in rule.examples:
            if ex.expect != "match" or not ex.log:
                continue
            report = triage_text(ex.log, rs)
            for finding in report.findings:
                if finding.rule.id != rule.id:
                    continue
                text = render_advice(finding, report.facts, rs.template_dirs)
                assert not missing.search(text), (rule.id, ex.name, text)
                checked += 1
    assert checked > 40
