"""The candidate scan equals a naive per-line reference, whatever the chunking and line lengths;
the history of recent lines holds exactly the latest lines."""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl_triage.ingest import scan as prefilter
from nccl_triage.ingest.anchors import ANCHORS
from nccl_triage.ingest.scan import Candidate, Scanner, scan

# ----------------------------------------------------------------------------- reference


def clip(line: bytes, at: int, max_line: int) -> bytes:
    if len(line) <= max_line:
        return line
    lo = max(0, min(at - max_line // 2, len(line) - max_line))
    return line[lo : lo + max_line]


def naive(data: bytes, anchors: tuple[str, ...]) -> tuple[list[Candidate], int]:
    """One line at a time, with str.find: the specification of ``scan``."""
    max_line, lb, la = prefilter.MAX_LINE, prefilter.LOOKBEHIND, prefilter.LOOKAHEAD
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # a final newline ends the last line, it does not start another
    needles = [a.encode() for a in anchors]
    out = []
    for i, line in enumerate(lines):
        hits = [p for p in (line.find(n) for n in needles) if p >= 0]
        if hits:
            out.append(
                Candidate(
                    lineno=i + 1,
                    raw=clip(line, min(hits), max_line),
                    before=tuple(clip(x, 0, max_line) for x in lines[max(0, i - lb) : i]),
                    after=tuple(clip(x, 0, max_line) for x in lines[i + 1 : i + 1 + la]),
                )
            )
    return out, len(lines)


def run_scan(
    chunks: list[bytes], anchors: tuple[str, ...]
) -> tuple[list[Candidate], dict[str, int]]:
    stats: dict[str, int] = {}
    return list(scan(chunks, anchors, stats)), stats


def check(data: bytes, chunks: list[bytes], anchors: tuple[str, ...]) -> None:
    assert b"".join(chunks) == data
    got, stats = run_scan(chunks, anchors)
    want, lines = naive(data, anchors)
    assert [c.lineno for c in got] == [c.lineno for c in want]
    assert got == want
    assert stats == {"lines": lines, "bytes": len(data)}


@contextmanager
def params(**values: int) -> Iterator[None]:
    """Shrink the scan's constants so that small inputs reach its long-line paths."""
    saved = {name: getattr(prefilter, name) for name in values}
    try:
        for name, value in values.items():
            setattr(prefilter, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(prefilter, name, value)


def chunked(data: bytes, cuts: list[int], empty: bool = False) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    if empty:  # empty chunks from a reader are not the end of the input
        chunks = [c for chunk in chunks for c in (chunk, b"")]
    return chunks


# ----------------------------------------------------------------------------- strategies

SMALL_ANCHORS = ("abc", "bcd", "WARN", "NCCL WARN", "Root Cause")
PIECES = [
    b"abc",
    b"bcd",
    b"ab",
    b"bc",
    b"c",
    b"d",
    b"x",
    b" ",
    b"\r",
    b"\t",
    b"NCCL WARN",
    b"NCCL",
    b"WAR",
    b"Root",
    b" Cause",
    b"\x00",
    "é".encode(),
    b"\xff",
]


@st.composite
def logs(draw: st.DrawFn, pieces: list[bytes], long_piece: bytes, max_repeat: int) -> bytes:
    """Lines of random pieces, some very long; LF or CRLF; with or without a final newline."""
    lines = []
    for _ in range(draw(st.integers(0, 40))):
        parts = draw(st.lists(st.sampled_from(pieces), max_size=8))
        if draw(st.integers(0, 5)) == 0:  # a very long line, an anchor maybe deep inside
            parts.insert(
                draw(st.integers(0, len(parts))), long_piece * draw(st.integers(1, max_repeat))
            )
        lines.append(b"".join(parts))
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    text = eol.join(lines)
    if lines and draw(st.booleans()):
        text += eol
    return text


SMALL = {
    # neighbours and candidates cut at 8 bytes, lines over 24 bytes set aside past 64 bytes
    "tiny": {"MAX_LINE": 8, "LONG_LINE": 24, "LOOKBEHIND": 2, "LOOKAHEAD": 3},
    # the lines after a candidate split from small windows, long ones read one by one
    "small-windows": {
        "MAX_LINE": 8,
        "LONG_LINE": 300,
        "LOOKAHEAD": 5,
        "_AHEAD_WINDOW": 4,
        "_AHEAD_MAX": 16,
    },
    "full-context": {
        "MAX_LINE": 8,
        "LONG_LINE": 24,
        "LOOKBEHIND": 2,
        "LOOKAHEAD": 16,
    },
    "one-behind": {
        "MAX_LINE": 9,
        "LONG_LINE": 10,
        "LOOKBEHIND": 1,
        "LOOKAHEAD": 2,
    },
    "no-context": {
        "MAX_LINE": 8,
        "LONG_LINE": 24,
        "LOOKBEHIND": 0,
        "LOOKAHEAD": 0,
    },
    "roomy": {
        "MAX_LINE": 64,
        "LONG_LINE": 300,
        "LOOKBEHIND": 2,
        "LOOKAHEAD": 16,
    },
}


@pytest.mark.parametrize("name", SMALL)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scan_equals_naive_reference(name: str, data: st.DataObject) -> None:
    text = data.draw(logs(PIECES, b"xyz", 120))
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=12))
    chunks = chunked(text, cuts, empty=data.draw(st.booleans()))
    with params(**SMALL[name]):
        check(text, chunks, SMALL_ANCHORS)


@pytest.mark.parametrize("name", ["tiny", "full-context", "roomy"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scan_with_newlines_found_in_one_pass_equals_the_reference(
    name: str, data: st.DataObject
) -> None:
    """Large inputs have their candidates' line numbers worked out by numpy, every newline found
    (dense candidates) or those between candidates counted (sparse ones): the same lines."""
    prefilter.load_numpy()
    text = data.draw(logs(PIECES, b"xyz", 120))
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=12))
    vector, dense = data.draw(st.integers(1, 64)), data.draw(st.integers(1, 200))
    with params(**SMALL[name], _VECTOR=vector, _DENSE=dense):
        check(text, chunked(text, cuts), SMALL_ANCHORS)


REAL_PIECES = [a.encode() for a in ANCHORS[::7]] + [
    b"[default3]:[rank3]:[E1022 10:11:12.123456789 ProcessGroupNCCL.cpp:632] ",
    b"Watchdog caught collective operati",  # an anchor cut by a terminal wrap
    b"on timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)",
    b"  1%|          | 20/1752 [00:57<1:22:40,  2.86s/it]\r",
    b"{'loss': 0.0, 'grad_norm': 1.41}",
    b"\r",
]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_real_anchors_default_constants(data: st.DataObject) -> None:
    text = data.draw(logs(REAL_PIECES, b"NCCL WARN " * 700, 30))  # long lines up to 210 KB
    cuts = data.draw(st.lists(st.integers(0, 10**7), max_size=8))
    check(text, chunked(text, cuts), ANCHORS)


def naive_with_neighbours(
    data: bytes, anchors: tuple[str, ...], neighbours: tuple[str, ...]
) -> list[Candidate]:
    """The reference, where a candidate holding no ``neighbours`` anchor (nor ESC) goes bare."""
    want, _lines = naive(data, anchors)
    lines = data.split(b"\n")
    out = []
    for c in want:
        line = lines[c.lineno - 1]
        full = b"\x1b" in line or any(n.encode() in line for n in neighbours)
        out.append(c if full else Candidate(c.lineno, c.raw, (), (), grammar=False))
    return out


@pytest.mark.parametrize("engine", ["re2", "auto"])
@pytest.mark.parametrize("name", ["tiny", "full-context", "small-windows"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_signal_only_candidates_come_without_neighbours(
    engine: str, name: str, data: st.DataObject
) -> None:
    """A line holding only a signal's anchor comes at once and bare, in order with the others."""
    text = data.draw(logs([*PIECES, b"\x1b"], b"xyz", 40))
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=12))
    neighbours = ("WARN", "Root Cause")
    with params(**SMALL[name]):
        scanner = Scanner(SMALL_ANCHORS, engine=engine, neighbours=neighbours)
        got: list[Candidate] = []
        for chunk in chunked(text, cuts):
            got.extend(scanner.feed(chunk))
        got.extend(scanner.close())
        want = naive_with_neighbours(text, SMALL_ANCHORS, neighbours)
        # lines cut to MAX_LINE or longer than LONG_LINE always keep their neighbours
        long_lines = {
            i + 1 for i, line in enumerate(text.split(b"\n")) if len(line) > prefilter.MAX_LINE
        }
    assert [c.lineno for c in got] == [c.lineno for c in want]
    for g, w in zip(got, want, strict=True):
        if g.lineno in long_lines:
            assert g.grammar
            continue
        assert g == w


def test_anchor_split_at_every_offset() -> None:
    lines = [
        b"step 1 loss 0.3",
        b"x" * 40 + b"NCCL WARN NET/IB : Got completion",
        b"Root Cause",
        b"[rank0]: ncclInternalError: Internal check failed.\r",
        b"",
        b"tail",
    ]
    text = b"\n".join(lines)
    with params(LOOKAHEAD=2, MAX_LINE=32):
        for at in range(len(text) + 1):
            check(text, [text[:at], text[at:]], ANCHORS)
        check(text, [text[i : i + 1] for i in range(len(text))], ANCHORS)


@pytest.mark.parametrize(
    "text",
    [b"", b"\n", b"\n\n", b"abc", b"abc\n", b"\nabc", b"abc\r\n", b"x\rabc\r", b"abc\nabc\nabc"],
)
def test_edges(text: bytes) -> None:
    check(text, [text], SMALL_ANCHORS)
    check(text, chunked(text, list(range(len(text)))), SMALL_ANCHORS)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_numpy_newline_counts(data: st.DataObject) -> None:
    text = data.draw(logs(PIECES, b"xyz", 40))
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=6))
    prefilter.load_numpy()
    with params(
        _VECTOR=0, _DENSE=data.draw(st.integers(1, 50)), MAX_LINE=8, LONG_LINE=24, LOOKAHEAD=3
    ):
        check(text, chunked(text, cuts), SMALL_ANCHORS)


def test_line_of_many_megabytes_in_bounded_memory() -> None:
    """An 80 MiB line (anchor in the middle) between ordinary lines, fed in 8 MiB chunks."""
    chunk = 8 << 20
    filler = b"0123456789abcdef" * (chunk // 16)
    marked = filler[:-40] + b" NCCL WARN Bootstrap : no socket " + filler[-7:]
    head, tail = (
        b"ok 1\nok 2\nstart: ",
        b"\nafter 1\nRoot Cause (first observed failure):\nafter 3\n",
    )

    def chunks() -> Iterator[bytes]:
        yield head
        for i in range(10):
            yield marked if i == 5 else filler
        yield tail

    stats: dict[str, int] = {}
    tracemalloc.start()
    try:
        got = list(scan(chunks(), ANCHORS, stats))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * chunk  # the line is 10 chunks long
    assert stats == {"lines": 6, "bytes": len(head) + 10 * chunk + len(tail)}
    assert [c.lineno for c in got] == [3, 5]
    window = got[0].raw
    assert len(window) == prefilter.MAX_LINE
    assert window.startswith(filler[-40 - prefilter.MAX_LINE // 2 + 1 : -40])
    assert window[prefilter.MAX_LINE // 2 - 1 :].startswith(b" NCCL WARN Bootstrap : no socket ")
    assert got[0].before == (b"ok 1", b"ok 2")
    assert got[0].after == (b"after 1", b"Root Cause (first observed failure):", b"after 3")
    assert got[1].before == ((b"start: " + filler)[: prefilter.MAX_LINE], b"after 1")
    assert got[1].after == (b"after 3",)


def test_many_lines_of_megabytes_in_bounded_memory() -> None:
    """40 lines of 1.5 MiB, some with an anchor: the tail after a cut is set aside too."""
    line = b"y" * (3 << 19)
    hit = b"x" * (3 << 18) + b" CUDA error: an illegal memory access " + b"x" * (3 << 18)

    def chunks() -> Iterator[bytes]:
        for i in range(40):
            yield (hit if i % 7 == 3 else line) + b"\n"

    stats: dict[str, int] = {}
    tracemalloc.start()
    try:
        got = list(scan(chunks(), ANCHORS, stats))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * (8 << 20)  # 60 MiB of input; the peak is the same for 180 MiB
    assert [c.lineno for c in got] == [i + 1 for i in range(40) if i % 7 == 3]
    assert all(b" CUDA error: " in c.raw and len(c.raw) == prefilter.MAX_LINE for c in got)
    assert all(c.before == (line[: prefilter.MAX_LINE],) * 2 for c in got)
    assert stats["lines"] == 40


# ----------------------------------------------------------------------------- pushed chunks

FIXTURE_LOGS = sorted((Path(__file__).parent.parent / "fixtures" / "logs").glob("*.log"))


def timeout_line(rank: int, seq: int = 4812) -> bytes:
    return (
        f"[rank{rank}]:[E108 14:47:33.69012{rank}466 ProcessGroupNCCL.cpp:616] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        "NumelIn=41943040, NumelOut=41943040, Timeout(ms)=600000) ran for 600051 milliseconds "
        "before timing out.\n"
    ).encode()


def pushed(chunks: Iterable[bytes], anchors: tuple[str, ...] = ANCHORS) -> tuple[list, int]:
    scanner = Scanner(anchors)
    out: list[Candidate] = []
    for chunk in chunks:
        out += scanner.feed(chunk)
    out += scanner.close()
    return out, scanner.lines


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: p.name)
def test_scanner_gives_the_same_candidates_however_chunked(path: Path) -> None:
    data = path.read_bytes()
    expected, lines = pushed([data])
    assert expected, path.name
    rng = random.Random(path.name)
    for biggest in (1, 7, 300, len(data)):
        cuts = sorted(rng.randrange(len(data)) for _ in range(len(data) // biggest))
        assert pushed(chunked(data, cuts)) == (expected, lines), biggest


def test_scanner_unfinished_last_line_and_crlf() -> None:
    data = b"a\r\nb\r\n" + timeout_line(1).replace(b"\n", b"\r\n") + b"tail " + timeout_line(2)[:-1]
    got, lines = pushed(chunked(data, list(range(0, len(data), 5))))
    assert [c.lineno for c in got] == [3, 4] and lines == 4
    assert got[0].before == (b"a\r", b"b\r") and got[1].after == ()


def test_scanner_holds_a_candidate_until_its_lookahead_or_a_flush() -> None:
    scanner = Scanner()
    assert scanner.feed(b"step 1\n" + timeout_line(0) + b"step 2\n", now=10.0) == []
    assert scanner.oldest_pending == 10.0
    assert scanner.flush(found_before=9.9) == []
    [cand] = scanner.flush(found_before=10.0)
    assert (cand.lineno, cand.before, cand.after) == (2, (b"step 1",), (b"step 2",))
    assert scanner.oldest_pending is None
    scanner.feed(timeout_line(1), now=11.0)
    done = scanner.feed(b"".join(b"x\n" for _ in range(prefilter.LOOKAHEAD)), now=11.1)
    assert [c.lineno for c in done] == [4] and len(done[0].after) == prefilter.LOOKAHEAD


def test_scanner_keeps_a_window_of_an_endless_line_in_bounded_memory() -> None:
    scanner = Scanner()
    filler = b"\x00\xff binary garbage " * 4096
    scanner.feed(b"first\n")
    sent = 0
    tracemalloc.start()
    try:
        while sent < 3 * prefilter.LONG_LINE:
            scanner.feed(filler)
            sent += len(filler)
        scanner.feed(timeout_line(5)[:-1])  # the anchor arrives in the same endless line
        while sent < 30 * prefilter.LONG_LINE:
            scanner.feed(filler)
            sent += len(filler)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * prefilter.LONG_LINE  # 30 MiB went by
    [cand] = scanner.feed(b"\nafter\n") + scanner.close()
    assert cand.lineno == 2 and cand.before == (b"first",) and cand.after == (b"after",)
    assert len(cand.raw) == prefilter.MAX_LINE and b"Watchdog caught" in cand.raw
    assert scanner.lines == 3


def test_scanner_skip_keeps_line_numbers_and_forgets_the_context() -> None:
    scanner = Scanner()
    assert scanner.feed(b"one\n" + timeout_line(0) + b"two\nthree-sta") == []
    # dropped: "rt\n" + 10 lines + "eleven-sta"; the analyser got the tail
    held = scanner.skip(3 + 10 * 5 + 10, 11, b"eleven-sta")
    assert [c.lineno for c in held] == [2] and held[0].after == (b"two", b"three-sta")
    assert scanner.history.first_line is None
    out = scanner.feed(b"rt\n" + timeout_line(1)) + scanner.close()
    # one, timeout, two, three..., 10 dropped lines, eleven-start, timeout
    assert [c.lineno for c in out] == [16]
    assert out[0].before == (b"eleven-start",)
    assert [n for n, _ in scanner.history.lines(1, 100)] == [15, 16]


# ----------------------------------------------------------------------------- history


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_history_holds_the_latest_lines_exactly(data: st.DataObject) -> None:
    text = data.draw(logs(PIECES, b"xyz", 30))
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=10))
    limit = data.draw(st.integers(0, 400))
    scanner = Scanner(SMALL_ANCHORS, history=limit)
    with params(MAX_LINE=8, LONG_LINE=24, LOOKAHEAD=3):
        for chunk in chunked(text, cuts):
            scanner.feed(chunk)
        scanner.close()
        lines = text.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        first = scanner.history.first_line
        held = scanner.history.lines(1, len(lines) + 5)
        if not lines:
            assert held == []
            return
        assert first is not None and held and held[-1][0] == len(lines)
        assert [n for n, _ in held] == list(range(first, len(lines) + 1))
        assert all(raw == lines[n - 1][: prefilter.MAX_LINE] for n, raw in held)
        assert held == scanner.history.lines(first, len(lines) + 1)
        mid = (first + len(lines)) // 2
        assert scanner.history.lines(mid, mid + 2) == [x for x in held if mid <= x[0] < mid + 2]


@given(
    lines=st.lists(st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")), min_size=1),
    newline_at_end=st.booleans(),
    data=st.data(),
)
def test_a_dense_range_split_at_its_newlines_gives_the_lines_searched_one_by_one(
    lines: list[bytes], newline_at_end: bool, data: st.DataObject
) -> None:
    """The split of a small dense range finds each offset's line as the search before and
    after it does, with the line's index in the range and the range's newlines."""
    body = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    buf = b"head\n" + body + b"tail"
    start, end = 5, 5 + len(body)
    offsets = [i for i in range(start, end) if buf[i] != 10]
    if not offsets:
        return
    found = sorted(data.draw(st.sets(st.sampled_from(offsets), min_size=1)))
    split, newlines = prefilter._lines_split(buf, start, end, found)

    def line_of(at: int) -> tuple[int, int, int]:
        """As the search before and after an offset finds it (the range's last byte ends a
        last line without a newline)."""
        before, after = buf.rfind(b"\n", start, at), buf.find(b"\n", at, end)
        return at, before + 1 if before >= 0 else start, after if after >= 0 else end - 1

    assert [(r[0], r[2], r[3]) for r in split] == [
        line_of(at) for at in _first_per_line(buf, start, found)
    ]
    assert [r[1] for r in split] == [buf.count(b"\n", start, r[2]) for r in split]
    assert newlines == buf.count(b"\n", start, end)


def _first_per_line(buf: bytes, start: int, found: list[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for at in found:
        line = buf.count(b"\n", start, at)
        if line not in seen:
            seen.add(line)
            out.append(at)
    return out
