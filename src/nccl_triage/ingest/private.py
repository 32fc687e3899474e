"""Files kept between runs under the user's cache directory, only where that is safe.

Input: a name under ``$XDG_CACHE_HOME/nccl-triage/`` (else ``~/.cache/...``). Output: its
directory, created private to the user (None when it cannot be trusted: another owner,
writable by others, not a directory), the bytes of a file in it (None unless a regular file,
not a symbolic link, owned by the user and writable by no one else, of a bounded size), and
atomic writes (a private temporary file renamed into place). What the bytes mean, and whether
they still hold, is the caller's to check: the Hyperscan databases and the parsed rule files.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/nccl-triage``, or ``~/.cache/nccl-triage``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nccl-triage"


def cache_dir(name: str, create: bool = True) -> Path | None:
    """The directory ``name`` of the cache, private to the user; None when not trusted."""
    path = cache_root() / name
    try:
        if create:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not private(st) or not stat.S_ISDIR(st.st_mode):
        return None
    return path


def private(st: os.stat_result) -> bool:
    """Owned by the user running us and writable by no one else."""
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_private(path: Path, most: int) -> bytes | None:
    """A private regular file's bytes (at most ``most`` of them), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or not private(st) or st.st_size > most:
            return None
        return fh.read(most + 1)


def write_atomic(path: Path, data: bytes, suffix: str) -> bool:
    """Store ``data`` at ``path`` through a private temporary file; best effort."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=suffix)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
