"""The candidate scan done by the live pump (a Prescanner) gives the analyser's scanner the same
candidates as its own scan, whatever the chunking, and a scan of another range is not used;
the pump holds a larger backlog while the analyser starts, and scans once the analyser has
said what for."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from nccl_triage.ingest import hsdb
from nccl_triage.ingest.engines import HyperscanEngine
from nccl_triage.ingest.scan import Candidate, Prescanned, Prescanner, Scanner
from nccl_triage.live.link import FRAME_DATA, FRAME_HITS, AnalyserLink, FrameReader, announce
from nccl_triage.live.triage import LiveTriage
from nccl_triage.pipeline import Triage, triage_path, triage_text
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import Ruleset, load_ruleset

pytestmark = pytest.mark.skipif(
    hsdb.hyperscan_module() is None, reason="hyperscan is not installed here"
)


@pytest.fixture(autouse=True)
def _hyperscan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "hyperscan")


RULESET = load_ruleset()
ANCHORS, NEIGHBOURS = Triage(RULESET).scan_anchors()

PIECES = [
    b"[default3]:[rank3]:[E1022 10:11:12.123456789 ProcessGroupNCCL.cpp:632] ",
    b"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)",
    b"{'loss': 0.0, 'grad_norm': 1.41}",
    b"Saving model checkpoint to /ckpt/checkpoint-500",
    b"torch.OutOfMemoryError: CUDA out of memory.",
    b"node1:123:456 [0] NCCL INFO NET/IB : No device found.",
    b"  1%|          | 20/1752 [00:57<1:22:40,  2.86s/it]\r",
    b"plain output",
    b"Watchdog caught collective operati",  # an anchor cut by a terminal wrap
    b"\x1b[32m",
    b"\n",
    b"\n",
    b"\n",
]


def stream(pieces: list[int]) -> bytes:
    return b"".join(PIECES[i % len(PIECES)] for i in pieces)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def scanned(
    chunks: list[bytes], pres: list[Prescanned | None] | None = None
) -> tuple[list[Candidate], int]:
    scanner = Scanner(ANCHORS, neighbours=NEIGHBOURS)
    out: list[Candidate] = []
    for i, chunk in enumerate(chunks):
        out += scanner.feed(chunk, pre=pres[i] if pres else None)
    out += scanner.close()
    return out, scanner.lines


def prescans(chunks: list[bytes]) -> Iterator[Prescanned | None]:
    prescanner = Prescanner.make(ANCHORS, NEIGHBOURS)
    assert prescanner is not None
    starts_line = True
    for chunk in chunks:
        yield prescanner.scan(chunk, starts_line)
        starts_line = chunk.endswith(b"\n") if chunk else starts_line


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(st.integers(0, 100), max_size=120),
    cuts=st.lists(st.integers(0, 10**5), max_size=12),
    withheld=st.sets(st.integers(0, 12)),
    wrong=st.sets(st.integers(0, 12)),
)
def test_the_pumps_scan_gives_the_scanners_candidates(
    pieces: list[int], cuts: list[int], withheld: set[int], wrong: set[int]
) -> None:
    """Some chunks come without their scan, some with the scan of another range (as if the
    line had started elsewhere): those are scanned again; the candidates are the same."""
    chunks = chunked(stream(pieces), cuts)
    prescanner = Prescanner.make(ANCHORS, NEIGHBOURS)
    assert prescanner is not None
    pres: list[Prescanned | None] = []
    for i, (chunk, pre) in enumerate(zip(chunks, prescans(chunks), strict=True)):
        if i in wrong and pre is not None:
            pre = prescanner.scan(chunk, pre.start != 0)  # the other line start
        pres.append(None if i in withheld else pre)
    assert scanned(chunks, pres) == scanned(chunks)


def test_the_pumps_scan_spares_the_scanners(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk that comes with its scan is not scanned again (only a line joined across
    chunks is)."""
    data = stream(list(range(60)) * 20)
    chunks = chunked(data, list(range(0, len(data), 997)))
    pres = list(prescans(chunks))
    assert all(pre is not None for pre in pres[1:])
    scanned_bufs: list[int] = []
    marked_hits = HyperscanEngine.marked_hits

    def spy(self: HyperscanEngine, buf: bytes, *args: Any) -> list[int]:
        scanned_bufs.append(id(buf))
        return marked_hits(self, buf, *args)

    monkeypatch.setattr(HyperscanEngine, "marked_hits", spy)
    got = scanned(chunks, pres)
    assert not {id(c) for c in chunks} & set(scanned_bufs)
    assert scanned_bufs  # the joined lines were
    monkeypatch.undo()
    assert got == scanned(chunks)


def test_a_scan_is_used_where_it_fits() -> None:
    """A line's anchors are only found by the scan given: a scan found elsewhere is used."""
    data = b"Watchdog caught collective operation timeout\nplain\n"
    empty = Prescanned(0, len(data), [], [], True)
    assert scanned([data], [empty])[0] == []  # the scan said nothing: nothing
    assert scanned([data])[0] != []
    moved = Prescanned(1, len(data), [], [], True)  # another range: scanned again
    assert scanned([data], [moved]) == scanned([data])


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 2**40),
    found=st.lists(st.integers(0, 2**40)),
    marked=st.lists(st.integers(0, 2**40)),
    marking=st.booleans(),
    junk=st.binary(max_size=64),
)
def test_a_scan_is_plain_bytes_and_read_back_or_refused(
    start: int, found: list[int], marked: list[int], marking: bool, junk: bytes
) -> None:
    end = max([start + 1, *(x + 1 for x in found + marked)])
    found, marked = sorted(x for x in found if x >= start), sorted(x for x in marked if x >= start)
    pre = Prescanned(start, end, found, marked, marking)
    assert Prescanned.decode(pre.encode()) == pre
    if len(set(found)) >= 2:  # offsets out of order
        assert Prescanned.decode(Prescanned(start, end, found[::-1], [], True).encode()) is None
    outside = Prescanned(start, start + 1, [], [start + 1], marking)  # past the range
    assert Prescanned.decode(outside.encode()) is None
    got = Prescanned.decode(junk)  # never raises: a scan of the range given, or None
    assert got is None or all(got.start <= x < got.end for x in got.found + got.marked)


def live_report(path: Path, ruleset: Ruleset, prescan: bool) -> dict[str, Any]:
    data = path.read_bytes()
    live = LiveTriage(str(path), ruleset, lambda r, s: None)
    prescanner = Prescanner.make(*live.triage.scan_anchors())
    assert prescanner is not None
    starts_line = True
    for chunk in chunked(data, list(range(0, len(data), 4093))):
        pre = prescanner.scan(chunk, starts_line) if prescan else None
        starts_line = chunk.endswith(b"\n")
        live.feed(chunk, pre)
    return report_json(live.finish(), ruleset.template_dirs)


@pytest.mark.parametrize("log", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_live_triage_with_the_pumps_scan_equals_triage(log: str) -> None:
    path = FIXTURES / log
    want = report_json(triage_path(str(path), RULESET), RULESET.template_dirs)
    got = live_report(path, RULESET, prescan=True)
    assert got == want
    assert live_report(path, RULESET, prescan=False) == want


# ----------------------------------------------------------------------------- the link


class Analyser:
    """An analyser process stand-in: the test reads what the link sends, and speaks for it."""

    def __init__(self) -> None:
        self._in_r, in_w = os.pipe()
        out_r, self._out_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", "pass"])
        self.proc.wait()
        self.proc.stdin = os.fdopen(in_w, "wb", buffering=0)  # type: ignore[assignment]
        self.proc.stdout = os.fdopen(out_r, "rb", buffering=0)  # type: ignore[assignment]
        self._reader = FrameReader()

    def say(self, anchors: tuple[str, ...], neighbours: tuple[str, ...] | None) -> None:
        """What the analyser says once it has started; then its output ends."""
        announce(anchors, neighbours, fd=self._out_w)  # (points it at /dev/null after)
        self._close_out()

    def say_raw(self, said: bytes) -> None:
        os.write(self._out_w, said)
        self._close_out()

    def _close_out(self) -> None:
        if self._out_w >= 0:
            os.close(self._out_w)
            self._out_w = -1

    def close(self) -> None:
        self._close_out()
        os.close(self._in_r)

    def frames(self) -> list[tuple[bytes, bytes]]:
        os.set_blocking(self._in_r, False)
        reader, out = self._reader, []
        while True:
            try:
                chunk = os.read(self._in_r, 1 << 20)
            except BlockingIOError:
                return out
            if not chunk:
                return out
            out += list(reader.push(chunk))


def lines_of(n: int, size: int = 1 << 20) -> bytes:
    line = b"[rank0]: Watchdog caught collective operation timeout " + b"x" * 60 + b"\n"
    return (line * (size // len(line) + 1))[:size]


def test_the_pump_holds_more_while_the_analyser_starts_and_scans_once_told() -> None:
    analyser = Analyser()
    link = AnalyserLink(analyser.proc, limit=4 << 20, starting=16 << 20)
    chunk = lines_of(1)
    for _ in range(12):  # the analyser reads nothing: 12 MiB wait, more than the limit
        link.send(chunk)
    assert link.dropped_bytes == 0
    for _ in range(8):
        link.send(chunk)
    assert 0 < link.dropped_bytes <= 8 << 20  # past the starting backlog: the oldest go
    analyser.say(ANCHORS, NEIGHBOURS)
    link.hear()
    assert link.hear_fd is None
    frames = []
    for _ in range(6):
        frames += analyser.frames()
        link.pump()
    kinds = [k for k, _ in frames]
    assert kinds[0] == FRAME_DATA  # written in part before the analyser spoke: unscanned
    assert FRAME_HITS in kinds
    for i, kind in enumerate(kinds):
        if kind == FRAME_HITS and i + 1 < len(kinds):  # each just before the data it is of
            assert kinds[i + 1] == FRAME_DATA
            pre = Prescanned.decode(frames[i][1])
            data = frames[i + 1][1]
            assert pre is not None and pre.found and pre.end == data.rfind(b"\n") + 1
    link.spare = False  # the pump is busy: what it sends goes unscanned
    frames = []
    for _ in range(4):
        frames += analyser.frames()
        link.pump()
    kinds = [k for k, _ in frames]  # (the frame being written may still be a scan's)
    assert kinds.count(FRAME_DATA) >= 3 and kinds.count(FRAME_HITS) <= 1
    link.kill()
    analyser.close()


def test_a_link_to_an_analyser_that_says_nothing_useful_scans_nothing() -> None:
    for said in (b"not json\n", b'{"anchors": [1], "neighbours": null}\n', b""):
        analyser = Analyser()
        link = AnalyserLink(analyser.proc)
        analyser.say_raw(said)
        link.hear()
        link.hear()
        assert link.hear_fd is None
        link.send(lines_of(1, 4096))
        link.pump()
        assert FRAME_HITS not in [k for k, _ in analyser.frames()]
        link.kill()
        analyser.close()


@pytest.mark.parametrize("log_name", sorted(p.name for p in FIXTURES.glob("*.log"))[:2])
def test_watch_finds_what_triage_finds(tmp_path: Path, log_name: str) -> None:
    """End to end (a small log may all be sent before the analyser says what to scan for)."""
    log = FIXTURES / log_name
    report = tmp_path / "report.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "nccl_triage", "watch", "--report", str(report), "--format", "json"],
        input=log.read_bytes(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.stdout == log.read_bytes()
    final = json.loads(report.read_text(encoding="utf-8").splitlines()[-1])
    text = log.read_text(encoding="utf-8")
    want = report_json(triage_text(text, RULESET, source="<stdin>"), RULESET.template_dirs)
    del final["live"]
    assert final == want


def started_twelve_behind() -> tuple[Analyser, AnalyserLink]:
    """A link whose analyser started once 12 MiB were waiting for it (limit 4, starting 16)."""
    analyser = Analyser()
    link = AnalyserLink(analyser.proc, limit=4 << 20, starting=16 << 20)
    for _ in range(12):
        link.send(lines_of(1))
    analyser.say(ANCHORS, NEIGHBOURS)
    link.hear()
    return analyser, link


def test_the_starting_backlog_goes_once_the_analyser_falls_behind_after_it_started() -> None:
    analyser, link = started_twelve_behind()
    chunk = lines_of(1)
    for _ in range(7):  # it read nothing: the job prints faster than it reads
        link.send(chunk)
    assert link.dropped_bytes > 0
    link.send(chunk)
    assert link._queued <= 4 << 20  # the usual limit again
    link.kill()
    analyser.close()


def test_the_starting_backlog_goes_once_the_analyser_has_caught_up() -> None:
    analyser, link = started_twelve_behind()
    chunk = lines_of(1)
    while link._queued:  # the analyser reads it all
        analyser.frames()
        link.pump()
    link.send(b"one line\n")  # started...
    link.send(b"one line\n")  # ...and caught up
    for _ in range(8):  # it reads nothing again: the usual limit holds
        link.send(chunk)
    assert link.dropped_bytes > 0 and link._queued <= 4 << 20
    link.kill()
    analyser.close()


def test_a_scan_that_fails_leaves_the_data_to_go_unscanned(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    analyser = Analyser()
    link = AnalyserLink(analyser.proc)
    analyser.say(ANCHORS, NEIGHBOURS)
    link.hear()

    def broken(self: Prescanner, data: bytes, starts_line: bool) -> None:
        raise MemoryError("out of scratch")

    monkeypatch.setattr(Prescanner, "scan", broken)
    link.send(lines_of(1, 4096))
    link.send(lines_of(1, 4096))
    kinds = [k for k, _ in analyser.frames()]
    assert kinds == [FRAME_DATA, FRAME_DATA]
    assert capfd.readouterr().err.count("cannot scan for the analysis") == 1
    link.kill()
    analyser.close()


def test_an_analyser_that_never_starts_does_not_keep_the_starting_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nccl_triage.live import link as link_module

    monkeypatch.setattr(link_module, "CATCH_UP_S", 0.0)
    analyser = Analyser()
    link = AnalyserLink(analyser.proc, limit=4 << 20, starting=16 << 20)
    for _ in range(10):  # it says nothing and reads nothing
        link.send(lines_of(1))
    assert link.dropped_bytes > 0
    link.kill()
    analyser.close()
