"""Every example line of the format reference (sections 14 and 15) gives the event it shows.

The lines and expected fields live in ``tests/data/reference_examples.yaml``; the expected values
were written from what each line says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from nccl_triage.model import Event, Line
from nccl_triage.parse.anatomy import peel
from nccl_triage.parse.dedupe import Deduper
from nccl_triage.parse.lines import make_event
from nccl_triage.parse.messages import parse_message
from nccl_triage.pipeline import parse_text

DATA = Path(__file__).parent / "data" / "reference_examples.yaml"
REFERENCE = ROOT.parent / "shared" / "reference" / "pytorch-nccl-log-formats.md"
EXAMPLES: dict[str, Any] = yaml.safe_load(DATA.read_text(encoding="utf-8"))

# Always compared: a field the example does not list must be unset.
CORE = (
    "kind",
    "rank",
    "pg",
    "pg_rank",
    "seq",
    "op_type",
    "numel_in",
    "numel_out",
    "timeout_ms",
    "ran_for_ms",
    "last_enqueued",
    "last_completed",
    "form",
    "partial",
)
VERSIONS = (
    "1.8",
    "1.9",
    "1.10",
    "1.11",
    "1.12",
    "1.13",
    "2.0",
    "2.1",
    "2.2",
    "2.3",
    "2.4",
    "2.5",
    "2.6",
    "2.7",
    "2.8",
    "2.9",
)


def fields_of(ev: Event, expect: dict[str, Any]) -> dict[str, Any]:
    """The event's values of the core fields and of every field the expectation names."""
    got = ev.to_dict()
    got.setdefault("partial", False)
    return {key: got.get(key) for key in (*CORE, *expect)}


def wanted(expect: dict[str, Any]) -> dict[str, Any]:
    return {key: expect.get(key, False if key == "partial" else None) for key in (*CORE, *expect)}


def in_era(version: str, era: str) -> bool:
    """Tell whether a release lies in a ``pytorch_era`` range ("2.4", "2.4+", "<=2.3", "2.1-2.3")."""
    at = VERSIONS.index(version)
    if era.endswith("+"):
        return at >= VERSIONS.index(era[:-1])
    if era.startswith("<="):
        return at <= VERSIONS.index(era[2:])
    lo, _, hi = era.partition("-")
    return VERSIONS.index(lo) <= at <= VERSIONS.index(hi or lo)


def cases(section: str, *, with_event: bool = False) -> list[Any]:
    out = []
    for case in EXAMPLES[section]:
        if with_event and case["expect"] == "none":
            continue
        marks = []
        if case.get("prefilter_gap") and not with_event:
            marks.append(
                pytest.mark.xfail(reason=f"prefilter: {case['prefilter_gap']}", strict=True)
            )
        out.append(pytest.param(case, id=case["id"], marks=marks))
    return out


@pytest.mark.parametrize("case", cases("section14") + cases("section15"))
def test_example_line(case: dict[str, Any]) -> None:
    result = parse_text(case["line"] + "\n")
    assert result.unparsed == []
    if case["expect"] == "none":
        assert result.events == []
        return
    assert len(result.events) == 1, [e.to_dict() for e in result.events]
    ev = result.events[0]
    assert fields_of(ev, case["expect"]) == wanted(case["expect"])
    assert ev.line == 1
    assert ev.text == case["line"].strip()
    if case.get("version") and ev.pytorch_era is not None:
        assert in_era(case["version"], ev.pytorch_era), ev.pytorch_era


@pytest.mark.parametrize(
    "case", cases("section14", with_event=True) + cases("section15", with_event=True)
)
def test_example_message_without_candidate_scan(case: dict[str, Any]) -> None:
    """The grammar alone reads every line, whether or not the candidate scan passes it on."""
    line = peel(Line("<text>", 1, case["line"]))
    fields = parse_message(line.message)
    assert fields is not None
    events = Deduper()  # it turns a status line alone into a (partial) timeout
    events.add(make_event(line, fields, line.text))
    [ev] = events.events()
    assert fields_of(ev, case["expect"]) == wanted(case["expect"])


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in EXAMPLES["blocks"]])
def test_block(case: dict[str, Any]) -> None:
    result = parse_text(case["log"])
    assert result.unparsed == []
    got = [
        fields_of(ev, {"line": 0, **exp}) | {"line": ev.line}
        for ev, exp in zip(result.events, case["events"], strict=False)
    ]
    assert got == [wanted({"line": 0, **exp}) for exp in case["events"]]
    assert len(result.events) == len(case["events"])


def test_era_ranges() -> None:
    assert in_era("2.5", "2.4+")
    assert not in_era("2.3", "2.4+")
    assert in_era("2.0", "<=2.3")
    assert in_era("2.2", "2.1-2.3")
    assert not in_era("2.4", "2.1-2.3")
    assert in_era("2.3", "2.3")


@pytest.mark.skipif(not REFERENCE.is_file(), reason="format reference not available")
def test_data_file_holds_every_reference_line_verbatim() -> None:
    section = REFERENCE.read_text(encoding="utf-8").split("## 14. Example corpus")[1]
    section = section.split("## 15.")[0]
    items = re.findall(r"^(\d+)\. .*?\n\s+`(.*)`\s*$", section, re.MULTILINE)
    assert [int(n) for n, _ in items] == list(range(1, 101))
    ours = {case["id"]: case["line"] for case in EXAMPLES["section14"]}
    for n, line in items:
        assert ours[f"ex14-{int(n):02d}"] == line.replace("\\t", "\t")
