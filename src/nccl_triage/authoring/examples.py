"""Runs the examples embedded in rules: each must fire (``match``) or not (``no-match``).

Input: a :class:`Ruleset`. Output: one :class:`ExampleResult` per example, saying what was
expected and what fired. Backs ``tests/test_rule_examples.py`` and ``nccl-triage rules test``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_triage.model import Example, Rule
from nccl_triage.pipeline import triage_path, triage_text
from nccl_triage.render.advice import render_advice
from nccl_triage.ruleset import Ruleset


@dataclass
class ExampleResult:
    """The outcome of one example."""

    rule: Rule
    example: Example
    passed: bool
    fired: list[str]  # ids of the rules that fired on the example
    message: str
    reason: str = ""  # why the rule did or did not fire (the engine's explanation)
    advice: str | None = None  # the advice, rendered when the rule fired

    @property
    def id(self) -> str:
        """``<rule-id>::<example-name>``."""
        return f"{self.rule.id}::{self.example.name}"


def run_example(rule: Rule, example: Example, ruleset: Ruleset) -> ExampleResult:
    """Triage one example with the whole ruleset and check the rule's expectation."""
    if example.file is not None:
        report = triage_path(example.file, ruleset)
    else:
        report = triage_text(example.log or "", ruleset, source=f"{rule.id}::{example.name}")
    assert report.correlation is not None
    fired = [e.rule.id for e in report.correlation.explanations if e.fired]
    did = rule.id in fired
    want = example.expect == "match"
    why = next((e.reason for e in report.correlation.explanations if e.rule.id == rule.id), "")
    if report.verdict == "clean":
        why = "the example holds no NCCL failure"
    advice = None
    if did == want:
        message = "ok"
        if did:  # the advice must render on every matching example
            finding = next(
                e.finding for e in report.correlation.explanations if e.rule.id == rule.id
            )
            assert finding is not None
            advice = render_advice(finding, report.facts, ruleset.template_dirs)
    else:
        message = (
            f"expected {rule.id} to {'fire' if want else 'stay silent'}, "
            f"but it {'fired' if did else 'did not'} ({why}); fired: {', '.join(fired) or 'nothing'}"
        )
    return ExampleResult(rule, example, did == want, fired, message, why, advice)


def run_examples(ruleset: Ruleset) -> list[ExampleResult]:
    """Run every example of every rule."""
    return [run_example(rule, ex, ruleset) for rule in ruleset.rules for ex in rule.examples]
