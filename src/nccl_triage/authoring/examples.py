"""Runs the examples embedded in rules: each must fire (``match``) or not (``no-match``).

An example's log is triaged with its flight-recorder dumps when it names some (``dumps:``);
a match must quote its ``evidence`` lines and say its ``advice`` parts.

Input: a :class:`Ruleset`. Output: one :class:`ExampleResult` per example, saying what was
expected and what fired. Backs ``tests/test_rule_examples.py`` and ``nccl-triage rules test``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_triage.diagnose.signals import SignalClassifier
from nccl_triage.model import Example, LineExample, Rule, Signal
from nccl_triage.parse.lines import peel_raw
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
    quoted: tuple[str, ...] = ()  # the lines the finding quotes (trigger first) when it fired

    @property
    def id(self) -> str:
        """``<rule-id>::<example-name>``."""
        return f"{self.rule.id}::{self.example.name}"


def run_example(rule: Rule, example: Example, ruleset: Ruleset) -> ExampleResult:
    """Triage one example with the whole ruleset and check the rule's expectation."""
    dumps = example.dumps or None
    if example.file is not None:
        report = triage_path(example.file, ruleset, dumps=dumps)
    else:
        name = f"{rule.id}::{example.name}"
        report = triage_text(example.log or "", ruleset, source=name, dumps=dumps)
    problems = report.flight_recorder.problems if report.flight_recorder is not None else ()
    if problems:  # an example's dumps must all be read: a broken one is the example's failure
        return ExampleResult(rule, example, False, [], f"dumps: {problems[0]}", problems[0])
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
            quoted = tuple(ev.text for ev in (finding.trigger, *finding.evidence))
            missing = [part for part in example.evidence if not any(part in q for q in quoted)]
            if missing:
                message = (
                    f"{rule.id} fired but does not quote {missing[0]!r}; it quotes: "
                    + " | ".join(q[:100] for q in quoted)
                )
                return ExampleResult(rule, example, False, fired, message, why, advice, quoted)
            unsaid = [part for part in example.advice if part not in advice]
            if unsaid:
                message = f"{rule.id} fired but its advice does not say {unsaid[0]!r}"
                return ExampleResult(rule, example, False, fired, message, why, advice, quoted)
            return ExampleResult(rule, example, True, fired, message, why, advice, quoted)
    else:
        message = (
            f"expected {rule.id} to {'fire' if want else 'stay silent'}, "
            f"but it {'fired' if did else 'did not'} ({why}); fired: {', '.join(fired) or 'nothing'}"
        )
    return ExampleResult(rule, example, did == want, fired, message, why, advice)


def run_examples(ruleset: Ruleset) -> list[ExampleResult]:
    """Run every example of every rule."""
    return [run_example(rule, ex, ruleset) for rule in ruleset.rules for ex in rule.examples]


@dataclass
class LineExampleResult:
    """The outcome of one example line of a signal."""

    signal: Signal
    example: LineExample
    passed: bool
    matched: str | None  # the pattern that recognised the line, or None

    @property
    def id(self) -> str:
        """``<signal-id>::<line>`` (the line cut short)."""
        return f"{self.signal.id}::{self.example.line[:60]}"

    @property
    def message(self) -> str:
        """What went wrong, for people."""
        if self.passed:
            return "ok"
        if self.example.expect == "match":
            return f"{self.signal.id} does not recognise: {self.example.line}"
        return (
            f"{self.signal.id} recognises (pattern {self.matched}) a near-miss: {self.example.line}"
        )


def run_line_example(signal: Signal, example: LineExample) -> LineExampleResult:
    """Classify one example line with its signal alone and check the expectation."""
    classifier = SignalClassifier([signal])
    matched = None
    for seg in peel_raw(example.source.source, example.source.line, example.line.encode()):
        started = classifier.feed(seg)
        if started:
            matched = str(started[0].detail.get("pattern"))
    passed = (matched is not None) == (example.expect == "match")
    return LineExampleResult(signal, example, passed, matched)


def run_line_examples(signals: list[Signal]) -> list[LineExampleResult]:
    """Run every example line of every signal."""
    return [run_line_example(sig, ex) for sig in signals for ex in sig.examples]
