"""Accuracy over the public corpus (skipped when ../shared/corpus is absent).

Every expected verdict right, no diagnosis on a clean log, and the cause the log's own lines
support (``evidence_cause``) first on at least 85% of the cases where it is not ``unknown``.
Per-cause precision and recall are printed (``pytest -s``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from nccl_triage.api import triage_path
from nccl_triage.ruleset import load_ruleset

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
pytestmark = pytest.mark.skipif(
    not (CORPUS / "manifest.yaml").is_file(), reason="corpus not available"
)


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
    assert not wrong


def test_clean_logs_get_no_diagnosis(results: list[tuple[dict[str, Any], str, str]]) -> None:
    assert all(top == "none" for c, v, top in results if c["expected_verdict"] == "clean")
    assert all(top != "none" for c, v, top in results if c["expected_verdict"] != "clean")


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
    assert hits >= 0.85 * len(known)


def test_every_corpus_diagnosis_renders_its_advice() -> None:
    from nccl_triage.render import report_json

    rs = load_ruleset()
    for path in sorted(CORPUS.glob("*.log")):
        report = triage_path(str(path), rs)
        for diagnosis in report_json(report, rs.template_dirs)["diagnoses"]:
            assert diagnosis["advice"].strip(), path.name
