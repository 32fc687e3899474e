"""The public corpus (../shared/corpus): timeout counts, ranks, op types and sequence numbers.

Skipped when the corpus is absent (a user's clone does not have it).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from conftest import CORPUS, corpus_available
from nccl_triage.pipeline import parse_path

pytestmark = pytest.mark.skipif(not corpus_available(), reason="corpus not available")

# A rank the line itself shows: "[rank3]:" (C++ or excepthook), "[Rank 3]", "[PG ... Rank 3]".
RANK_SHOWN = re.compile(r"\[rank\d+\]|\[\s*(?:PG\s[^\[\]]*?)?Rank\s*\d+\s*\]")


def manifest() -> list[dict[str, Any]]:
    if not corpus_available():
        return []
    cases: list[dict[str, Any]] = yaml.safe_load((CORPUS / "manifest.yaml").read_text("utf-8"))
    return cases


CASES = [pytest.param(case, id=case["id"]) for case in manifest()]


@pytest.mark.parametrize("case", CASES)
def test_corpus_case(case: dict[str, Any]) -> None:
    result = parse_path(str(CORPUS / f"{case['id']}.log"))
    found = [e for e in result.events if e.kind == "watchdog_timeout"]
    assert len(found) == case["expected_timeout_events"], [
        (e.line, e.rank, e.seq, e.form) for e in found
    ]
    without_rank = [(e.line, e.text) for e in found if e.rank is None and RANK_SHOWN.search(e.text)]
    assert without_rank == []
    seq = case.get("seq")
    at_seq = [e for e in found if seq is not None and e.seq == seq]
    # ranks may disagree on the op at one SeqNum (case 074: a mismatch); the manifest names one
    if at_seq and case.get("op_type"):
        assert case["op_type"] in {e.op_type for e in at_seq}
    if at_seq and case.get("timeout_ms"):
        assert {e.timeout_ms for e in at_seq if e.timeout_ms} == {case["timeout_ms"]}


def test_manifest_seq_is_seen_when_the_log_prints_it() -> None:
    missing = []
    for case in manifest():
        seq = case.get("seq")
        if seq is None:
            continue
        text = (CORPUS / f"{case['id']}.log").read_text("utf-8", errors="replace")
        if not re.search(rf"SeqNum={seq}\b|work: {seq}\b|sequence id: {seq}\b", text):
            continue  # the excerpt itself does not print it
        events = parse_path(str(CORPUS / f"{case['id']}.log")).events
        if not any(e.kind == "watchdog_timeout" and e.seq == seq for e in events):
            missing.append(case["id"])
    assert missing == []


def test_corpus_has_no_unparsed_timeout_lines() -> None:
    """A line holding the watchdog phrase is an event, never left unparsed."""
    left = []
    for case in manifest():
        result = parse_path(str(CORPUS / f"{case['id']}.log"))
        left += [
            (case["id"], u.line, u.text[:100])
            for u in result.unparsed
            if "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" in u.text
            and "SeqNum=N" not in u.text
        ]
    assert left == []
