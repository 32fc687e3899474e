"""Every rule's embedded examples: ``match`` must fire the rule, ``no-match`` must not."""

from __future__ import annotations

import pytest

from nccl_triage.authoring.examples import run_example, run_line_example
from nccl_triage.ruleset import load_ruleset

RULESET = load_ruleset()
CASES = [(rule, ex) for rule in RULESET.rules for ex in rule.examples]


@pytest.mark.parametrize(("rule", "example"), CASES, ids=[f"{r.id}::{e.name}" for r, e in CASES])
def test_rule_example(rule, example) -> None:
    result = run_example(rule, example, RULESET)
    assert result.passed, result.message


LINES = [(sig, ex) for sig in RULESET.signals for ex in sig.examples]


@pytest.mark.parametrize(
    ("signal", "example"), LINES, ids=[f"{s.id}::{e.source.line}" for s, e in LINES]
)
def test_signal_example_line(signal, example) -> None:
    result = run_line_example(signal, example)
    assert result.passed, result.message


def test_every_signal_ships_lines_that_match_and_near_misses() -> None:
    for signal in RULESET.signals:
        kinds = {e.expect for e in signal.examples}
        assert kinds == {"match", "no-match"}, signal.id
        named = {p.name for p in signal.patterns}
        covered = {run_line_example(signal, e).matched for e in signal.examples}
        assert named <= covered, f"{signal.id}: patterns without a real line: {named - covered}"


def test_every_rule_has_both_kinds_of_example() -> None:
    for rule in RULESET.rules:
        kinds = {e.expect for e in rule.examples}
        assert kinds == {"match", "no-match"}, rule.id


def test_rule_ids_equal_file_names_and_are_unique() -> None:
    ids = [r.id for r in RULESET.rules]
    assert len(ids) == len(set(ids))
    for rule in RULESET.rules:
        assert rule.source.source.endswith(f"{rule.id}.yaml")


def test_every_cause_of_the_taxonomy_has_a_rule() -> None:
    from nccl_triage.ruleset import CAUSES

    assert {r.cause for r in RULESET.rules} == set(CAUSES)
