"""``rules test``: every rule's examples through the pipeline; and what rules fire on a corpus.

Input: a ruleset and the rules to test (or a folder of logs). Output: example results
(expected against fired, with the engine's reason) and per-rule hits over a corpus.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nccl_triage.authoring.examples import (
    ExampleResult,
    LineExampleResult,
    run_example,
    run_line_examples,
)
from nccl_triage.authoring.lint import Selection, select
from nccl_triage.errors import TriageError
from nccl_triage.model import Rule
from nccl_triage.ruleset import Ruleset

# ----------------------------------------------------------------------------- test


@dataclass
class ExampleRun:
    """What ``rules test`` ran."""

    results: list[ExampleResult]
    problems: list[str]  # rule files that do not load: nothing was run
    notices: list[str]
    selection: Selection | None = None
    line_results: list[LineExampleResult] = field(default_factory=list)  # signals' lines

    @property
    def passed(self) -> int:
        """How many examples passed (rules' logs and signals' lines)."""
        return sum(r.passed for r in self.results) + sum(r.passed for r in self.line_results)

    @property
    def failed(self) -> int:
        """How many examples failed."""
        return len(self.results) + len(self.line_results) - self.passed


def run_tests(
    dirs: Sequence[str | Path] = (),
    only: Iterable[str] = (),
    disable: Iterable[str] = (),
    builtin: bool = True,
) -> ExampleRun:
    """Run every example of the rules of ``dirs`` (all rules when none) with the whole ruleset."""
    sel = select(dirs, builtin)
    if sel.problems:
        return ExampleRun([], sel.problems, sel.ruleset.notices, sel)
    rules, problems = _pick(sel.rules, only, disable)
    if problems:
        return ExampleRun([], problems, sel.ruleset.notices, sel)
    results = [_run(rule, ex, sel.ruleset) for rule in rules for ex in rule.examples]
    signals = [s for s in sel.signals if not only or s.id in set(only)]
    return ExampleRun(
        results,
        [],
        sel.ruleset.notices,
        Selection(sel.ruleset, [], sel.targets, rules),
        run_line_examples(signals),
    )


def _pick(
    rules: list[Rule], only: Iterable[str], disable: Iterable[str]
) -> tuple[list[Rule], list[str]]:
    only_set, disable_set = set(only), set(disable)
    ids = {r.id for r in rules}
    problems = [
        f"--only/--disable: no rule '{rid}' here (known: {', '.join(sorted(ids))})"
        for rid in sorted((only_set | disable_set) - ids)
    ]
    picked = [r for r in rules if (not only_set or r.id in only_set) and r.id not in disable_set]
    return picked, problems


def _run(rule: Rule, example: Any, ruleset: Ruleset) -> ExampleResult:
    try:
        return run_example(rule, example, ruleset)
    except TriageError as exc:  # a template that does not render, an unreadable example file
        return ExampleResult(rule, example, False, [], str(exc), reason=str(exc))


@dataclass
class CorpusHits:
    """Which logs of a folder each rule fires on (``rules test --corpus``)."""

    logs: list[Path]
    hits: dict[str, list[tuple[Path, int, str]]]  # rule id -> (log, trigger line, top rule)
    errors: list[str]


_NOT_LOGS = {".yaml", ".yml", ".json", ".md", ".py", ".j2", ".toml"}


def corpus_hits(ruleset: Ruleset, rules: Sequence[Rule], corpus: str | Path) -> CorpusHits:
    """Triage every log under ``corpus`` and say where each of ``rules`` fires.

    Every rule of the ruleset is evaluated, as in real use; ``top rule`` is the diagnosis that
    comes first for that log, so an author sees when their rule would be a false positive.
    """
    from nccl_triage.diagnose.engine import correlate
    from nccl_triage.pipeline import triage_path

    root = Path(corpus)
    if not root.is_dir():
        raise TriageError(str(root), "not a directory")
    logs = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix not in _NOT_LOGS
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    wanted = {r.id: r for r in rules}
    hits: dict[str, list[tuple[Path, int, str]]] = {rid: [] for rid in wanted}
    errors: list[str] = []
    for log in logs:
        try:
            report = triage_path(str(log), ruleset)
        except TriageError as exc:
            errors.append(str(exc))
            continue
        if report.correlation is None:
            continue
        top = report.findings[0].rule.id if report.findings else ""
        lines = {f.rule.id: f.trigger.line for f in report.correlation.findings}
        for exp in report.correlation.explanations:
            if not exp.fired or exp.rule.id not in wanted:
                continue
            line = lines.get(exp.rule.id)
            if line is None:  # dropped from the findings (unknown when others fire)
                everything = sorted([*report.events, *report.signals], key=lambda e: e.line)
                found = correlate(everything, report.facts, [exp.rule]).findings
                line = found[0].trigger.line if found else 0
            hits[exp.rule.id].append((log, line, top))
    return CorpusHits(logs, hits, errors)
