"""``rules test --corpus DIR``: how the rules do on a folder of labelled logs.

Input: a folder of logs with a ``manifest.yaml`` beside them (a list of cases: ``id`` naming
``<id>.log``, ``expected_verdict``, ``evidence_cause``: the cause the log's own lines support,
``unknown`` when none does, ``none`` for a clean log; optional ``evidence_lines``), and a
ruleset. Output: an :class:`Evaluation`: per case what triage said, verdict and top-1
accuracy, per-cause precision and recall, a confusion table and the misses with what fired.
Teams run it on their own labelled logs; the project's corpus tests use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nccl_triage.errors import InputError, TriageError
from nccl_triage.pipeline import triage_path
from nccl_triage.ruleset import Ruleset
from nccl_triage.ruleset.safeyaml import load_yaml

MANIFEST = "manifest.yaml"
CLEAN, NONE, UNKNOWN = "clean", "none", "unknown"


@dataclass(frozen=True)
class CaseResult:
    """One labelled log and what triage said about it."""

    id: str
    expected_verdict: str
    evidence_cause: str
    verdict: str
    causes: tuple[str, ...]  # the diagnoses' causes, most likely first ('none' when clean)
    rules: tuple[str, ...]  # the rules that fired, in the same order
    evidence_lines: tuple[str, ...] = ()  # what the manifest says supports the cause
    quoted: tuple[str, ...] = ()  # the lines the top diagnosis quotes
    error: str | None = None  # the log could not be read

    @property
    def top(self) -> str:
        """The first diagnosis's cause (``none`` when the log was called clean)."""
        return self.causes[0] if self.causes else NONE

    @property
    def verdict_right(self) -> bool:
        """Tell whether the verdict is the expected one."""
        return self.verdict == self.expected_verdict

    @property
    def shows_a_cause(self) -> bool:
        """Tell whether the log's own lines support a cause (or show it is clean)."""
        return self.evidence_cause != UNKNOWN

    @property
    def first_right(self) -> bool:
        """Tell whether the cause the lines support comes first."""
        return self.top == self.evidence_cause

    @property
    def made_up(self) -> bool:
        """Tell whether a cause was claimed where the lines show none."""
        return not self.shows_a_cause and self.top not in (UNKNOWN, NONE)


@dataclass
class Evaluation:
    """The results over one labelled folder."""

    folder: str
    cases: list[CaseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # manifest entries that could not be run

    @property
    def verdicts_right(self) -> int:
        """Cases whose verdict is the expected one."""
        return sum(c.verdict_right for c in self.cases)

    @property
    def clean_diagnosed(self) -> list[CaseResult]:
        """Clean logs that got a diagnosis."""
        return [c for c in self.cases if c.expected_verdict == CLEAN and c.top != NONE]

    @property
    def failing_called_clean(self) -> list[CaseResult]:
        """Failing logs that got no diagnosis."""
        return [c for c in self.cases if c.expected_verdict != CLEAN and c.top == NONE]

    @property
    def shows_a_cause(self) -> list[CaseResult]:
        """Cases whose lines support a cause (``none`` included: a clean log)."""
        return [c for c in self.cases if c.shows_a_cause]

    @property
    def first_right(self) -> int:
        """Cases that show a cause and get it first."""
        return sum(c.first_right for c in self.shows_a_cause)

    @property
    def made_up(self) -> list[CaseResult]:
        """Cases whose lines show no cause but that got one."""
        return [c for c in self.cases if c.made_up]

    def precision_recall(self) -> dict[str, tuple[float, float, int]]:
        """Per cause (of the cases that show one): precision, recall and its number of cases."""
        shown = self.shows_a_cause
        predicted = Counter(c.top for c in shown)
        actual = Counter(c.evidence_cause for c in shown)
        hits = Counter(c.top for c in shown if c.first_right)
        out = {}
        for cause in sorted(set(predicted) | set(actual)):
            p = hits[cause] / predicted[cause] if predicted[cause] else 0.0
            r = hits[cause] / actual[cause] if actual[cause] else 0.0
            out[cause] = (p, r, actual[cause])
        return out

    def confusion(self) -> dict[tuple[str, str], int]:
        """How often each (cause the lines support, cause put first) pair occurs."""
        return dict(Counter((c.evidence_cause, c.top) for c in self.shows_a_cause))

    def format(self, misses: bool = True) -> str:
        """The report ``rules test --corpus`` prints."""
        n = len(self.cases)
        shown = self.shows_a_cause
        verdicts = (
            f"  verdicts right: {self.verdicts_right}/{n}"
            f"  (clean logs diagnosed: {len(self.clean_diagnosed)},"
            f" failing logs called clean: {len(self.failing_called_clean)})"
        )
        first = (
            f"  cause first: {self.first_right}/{len(shown)} of the logs that show one"
            f"{_percent(self.first_right, len(shown))}"
        )
        made_up = (
            f"  cause claimed where the lines show none: {len(self.made_up)} of {n - len(shown)}"
        )
        lines = [
            f"corpus {self.folder}: {n} labelled logs",
            verdicts,
            first,
            made_up,
            "",
            f"  {'cause':<38} {'precision':>9} {'recall':>7} {'n':>4}",
        ]
        for cause, (p, r, k) in self.precision_recall().items():
            lines.append(f"  {cause:<38} {p:>9.2f} {r:>7.2f} {k:>4}")
        wrong = sorted(
            ((a, b, k) for (a, b), k in self.confusion().items() if a != b),
            key=lambda t: (-t[2], t[0], t[1]),
        )
        if wrong:
            lines += ["", "  confusions (the lines support -> put first: how often)"]
            lines += [f"  {a} -> {b}: {k}" for a, b, k in wrong]
        if misses:
            missed = [
                c
                for c in self.cases
                if not c.verdict_right or (c.shows_a_cause and not c.first_right) or c.made_up
            ]
            if missed:
                lines += ["", "  misses"]
            for c in missed:
                what = ", ".join(f"{r} ({k})" for r, k in zip(c.rules, c.causes, strict=True))
                lines.append(
                    f"  {c.id}: verdict {c.verdict} (expected {c.expected_verdict}); "
                    f"the lines support {c.evidence_cause}; fired: {what or 'nothing'}"
                    + (f"; error: {c.error}" if c.error else "")
                )
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines) + "\n"


def _percent(k: int, n: int) -> str:
    return f" ({100 * k / n:.0f}%)" if n else ""


def has_manifest(folder: str | Path) -> bool:
    """Tell whether a folder carries labels (``manifest.yaml``)."""
    return (Path(folder) / MANIFEST).is_file()


def evaluate_corpus(folder: str | Path, ruleset: Ruleset) -> Evaluation:
    """Triage every log the folder's manifest lists and compare with its labels.

    Raises:
        TriageError: the manifest cannot be read or is not a list of cases.
    """
    path = Path(folder) / MANIFEST
    data, problems = load_yaml(path)
    if problems:
        raise TriageError(str(path), problems[0])
    if not isinstance(data, list):
        raise TriageError(str(path), "a manifest is a list of cases (id, expected_verdict, ...)")
    out = Evaluation(str(folder))
    for i, case in enumerate(data):
        result = _run_case(Path(folder), case, ruleset)
        if isinstance(result, str):
            out.problems.append(f"{path}: case {i + 1}: {result}")
        else:
            out.cases.append(result)
    return out


def _run_case(folder: Path, case: Any, ruleset: Ruleset) -> CaseResult | str:
    if not isinstance(case, dict) or "id" not in case:
        return "not a mapping with an id"
    cid = str(case["id"])
    expected = str(case.get("expected_verdict", ""))
    cause = str(case.get("evidence_cause", UNKNOWN))
    if expected not in (CLEAN, "nccl_timeout", "nccl_error"):
        return f"{cid}: expected_verdict must be clean, nccl_timeout or nccl_error"
    lines = tuple(str(x) for x in case.get("evidence_lines") or ())
    try:
        report = triage_path(str(folder / f"{cid}.log"), ruleset)
    except InputError as exc:
        return CaseResult(cid, expected, cause, "unreadable", (), (), lines, (), str(exc))
    top = report.findings[0] if report.findings else None
    quoted: Sequence[Any] = [*top.evidence, top.trigger] if top else ()
    return CaseResult(
        id=cid,
        expected_verdict=expected,
        evidence_cause=cause,
        verdict=report.verdict,
        causes=tuple(f.rule.cause for f in report.findings),
        rules=tuple(f.rule.id for f in report.findings),
        evidence_lines=lines,
        quoted=tuple(e.text for e in quoted),
    )
