"""The Hyperscan database cache on disk: used when private and intact, never trusted otherwise,
written atomically, bounded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nccl_triage.ingest import hsdb

pytestmark = pytest.mark.skipif(
    hsdb.hyperscan_module() is None, reason="hyperscan is not installed here"
)

EXPRESSIONS = (hsdb.literal_expression(b"NCCL WARN"), rb"\.(?:h|c):\d+ +WARN\b")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    hsdb.load_database.cache_clear()
    yield tmp_path / "nccl-triage" / "scan"
    hsdb.load_database.cache_clear()


def matches(db: object, data: bytes) -> list[int]:
    found: list[int] = []
    db.scan(  # type: ignore[attr-defined]
        data,
        match_event_handler=lambda i, f, t, fl, c: found.append(i),
        scratch=hsdb.scratch_for(db),
    )
    return found


def compiled_count(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = hsdb._compile

    def counting(hs: object, expressions: tuple[bytes, ...]) -> object:
        calls.append(len(expressions))
        return real(hs, expressions)

    monkeypatch.setattr(hsdb, "_compile", counting)
    return calls


def load_fresh() -> object:
    hsdb.load_database.cache_clear()
    return hsdb.load_database(EXPRESSIONS)


def test_a_database_is_compiled_once_then_read_from_disk(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = compiled_count(monkeypatch)
    db = load_fresh()
    [stored] = cache.glob("*.hsdb")
    assert calls == [2]
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert oct(stored.stat().st_mode & 0o777) == "0o600"
    assert not list(cache.glob(".tmp-*"))  # written to a temporary name, renamed
    again = load_fresh()
    assert calls == [2]  # read back, not compiled
    assert (
        matches(again, b"x NCCL WARN y\ninit.c:12 WARN z\n")
        == matches(db, b"x NCCL WARN y\ninit.c:12 WARN z\n")
        == [0, 1]
    )


def test_the_file_name_depends_on_every_expression(cache: Path) -> None:
    hsdb.load_database(EXPRESSIONS)
    hsdb.load_database(EXPRESSIONS[:1])
    hsdb.load_database((EXPRESSIONS[1], EXPRESSIONS[0]))
    assert len(list(cache.glob("*.hsdb"))) == 3


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # truncated
        lambda b: b[:-5] + bytes(x ^ 0xFF for x in b[-5:]),  # altered
        lambda b: b"not a database",
        lambda b: b"",
        lambda b: b[:40],  # the header only
    ],
)
def test_a_damaged_file_is_compiled_again_and_replaced(
    cache: Path, monkeypatch: pytest.MonkeyPatch, damage: object
) -> None:
    load_fresh()
    [stored] = cache.glob("*.hsdb")
    good = stored.read_bytes()
    stored.write_bytes(damage(good))  # type: ignore[operator]
    calls = compiled_count(monkeypatch)
    assert matches(load_fresh(), b"NCCL WARN") == [0]
    assert calls == [2]
    assert stored.read_bytes() == good


def test_a_file_others_may_write_is_not_read(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_fresh()
    [stored] = cache.glob("*.hsdb")
    stored.chmod(0o620)
    calls = compiled_count(monkeypatch)
    load_fresh()
    assert calls == [2]


def test_a_symbolic_link_is_not_followed(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    load_fresh()
    [stored] = cache.glob("*.hsdb")
    elsewhere = tmp_path / "elsewhere.hsdb"
    stored.rename(elsewhere)
    stored.symlink_to(elsewhere)
    calls = compiled_count(monkeypatch)
    load_fresh()
    assert calls == [2]
    assert not stored.is_symlink()  # replaced by a real file


def test_a_directory_others_may_write_is_not_used(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    calls = compiled_count(monkeypatch)
    load_fresh()
    load_fresh()
    assert calls == [2, 2]
    assert not list(cache.glob("*.hsdb"))


def test_an_unwritable_cache_only_costs_a_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert matches(load_fresh(), b"NCCL WARN") == [0]
    hsdb.load_database.cache_clear()


def test_old_databases_are_pruned(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsdb, "_KEEP", 3)
    for i in range(5):
        hsdb.load_database((hsdb.literal_expression(f"anchor {i}".encode()),))
        for f in cache.glob("*.hsdb"):
            os.utime(f, (f.stat().st_mtime - 10, f.stat().st_mtime - 10))  # older than the next
    assert len(list(cache.glob("*.hsdb"))) == 3


@given(st.binary(max_size=64))
def test_every_byte_but_ascii_letters_and_digits_is_escaped(literal: bytes) -> None:
    expected = b"".join(
        bytes([b]) if b < 128 and chr(b).isalnum() else b"\\x%02x" % b for b in literal
    )
    assert hsdb.literal_expression(literal) == expected


def test_literals_are_escaped_byte_by_byte() -> None:
    assert hsdb.literal_expression(b"a.b(") == rb"a\x2eb\x28"
    assert hsdb.literal_expression("é".encode()) == rb"\xc3\xa9"
    assert hsdb.compiles(hsdb.literal_expression(b"[x]{2} $^"))
    assert not hsdb.compiles(b"a|")  # matches the empty string
