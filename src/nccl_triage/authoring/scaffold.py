"""``rules new``: the files of a new rule that lint and test clean at once.

Input: a rule id, a cause, a severity and a directory. Output: the rule, its signal, its
advice template and examples, written with placeholders that lint reports until filled in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from nccl_triage.authoring.lint import PLACEHOLDER
from nccl_triage.errors import TriageError
from nccl_triage.model.causes import CAUSES
from nccl_triage.ruleset import builtin_dirs, collect_ruleset
from nccl_triage.ruleset.shapes import (
    EVENT_KINDS,
    SHAPES,
)

# ----------------------------------------------------------------------------- new


@dataclass
class Scaffold:
    """The files ``rules new`` wrote."""

    rule: Path
    signal: Path
    template: Path
    notices: list[str]

    @property
    def paths(self) -> list[Path]:
        """Every file written."""
        return [self.rule, self.signal, self.template]


_TIMEOUT_LINE = (
    "[rank0]:[E502 10:30:02.433063423 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600088 milliseconds before timing out."
)
_STUB_LINE = f"{PLACEHOLDER}: replace with the log line that shows the failure"


def scaffold(
    rule_id: str,
    cause: str,
    directory: str | Path = ".",
    severity: str = "high",
    force: bool = False,
) -> Scaffold:
    """Write a new rule, its signal and its advice template, with examples that pass at once.

    Raises:
        TriageError: a bad id or cause, or a file that exists (without ``force``).
    """
    rule_shape, signal_shape = SHAPES["rule"], SHAPES["signal"]
    if not re.match(rule_shape.key("id").pattern, rule_id):
        raise TriageError(
            "rules new", f"id '{rule_id}' must be kebab-case: lowercase words joined by '-'"
        )
    if cause not in CAUSES:
        raise TriageError(
            "rules new", f"cause '{cause}' is not in docs/causes.md ({', '.join(CAUSES)})"
        )
    severities = rule_shape.key("severity").values
    if severity not in severities:
        raise TriageError(
            "rules new", f"severity '{severity}' (expected one of: {', '.join(severities)})"
        )
    signal_id = rule_id.replace("-", "_")
    if not re.match(signal_shape.key("id").pattern, signal_id):  # pragma: no cover - same charset
        raise TriageError("rules new", f"cannot name a signal after '{rule_id}'")
    root = Path(directory)
    builtin_rules, builtin_templates = builtin_dirs()
    is_builtin = root.resolve() == builtin_rules.resolve()
    rule_path = root / f"{rule_id}.yaml"
    signal_path = root / "signals" / f"{signal_id}.yaml"
    template_dir = builtin_templates if is_builtin else root / "templates"
    template_path = template_dir / f"{rule_id}.md.j2"
    notices: list[str] = []
    builtin_ruleset, _ = collect_ruleset((), builtin=True)
    if not is_builtin:
        if builtin_ruleset.rule(rule_id) is not None:
            notices.append(f"rule '{rule_id}' will replace the built-in rule of that id")
        if any(s.id == signal_id for s in builtin_ruleset.signals) or signal_id in EVENT_KINDS:
            raise TriageError(
                "rules new",
                f"'{signal_id}' is already a built-in signal or event: choose another id",
            )
    existing = [p for p in (rule_path, signal_path, template_path) if p.exists()]
    if existing and not force:
        raise TriageError(
            "rules new", f"{', '.join(map(str, existing))} exists already (--force overwrites)"
        )
    signal_path.parent.mkdir(parents=True, exist_ok=True)
    template_path.parent.mkdir(parents=True, exist_ok=True)
    rule_path.write_text(_rule_stub(rule_id, cause, severity, signal_id), encoding="utf-8")
    signal_path.write_text(_signal_stub(signal_id), encoding="utf-8")
    template_path.write_text(_template_stub(), encoding="utf-8")
    return Scaffold(rule_path, signal_path, template_path, notices)


def _rule_stub(rule_id: str, cause: str, severity: str, signal_id: str) -> str:
    return f"""\
# A rule for nccl-triage: CONTRIBUTING.md ("Writing a rule") explains every key.
# Fill in each {PLACEHOLDER}, then: nccl-triage rules lint DIR && nccl-triage rules test DIR
id: {rule_id}
title: "{PLACEHOLDER}: one line saying what went wrong"
cause: {cause}
severity: {severity}
confidence: 0.7
owner: "{PLACEHOLDER}: your team"
description: >
  {PLACEHOLDER}: what happens, why the other ranks time out, and how the log shows it.
match:
  event: watchdog_timeout
context:
  - event: {signal_id}  # signals/{signal_id}.yaml
    within: {{lines: 5000, seconds: 3600}}
    direction: before
advice: {rule_id}.md.j2
references:
  - "https://example.org/{PLACEHOLDER}-your-runbook"
examples:
  - name: failure-then-timeout
    expect: match
    evidence:  # part of each line the finding must quote: the trigger, then the evidence
      - "Watchdog caught collective operation timeout"
      - "{_STUB_LINE}"
    log: |
      {_STUB_LINE}
      {_TIMEOUT_LINE}
  - name: timeout-alone
    expect: no-match
    log: |
      {_TIMEOUT_LINE}
"""


def _signal_stub(signal_id: str) -> str:
    return f"""\
# Lines that show the failure. Patterns are RE2 (no backreferences, no lookarounds); only lines
# holding one of a pattern's anchors (literal phrases every match contains) are tried.
id: {signal_id}
description: "{PLACEHOLDER}: what these lines mean"
patterns:
  - name: {signal_id.replace("_", "-")}
    regex: '{PLACEHOLDER}: replace with the log line'
    anchors: ["{PLACEHOLDER}: replace with"]
"""


def _template_stub() -> str:
    return f"""\
{{# Advice in Markdown. Variables: rule, finding, trigger, evidence (one per context clause
   that must be present, in order), facts. Filters: ms, seconds, bytes, num. #}}
{{% set hit = evidence[0] %}}
{{% include "_timeout.md.j2" %}}

{PLACEHOLDER}: say what happened. The log shows it on {{% if hit.rank is not none %}}rank {{{{ hit.rank }}}}{{% else %}}one rank{{% endif %}} at line {{{{ hit.line }}}} (`{{{{ hit.text[:120] }}}}`), {{{{ hit.gap_lines }}}} lines before the timeout.

What to do:
- {PLACEHOLDER}: the first thing to try.
"""
