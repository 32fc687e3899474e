"""Files under the user's cache directory: used only when private, written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nccl_triage.ingest.private import cache_dir, read_private, write_atomic


def test_the_cache_directory_is_made_private_and_refused_when_others_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = cache_dir("x")
    assert made == tmp_path / "nccl-triage" / "x" and (made.stat().st_mode & 0o777) == 0o700
    assert cache_dir("y", create=False) is None  # (not there, not made)
    made.chmod(0o777)
    assert cache_dir("x") is None
    made.chmod(0o700)
    (tmp_path / "nccl-triage" / "link").symlink_to(made)
    assert cache_dir("link") is None


def test_a_file_is_read_only_when_private_regular_and_small(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert write_atomic(path, b"data", ".tmp")
    assert read_private(path, 100) == b"data"
    assert read_private(path, 2) is None  # larger than asked
    assert read_private(tmp_path / "absent", 100) is None
    (tmp_path / "link").symlink_to(path)
    assert read_private(tmp_path / "link", 100) is None
    path.chmod(0o620)
    assert read_private(path, 100) is None
    assert not write_atomic(tmp_path / "no-dir" / "f", b"data", ".tmp")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_the_owner_must_be_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    assert write_atomic(path, b"data", ".tmp")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(path).st_uid + 1)
    assert read_private(path, 100) is None
