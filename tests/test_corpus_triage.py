"""Accuracy over the public corpus (skipped when ../shared/corpus is absent).

The bars: every expected verdict right, no diagnosis on a clean log, and the cause the log's own
lines support (``evidence_cause``) first on at least 95% of the cases that show one. Until the
code meets them, each figure is a ratchet: the floor below is what the code reaches today, it
may only ever be raised, and the test fails both when a change loses ground and when it gains
some without raising the floor (so the written figure is always the true one).
Per-cause precision and recall are printed (``pytest -s``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from nccl_triage.pipeline import triage_path
from nccl_triage.ruleset import load_ruleset

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
pytestmark = pytest.mark.skipif(
    not (CORPUS / "manifest.yaml").is_file(), reason="corpus not available"
)

# Ratchet floors (raise them, never lower them).
VERDICTS_RIGHT = 109  # of 116; bar: all
CLEAN_LOGS_DIAGNOSED = 3  # a ceiling; bar: 0
FAILING_LOGS_CALLED_CLEAN = 4  # a ceiling; bar: 0
EVIDENCE_CAUSE_FIRST = 44  # of 72 (cases whose evidence_cause is not 'unknown'); bar: 95%
UNKNOWN_GIVEN_A_CAUSE = 1  # a ceiling: cases whose lines show no cause but got one; bar: 0


def ratchet(name: str, value: int, floor: int, higher_is_better: bool = True) -> None:
    if value == floor:
        return
    better = value > floor if higher_is_better else value < floor
    if better:
        pytest.fail(f"{name} improved to {value}: write it into the test (it was {floor})")
    pytest.fail(f"{name} fell to {value} (the floor is {floor})")


@pytest.fixture(scope="module")
def results() -> list[tuple[dict[str, Any], str, str]]:
    manifest = yaml.safe_load((CORPUS / "manifest.yaml").read_text(encoding="utf-8"))
    rs = load_ruleset()
    out = []
    for case in manifest:
        report = triage_path(str(CORPUS / f"{case['id']}.log"), rs)
        top = report.findings[0].rule.cause if report.findings else "none"
        out.append((case, report.verdict, top))
    return out


def test_every_verdict_is_right(results: list[tuple[dict[str, Any], str, str]]) -> None:
    wrong = [
        (c["id"], v, c["expected_verdict"]) for c, v, _ in results if v != c["expected_verdict"]
    ]
    print("\nwrong verdicts:", wrong)
    ratchet("right verdicts", len(results) - len(wrong), VERDICTS_RIGHT)


def test_clean_logs_get_no_diagnosis(results: list[tuple[dict[str, Any], str, str]]) -> None:
    diagnosed = [
        c["id"] for c, v, top in results if c["expected_verdict"] == "clean" and top != "none"
    ]
    missed = [
        c["id"] for c, v, top in results if c["expected_verdict"] != "clean" and top == "none"
    ]
    print("\nclean logs diagnosed:", diagnosed, "failing logs called clean:", missed)
    ratchet("clean logs diagnosed", len(diagnosed), CLEAN_LOGS_DIAGNOSED, higher_is_better=False)
    ratchet("failing logs called clean", len(missed), FAILING_LOGS_CALLED_CLEAN, False)


def test_evidence_cause_first(results: list[tuple[dict[str, Any], str, str]]) -> None:
    known = [(c, top) for c, _, top in results if c["evidence_cause"] not in ("unknown",)]
    hits = sum(1 for c, top in known if top == c["evidence_cause"])
    tp: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    actual: Counter[str] = Counter()
    for c, _, top in results:
        predicted[top] += 1
        actual[c["evidence_cause"]] += 1
        tp[top] += top == c["evidence_cause"]
    print("\ncause                                   precision  recall  (n)")
    for cause in sorted(set(predicted) | set(actual)):
        p = tp[cause] / predicted[cause] if predicted[cause] else 0.0
        r = tp[cause] / actual[cause] if actual[cause] else 0.0
        print(f"{cause:<40}{p:9.2f}{r:8.2f}  ({actual[cause]})")
    print(f"evidence_cause first: {hits}/{len(known)}")
    ratchet("evidence_cause first", hits, EVIDENCE_CAUSE_FIRST)


def test_no_cause_made_up(results: list[tuple[dict[str, Any], str, str]]) -> None:
    made_up = [
        (c["id"], top)
        for c, _, top in results
        if c["evidence_cause"] == "unknown" and top not in ("unknown", "none")
    ]
    print("\ncause claimed without evidence:", made_up)
    ratchet("causes made up", len(made_up), UNKNOWN_GIVEN_A_CAUSE, higher_is_better=False)


def test_every_corpus_diagnosis_renders_its_advice() -> None:
    from nccl_triage.render.report import report_json

    rs = load_ruleset()
    for path in sorted(CORPUS.glob("*.log")):
        report = triage_path(str(path), rs)
        for diagnosis in report_json(report, rs.template_dirs)["diagnoses"]:
            assert diagnosis["advice"].strip(), path.name
