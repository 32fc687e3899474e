"""Hyperscan and RE2 find the same candidate lines (numbers, text, neighbours), whatever the
input, the chunking and the anchors; NCCL_TRIAGE_SCAN chooses the engine; every diagnosis is
the same under both."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl_triage.errors import TriageError
from nccl_triage.ingest import engines, hsdb
from nccl_triage.ingest.anchors import ANCHORS, REGEX_ANCHORS
from nccl_triage.ingest.engines import HyperscanEngine, Re2Engine, scan_engine
from nccl_triage.ingest.regex import compile_bytes_alternation
from nccl_triage.ingest.scan import Candidate, Scanner, regex_anchor, scan
from nccl_triage.pipeline import scan_patterns, triage_path
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import load_ruleset
from test_scan import params  # the scan's constants, shrunk for small inputs

RULES = load_ruleset()
RULESET_ANCHORS = scan_patterns(RULES)
needs_hyperscan = pytest.mark.skipif(
    hsdb.hyperscan_module() is None, reason="hyperscan is not installed here"
)

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted((ROOT / "fixtures" / "logs").glob("*.log")) + sorted(
    (ROOT / "tests" / "corpus").glob("*/*.log")
)

# Regex anchors Hyperscan takes (confirmed by RE2) and ones it leaves to RE2, with inputs that
# tell the two apart: multi-byte characters, invalid UTF-8, the vertical tab, the Kelvin sign,
# line starts and ends, matches that would run over a newline.
TRICKY_REGEXES = (
    *REGEX_ANCHORS,
    r"zz.*yy",  # taken: an unbounded wildcard
    r"w\W+v",  # taken
    r"m\s+n",  # taken: Hyperscan's \s also holds the vertical tab; RE2 confirms
    r"(?i:abc)",  # taken
    r"b{2,}c",  # taken
    r"q[^)]*z",  # taken: Hyperscan runs over newlines; RE2 confirms within the line
    r"a.b",  # left: one character of up to 4 bytes
    r"(?i)kelvin",  # left: RE2 folds k to the Kelvin sign
    r"^step \d+",  # left: where the buffer starts
    r"loss$",  # left
    r"x\S+y",  # left: \S holds the vertical tab to RE2 only
    r"é+",  # left: not ASCII
)
TRICKY_ANCHORS = (
    *ANCHORS,
    "abc",
    "NCCL WARN",
    *(regex_anchor(r) for r in TRICKY_REGEXES),
)
PIECES = [
    *(a.encode() for a in ANCHORS[::9]),
    b"NCCL WA",
    b"RN",
    b"include/socket.h:311 WARN boom",
    b"init.cc:82 -> 3",
    b"ncclCommInitRank(comm, 8) failed:",
    b"ncclCommInitRank(",
    b") failed:",
    b"zz",
    b"yy",
    b"w",
    b"v",
    b"m",
    b"n",
    b"ABC",
    b"abc",
    b"bb",
    b"c",
    b"q",
    b"z",
    b")",
    b"a",
    b"b",
    b"x",
    b"y",
    b"step 12",
    b"loss",
    b"elvin",
    "\u212a".encode(),  # the Kelvin sign
    "é".encode(),
    b"\xff",
    b"\x0b",
    b" ",
    b"\t",
    b"\r",
    b"\r\n",
    b"\n",
    b"\n",
    b"\n",
    # whole near-misses: what one engine would match and the other not, without care
    b"x\x0by",
    b"m\x0bn",
    "a\u00e9b".encode(),
    "\u212aelvin".encode(),
    b"zz\xffyy",
    "w\u00e9v".encode(),
    b"q\nz",
    b"ncclFoo(\n) failed:",
    b"\nstep 7",
    b"loss\n",
    b"aBc",
    b"bbbc",
]


@st.composite
def logs(draw: st.DrawFn, max_repeat: int = 60) -> bytes:
    """Random mixtures of anchor words, near-misses, newlines, CRs and long runs."""
    parts = draw(st.lists(st.sampled_from(PIECES), max_size=60))
    if draw(st.booleans()):  # a long line, maybe with anchors deep inside
        at = draw(st.integers(0, len(parts)))
        filler = draw(st.sampled_from([b"x", b"abc ", b"NCCL WARN ", b"\xc3\xa9"]))
        parts.insert(at, filler * draw(st.integers(1, max_repeat)))
    return b"".join(parts)


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def run(
    chunks: list[bytes], anchors: tuple[str, ...], engine: str
) -> tuple[list[Candidate], dict[str, int]]:
    stats: dict[str, int] = {}
    return list(scan(chunks, anchors, stats, engine=engine)), stats


def same(data: bytes, chunks: list[bytes], anchors: tuple[str, ...]) -> None:
    want = run(chunks, anchors, "re2")
    got = run(chunks, anchors, "hyperscan")
    assert [(c.lineno, c.raw) for c in got[0]] == [(c.lineno, c.raw) for c in want[0]]
    assert got == want


SETTINGS = {
    "default": {},
    "short-lines": {"MAX_LINE": 8, "LONG_LINE": 24, "LOOKAHEAD": 3},
    "long-lines": {"MAX_LINE": 16, "LONG_LINE": 300, "LOOKBEHIND": 1, "LOOKAHEAD": 2},
}


@needs_hyperscan
@pytest.mark.parametrize("name", SETTINGS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_engines_give_the_same_candidates(name: str, data: st.DataObject) -> None:
    text = data.draw(logs())
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=10))
    anchors = data.draw(st.sampled_from([TRICKY_ANCHORS, (*ANCHORS, "abc")]))
    with params(**SETTINGS[name]):
        same(text, cut(text, cuts), anchors)


@needs_hyperscan
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_engines_agree_with_the_ruleset_anchors(data: st.DataObject) -> None:
    """The anchors triage scans for (the grammar's and every signal's)."""
    anchors = RULESET_ANCHORS
    words = [a.encode() for a in anchors if not a.startswith(engines.REGEX_PREFIX)]
    lines = data.draw(
        st.lists(
            st.lists(st.sampled_from([*words[::3], b" ", b"step=", b"\r", b"\xff"]), max_size=6),
            max_size=30,
        )
    )
    text = b"\n".join(b"".join(parts) for parts in lines)
    same(text, cut(text, data.draw(st.lists(st.integers(0, 10**6), max_size=6))), anchors)


@needs_hyperscan
def test_engines_agree_on_every_bundled_log_however_chunked() -> None:
    anchors = RULESET_ANCHORS
    for path in LOGS:
        data = path.read_bytes()
        for size in (len(data) or 1, 4096, 97):
            chunks = [data[i : i + size] for i in range(0, len(data), size)]
            same(data, chunks, anchors)


@needs_hyperscan
def test_dense_lines_are_named_once_each() -> None:
    line = b"NCCL WARN NCCL WARN .cc: ncclCommInitRank(c) failed: NCCL error NCCL WARN\n"
    data = line * 5000
    anchors = (*ANCHORS, *(regex_anchor(r) for r in REGEX_ANCHORS))
    got, stats = run([data], anchors, "hyperscan")
    assert [c.lineno for c in got] == list(range(1, 5001)) and stats["lines"] == 5000
    assert got == run([data], anchors, "re2")[0]


def shuffled(scan: Any, seed: int) -> Any:
    """A database's scan that reports its matches in a random order (Hyperscan promises none)."""
    rng = random.Random(seed)

    def scan_shuffled(data: Any, match_event_handler: Any, scratch: Any) -> None:
        found: list[tuple[int, int, int, int, object]] = []
        scan(data, match_event_handler=lambda *m: found.append(m), scratch=scratch)
        rng.shuffle(found)
        for m in found:
            match_event_handler(*m)

    return scan_shuffled


@needs_hyperscan
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_in_any_order_give_the_same_lines(data: st.DataObject) -> None:
    text = data.draw(logs())
    engine = scan_engine(TRICKY_ANCHORS, "hyperscan")
    assert isinstance(engine, HyperscanEngine)
    want = run([text], TRICKY_ANCHORS, "re2")
    real = engine._scan
    try:
        engine._scan = shuffled(real, data.draw(st.integers(0, 1000)))
        assert run([text], TRICKY_ANCHORS, "hyperscan") == want
    finally:
        engine._scan = real


@needs_hyperscan
def test_a_long_line_is_cut_around_its_leftmost_anchor() -> None:
    """Hyperscan names a line by a match's end; the window is still around the first anchor."""
    line = b"x" * 100 + b"Root Cause" + b"y" * 300 + b"NCCL WARN" + b"z" * 300
    anchors = ("NCCL WARN", "Root Cause", "Cause")
    with params(MAX_LINE=64, LONG_LINE=4096):
        got, _ = run([b"a\n" + line + b"\nb\n"], anchors, "hyperscan")
        assert got == run([b"a\n" + line + b"\nb\n"], anchors, "re2")[0]
    assert b"Root Cause" in got[0].raw and len(got[0].raw) == 64


@needs_hyperscan
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_parts_holding_an_anchor_are_found_alike(data: st.DataObject) -> None:
    """The segments of a redrawn line that hold an anchor, each read alone, by both engines."""
    parts = data.draw(st.lists(logs(20).map(lambda b: b.replace(b"\n", b" ")), max_size=6))
    raw = b"\r".join(parts)
    bounds, start = [], 0
    for part in parts:
        bounds.append((start, start + len(part)))
        start += len(part) + 1
    anchors = data.draw(st.sampled_from([TRICKY_ANCHORS, RULESET_ANCHORS]))
    alone = scan_engine(anchors, "re2").pattern
    want = [i for i, part in enumerate(parts) if alone.search(part) is not None]
    assert scan_engine(anchors, "re2").parts_with_anchors(raw, bounds) == want
    assert scan_engine(anchors, "hyperscan").parts_with_anchors(raw, bounds) == want
    # without splitting the line, where no part is empty (and without the RE2 leftovers)
    hs = scan_engine(anchors, "hyperscan")
    redrawn = hs.redrawn_parts(raw, len(raw))
    if all(parts) and not any(b"\r" in p for p in parts) and redrawn is not None:
        assert [(s, e) for s, e, _found in redrawn] == [bounds[i] for i in want]
        for s, e, found in redrawn:  # and the anchors each holds
            part = raw[s:e]
            held = {a for a in hs.literals if b"\n" not in a and a in part}
            held |= {r for r in hs.regexes if compile_bytes_alternation((), (r,)).search(part)}
            assert found == held
    assert scan_engine(anchors, "re2").redrawn_parts(raw, len(raw)) is None


# ----------------------------------------------------------------------------- choosing


def test_regexes_hyperscan_may_stand_in_for() -> None:
    taken = [
        r"\.(?:h|hpp|c|cpp):\d+ +WARN\b",
        r"\bnccl[A-Z]\w+(?:\([^)]*\))? failed:",
        r"zz.*yy",
        r"w\W+v",
        r"a.{2,}b",
        r"(?i:abc)",
        r"(?P<n>\d+) ranks",
        r"[A-Z_]+=\d",
        r"x[^\n]*y",
    ]
    left = [
        r"a.b",  # one UTF-8 character is up to 4 bytes
        r"a.?b",
        r"a.{2}b",
        r"(?:.)+",
        r"(?i)kill",  # RE2 folds k to the Kelvin sign, s to the long s
        r"(?i)[a-z]x",
        r"^step",
        r"loss$",
        r"\Afoo",
        r"foo\z",
        r"x\S+y",  # RE2's \s has no vertical tab
        r"x[^\s]+y",
        r"[[:alpha:]]+",
        r"\pL+",
        r"[\x80-\xff]",
        r"é",
        r"(?s)a.*b",
        r"(?=x)",
        r"a{,3}",
        r"\Qa.b\E",
    ]
    assert [r for r in taken if not hsdb.hyperscan_superset(r)] == []
    assert [r for r in left if hsdb.hyperscan_superset(r)] == []


def test_the_variable_chooses_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "re2")
    assert isinstance(Scanner().engine, Re2Engine)
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "grep")
    with pytest.raises(TriageError, match="NCCL_TRIAGE_SCAN: expected one of auto, hyperscan"):
        Scanner()
    monkeypatch.delenv("NCCL_TRIAGE_SCAN")
    expected = Re2Engine if hsdb.hyperscan_module() is None else HyperscanEngine
    assert isinstance(Scanner().engine, expected)


def test_without_hyperscan_re2_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsdb, "hyperscan_module", lambda: None)
    anchors = ("only-without-hyperscan",)
    assert isinstance(scan_engine(anchors, "auto"), Re2Engine)
    with pytest.raises(TriageError, match="hyperscan is not installed"):
        scan_engine(anchors, "hyperscan")


@needs_hyperscan
def test_anchors_hyperscan_cannot_take_stay_on_re2() -> None:
    anchors = ("NCCL WARN", *(regex_anchor(r) for r in (r"^step \d+", r"ncclFoo\(\d+\)")))
    engine = scan_engine(anchors, "hyperscan")
    assert isinstance(engine, HyperscanEngine)
    data = b"step 3 begins\nx ncclFoo(2) y\nNCCL WARN\nplain\n"
    assert [c.lineno for c in run([data], anchors, "hyperscan")[0]] == [1, 2, 3]
    # no literal: Hyperscan has nothing to do
    assert isinstance(scan_engine((regex_anchor("^x"),), "hyperscan"), Re2Engine)
    assert isinstance(scan_engine(("", "abc"), "hyperscan"), Re2Engine)  # every line


# ----------------------------------------------------------------------------- the pipeline


def report_of(path: Path) -> str:
    report = triage_path(str(path), RULES)
    return json.dumps(report_json(report, RULES.template_dirs), sort_keys=True)


@needs_hyperscan
def test_every_diagnosis_is_the_same_under_both_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "hyperscan")
    fast = {p: report_of(p) for p in LOGS}
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "re2")
    assert {p: report_of(p) for p in LOGS} == fast


def test_the_fallback_diagnoses_the_bundled_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """What CI checks on machines with Hyperscan: the RE2 path gives the diagnosis too."""
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "re2")
    report = triage_path(str(ROOT / "fixtures/logs/lora-oom-hidden-by-timeout.log"), RULES)
    assert report.verdict == "nccl_timeout"
    assert report.findings[0].rule.id == "oom-behind-timeout"
