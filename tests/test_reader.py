"""reader.py: bytes to numbered lines, compression, carriage returns, ANSI codes, input errors."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage.errors import InputError
from nccl_triage.ingest.reader import (
    chunks_of,
    iter_chunks,
    iter_lines,
    lines_from_bytes,
    open_binary,
    segment_bounds,
    segments,
    strip_ansi,
)
from nccl_triage.model import Report
from nccl_triage.pipeline import Triage, parse_path
from nccl_triage.ruleset import Ruleset

LOG = Path(__file__).parent / "data" / "two-ranks-allreduce-timeout.log"


def physical_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """Cut the bytes into chunks, as a reader would hand them on (never an empty chunk)."""
    bounds = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]
    return [p for p in pieces if p]


def parse_bytes(chunks: list[bytes]) -> Report:
    """What parse_text and parse_path do with the bytes, chunk boundaries included."""
    triage = Triage(Ruleset(rules=[], signals=[]), "<bytes>", diagnose=False)
    for chunk in chunks:
        triage.feed(chunk)
    triage.close()
    return triage.report()


def summary(result: Report) -> list[dict[str, object]]:
    return [{**e.to_dict(), "source": e.source} for e in result.events]


# ----------------------------------------------------------------------------- properties

LOGGY = st.lists(
    st.sampled_from(
        [
            b"\n",
            b"\r",
            b"\r\n",
            b"\x1b[31m",
            b"[0m",
            b"\xff\xfe",
            b"\xe2\x96",  # a UTF-8 sequence cut short
            b"[rank3]:",
            b"[E1022 10:11:12.1 ProcessGroupNCCL.cpp:1] ",
            b"[Rank 3] Watchdog caught collective operation timeout: ",
            b"WorkNCCL(SeqNum=4, OpType=ALLREDUCE, Timeout(ms)=600000)",
            b" ran for 600006 milliseconds before timing out.",
            b"Root Cause (first observed failure):",
            b"  rank      : 3 (local_rank: 3)",
            b"NCCL error",
            b'{"log": "x\\n"}',
            b"x",
        ]
    ),
    max_size=40,
).map(b"".join)
BYTES = st.one_of(st.binary(max_size=400), LOGGY)


@settings(max_examples=200, deadline=None)
@given(data=BYTES, cuts=st.lists(st.integers(0, 400), max_size=4))
def test_lines_from_bytes_numbers_physical_lines(data: bytes, cuts: list[int]) -> None:
    lines = list(lines_from_bytes(split(data, cuts), "<bytes>"))
    numbers = [line.lineno for line in lines]
    assert sorted(set(numbers)) == list(range(1, physical_lines(data) + 1))
    assert numbers == sorted(numbers)
    assert all("\n" not in line.text and "\r" not in line.text for line in lines)
    # chunk boundaries change nothing
    assert [(x.lineno, x.text) for x in lines] == [
        (x.lineno, x.text) for x in lines_from_bytes([data], "<bytes>")
    ]


@settings(max_examples=200, deadline=None)
@given(data=BYTES, cuts=st.lists(st.integers(0, 400), max_size=4))
def test_parse_never_raises_and_counts_lines(data: bytes, cuts: list[int]) -> None:
    result = parse_bytes(split(data, cuts))
    assert result.lines == physical_lines(data)
    assert all(1 <= e.line <= result.lines for e in result.events)
    assert summary(result) == summary(parse_bytes([data]))


# ----------------------------------------------------------------------------- segments, ANSI


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"plain", ["plain"]),
        (b"", [""]),
        (b"crlf\r", ["crlf"]),
        (b"a\rb", ["a", "b"]),
        (b"10%\r20%\r\rdone\r", ["10%", "20%", "done"]),
        (b"\r", [""]),
        (b"\x1b[32mgreen\x1b[0m", ["green"]),
        (b"bad \xff byte", ["bad \ufffd byte"]),
    ],
)
def test_segments(raw: bytes, expected: list[str]) -> None:
    assert segments(raw) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x1b[1;31m[rank0]:\x1b[0m msg", "[rank0]: msg"),
        ("[1;31m[rank0]:[0m msg", "[rank0]: msg"),  # the ESC byte lost on the way
        ("\x1b]0;title\x07text", "text"),
        ("\x1b[2K\x1b[1Gredrawn", "redrawn"),
        (
            "[rank0]:[E ProcessGroupNCCL.cpp:1] [Rank 0]",
            "[rank0]:[E ProcessGroupNCCL.cpp:1] [Rank 0]",
        ),
    ],
)
def test_strip_ansi(text: str, expected: str) -> None:
    assert strip_ansi(text) == expected


LINE_PIECES = [
    b"a",
    b"x y",
    b"\r",
    b"\r\r",
    b"[",
    b"0",
    b"1;2",
    b"m",
    b"[0m",
    b"[1;31m",
    b"\x1b[31m",
    b"\x1b]0;title\x07",
    "█".encode(),
    "٣".encode(),  # an Arabic-Indic digit: "[٣m" is a code to strip_ansi
    b"[\xd9\xa3m",
    b"\xff",
    b"\xc3",
    b"{'loss': 3.9}",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(LINE_PIECES), max_size=14))
def test_segment_bounds_are_the_segments_when_given(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    bounds = segment_bounds(raw)
    if bounds is not None:
        assert [raw[a:b].decode("utf-8") for a, b in bounds] == segments(raw)
    plain = b"\x1b" not in raw and b"m" not in raw
    if plain and (raw.isascii() or (b"\xff" not in raw and b"\xc3" not in raw)):
        assert bounds is not None  # most lines: no decoding, no codes


def test_segment_bounds_of_a_redrawn_bar() -> None:
    raw = "[default0]:\r 10%|█ | 1/10 [00:01<00:09]\r{'loss': 3.9}\r\r".encode()
    assert [raw[a:b].decode() for a, b in segment_bounds(raw) or []] == [
        "[default0]:",
        " 10%|█ | 1/10 [00:01<00:09]",
        "{'loss': 3.9}",
    ]
    assert segment_bounds(b"\x1b[31mred") is None
    assert segment_bounds(b"plain [0m text") is None
    assert segment_bounds(b"bad \xff byte") is None
    assert segment_bounds(b"\r\r") == [(0, 0)]


def test_iter_lines_keeps_physical_numbers(tmp_path: Path) -> None:
    path = tmp_path / "cr.log"
    path.write_bytes(b"one\r\n50%\r100%\r\n\nlast without newline")
    got = [(x.lineno, x.text) for x in iter_lines(str(path))]
    assert got == [(1, "one"), (2, "50%"), (2, "100%"), (3, ""), (4, "last without newline")]


# ----------------------------------------------------------------------------- compression

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".zst": lambda b: zstandard.ZstdCompressor().compress(b),
}


def test_fixture_log_events() -> None:
    result = parse_path(str(LOG))
    assert result.lines == 9
    assert [(e.kind, e.line, e.rank) for e in result.events] == [
        ("watchdog_timeout", 3, 1),
        ("watchdog_timeout", 5, 0),
        ("teardown", 6, 1),
        ("terminate", 7, None),
        ("agent_signal", 8, None),
        ("worker_failed", 9, None),
    ]


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_compressed_input_gives_the_same_events(tmp_path: Path, suffix: str) -> None:
    data = LOG.read_bytes()
    plain = parse_path(str(LOG))
    path = tmp_path / f"job{suffix}"
    path.write_bytes(COMPRESSORS[suffix](data))
    packed = parse_path(str(path))
    assert (packed.lines, [e.to_dict() for e in packed.events]) == (
        plain.lines,
        [e.to_dict() for e in plain.events],
    )
    assert {e.source for e in packed.events} == {str(path)}
    # recognised by its bytes, whatever the name; and through standard input
    misnamed = tmp_path / "job.log"
    misnamed.write_bytes(path.read_bytes())
    assert [e.to_dict() for e in parse_path(str(misnamed)).events] == [
        e.to_dict() for e in plain.events
    ]
    piped = parse_path("-", stdin=io.BytesIO(path.read_bytes()))
    assert [e.to_dict() for e in piped.events] == [e.to_dict() for e in plain.events]
    assert {e.source for e in piped.events} == {"<stdin>"}


def test_compressed_lines_match_plain(tmp_path: Path) -> None:
    path = tmp_path / "job.gz"
    path.write_bytes(gzip.compress(LOG.read_bytes()))
    assert [(x.lineno, x.text) for x in iter_lines(str(path))] == [
        (x.lineno, x.text) for x in iter_lines(str(LOG))
    ]


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_truncated_archive_is_a_one_line_input_error(tmp_path: Path, suffix: str) -> None:
    packed = COMPRESSORS[suffix](LOG.read_bytes() * 20)
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(InputError) as info:
        parse_path(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    assert info.value.loc == str(path)


def test_truncated_gzip_message() -> None:
    data = gzip.compress(LOG.read_bytes())
    with pytest.raises(InputError, match=r"^<stdin>: truncated gzip data$"):
        parse_path("-", stdin=io.BytesIO(data[:60]))


def test_directory_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r": is a directory$") as info:
        parse_path(str(tmp_path))
    assert info.value.loc == str(tmp_path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    with pytest.raises(InputError) as info:
        list(iter_lines(str(missing)))
    assert str(info.value) == f"{missing}: no such file"


def test_empty_input(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    result = parse_path(str(path))
    assert (result.lines, result.events, result.unparsed) == (0, [], [])
    assert list(iter_lines(str(path))) == []


def _read_all(path: Path, size: int) -> tuple[list[bytes], str | None]:
    """What reading a file as chunks gives: the chunks, or the error's message."""
    got: list[bytes] = []
    try:
        with open_binary(str(path)) as fh:
            got.extend(iter_chunks(fh, size))
    except InputError as exc:
        return got, str(exc)
    return got, None


def _chunks_all(data: bytes, name: str, size: int) -> tuple[list[bytes], str | None]:
    got: list[bytes] = []
    try:
        got.extend(chunks_of(data, name, size))
    except InputError as exc:
        return got, str(exc)
    return got, None


@pytest.mark.parametrize("suffix", ["", *COMPRESSORS])
@pytest.mark.parametrize("cut", [False, True])
def test_bytes_in_memory_read_as_their_file(tmp_path: Path, suffix: str, cut: bool) -> None:
    """A file's bytes already in memory read as the file itself: the same chunks of the same
    size, decompressed alike, a truncated archive the same error naming the file."""
    data = LOG.read_bytes() * 40
    packed = COMPRESSORS[suffix](data) if suffix else data
    if cut:
        packed = packed[: len(packed) // 2]
    path = tmp_path / f"job.log{suffix}"
    path.write_bytes(packed)
    for size in (4096, 1 << 20):
        expected = _read_all(path, size)
        assert _chunks_all(packed, str(path), size) == expected
        assert (expected[1] is not None) == (cut and bool(suffix))


@given(st.binary(max_size=300), st.integers(1, 64))
def test_plain_bytes_in_memory_come_in_chunks_of_the_size_asked(data: bytes, size: int) -> None:
    if data.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")):
        return
    chunks = list(chunks_of(data, "x", size))
    assert b"".join(chunks) == data
    assert all(len(c) == size for c in chunks[:-1]) and all(chunks)
