"""The result cache: job results in SQLite, keyed by content, ruleset and code versions.

Input: jobs and their results. Output: results of unchanged jobs without triaging them again
(a rerun over a growing archive only triages what is new or changed). The run's process
writes it (:class:`ResultCache`); worker processes read it (:class:`ReadOnlyCache`) to look
up the jobs they hash themselves.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from nccl_triage import __version__
from nccl_triage.batch.inputs import (
    CACHE_KEEP_DAYS,
    CACHE_SCHEMA,
    InputFile,
    Job,
    JobResult,
    optional_module,
    os_error_reason,
)
from nccl_triage.errors import InputError
from nccl_triage.ingest.private import cache_root

# ----------------------------------------------------------------------------- cache


_HASH_CHUNK = 1 << 20
FileKey = tuple[str, int, int, int]  # a file's real path, size, mtime (ns) and inode
PRELOAD_FILES = 100_000  # remembered files read in one query up to this many (about 40 MB)
# Remembered files whose path is gone are dropped at the end of a run once the table holds more
# than this many rows and twice as many as after the last time (so a table of files that all
# exist is not looked through again at every run).
PRUNE_FILES_AFTER = 20_000


def file_digest(path: str) -> str:
    """The SHA-256 of a file's bytes (raises OSError)."""
    return read_digest(path, 0)[0]


def read_digest(path: str, hold: int) -> tuple[str, bytes | None]:
    """The SHA-256 of a file's bytes, and the bytes when there are at most ``hold`` of them.

    Raises:
        OSError: the file cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        h = hashlib.sha256()  # (hashlib.file_digest allocates 256 KiB a call: logs are small)
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1) if hold > 0 and size <= hold else b""  # (all, at once)
        h.update(data)
        whole = bool(data) or size == 0
        while chunk := os.read(fd, _HASH_CHUNK):  # (a big file; or one that grew meanwhile)
            h.update(chunk)
            whole = False
        return h.hexdigest(), data if whole and hold > 0 else None
    finally:
        os.close(fd)


def cacheable(result: JobResult) -> bool:
    """Whether a result may be cached: it holds no error but the bytes' own (damaged data)."""
    return all(entry[2] == "content" for entry in result.get("errors", []))


def stored(result: JobResult, job: Job) -> str:
    """A job's result as the cache keeps it: JSON, with the names of its files.

    A copy of the files elsewhere gets the result back with its own names.
    """
    return json.dumps({**result, "file_names": [f.name for f in job.files]}, ensure_ascii=False)


def job_key(
    versions: str,
    job: Job,
    digests: Sequence[str],
    dumps: Sequence[tuple[str, str]] = (),
) -> str:
    """The cache key of a job.

    Its files' contents and ranks, in order, the versions, and its flight-recorder dumps
    (content and base name: a dump's rank may come from its name).
    """
    parts = [[d, f.rank] for f, d in zip(job.files, digests, strict=True)]
    fr = sorted([d, name.rsplit("/", 1)[-1]] for d, name in dumps)
    blob = json.dumps([CACHE_SCHEMA, versions, len(job.files) > 1, parts, fr])
    return hashlib.sha256(blob.encode()).hexdigest()


def default_db() -> Path:
    """``$XDG_CACHE_HOME/nccl-triage/batch.sqlite``, or under ``~/.cache``."""
    return cache_root() / "batch.sqlite"


# Modules that cannot change a job's result: the command line, live watching, rule tests.
# Everything else (a new module too) counts, so a change errs towards triaging again.
_NOT_IN_RESULTS = ("cli/*", "__main__.py", "live/*", "authoring/*", "render/html.py")


def code_version() -> str:
    """A digest of the code and grammar behind a result: results of another version are stale."""
    h = hashlib.sha256(__version__.encode())
    here = Path(__file__).resolve().parent.parent
    for p in sorted([*here.rglob("*.py"), *here.rglob("*.lark")]):
        rel = p.relative_to(here).as_posix()
        if "_data" not in p.parts and not any(fnmatch.fnmatch(rel, g) for g in _NOT_IN_RESULTS):
            h.update(rel.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


class ResultCache:
    """Job results in SQLite, keyed by the content of the job's files and the versions.

    A file's content hash is remembered with its size, mtime and inode, so a rerun reads a
    file again only when one of them changed.
    """

    def __init__(self, path: Path, versions: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.versions = versions
        self.db = self._connect()
        self._real_dirs: dict[str, str] = {}  # a directory -> its real path
        self._new_files: list[tuple[str, int, int, int, str]] = []  # written at commit
        self._looked: dict[str, tuple[str | None, FileKey]] = {}  # by knows(), for digest()
        # the files table, read at the first look (None: not yet; False: too big to read)
        self._files: dict[FileKey, str] | Literal[False] | None = None
        self._expected = PRELOAD_FILES  # files the run will look at (:meth:`expect`)
        try:
            self._schema()
        except sqlite3.DatabaseError:
            self.db.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def release(self) -> None:
        """Write what was remembered and close the database until :meth:`reopen`.

        Around a fork: a child must not inherit a connection (nor SQLite's record of this
        process's locks on the file), or its own connection to the file may not really lock it.
        """
        self.commit()
        self.db.close()

    def reopen(self) -> None:
        """Connect again after :meth:`release`."""
        self.db = self._connect()

    def expect(self, files: int) -> None:
        """Say how many files the run will look at.

        The remembered hashes are read in one query when there are at most four times as many
        (and :data:`PRELOAD_FILES`); else one query a file.
        """
        self._expected = files

    def _schema(self) -> None:
        db = self.db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None or row[0] != str(CACHE_SCHEMA):
            db.execute("DROP TABLE IF EXISTS files")
            db.execute("DROP TABLE IF EXISTS results")
            db.execute("DELETE FROM meta WHERE key = 'files_kept'")
        db.execute(
            "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER,"
            " mtime_ns INTEGER, ino INTEGER, digest TEXT)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, result TEXT,"
            " created REAL, used REAL)"
        )
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(CACHE_SCHEMA),))
        db.commit()

    def digest(self, f: InputFile) -> str:
        """The content hash of a file (raw bytes, as stored), reusing the one remembered.

        Raises:
            InputError: the file cannot be read.
        """
        if f.is_url:
            return url_digest(f)
        looked = self._looked.pop(f.path, None)  # (what knows() found, earlier in the run)
        known, where = looked if looked is not None else self.remembered(f)
        if known is not None:
            return known
        try:
            digest = file_digest(f.path)
        except OSError as exc:
            raise InputError(f.name, os_error_reason(exc)) from None
        self.remember(where, digest)
        return digest

    def knows(self, files: Sequence[InputFile]) -> bool:
        """Whether every local file is remembered with its hash (none to work out).

        What it finds is kept for :meth:`digest` and :meth:`remember_hash`.
        """
        known = True
        for f in files:
            if f.error or f.is_url:
                continue
            try:
                looked = self._looked[f.path] = self.remembered(f)
            except InputError:
                continue  # (its error comes when the job is looked up)
            known = known and looked[0] is not None
        return known

    def remembered(self, f: InputFile) -> tuple[str | None, FileKey]:
        """A local file's remembered hash (None: none for its path, size, mtime and inode).

        And those four, for :meth:`remember`.

        Raises:
            InputError: the file cannot be looked at (or is a directory).
        """
        if f.seen is not None and f.size is not None:  # (as discovery saw it a moment ago)
            size, (mtime_ns, ino, linked) = f.size, f.seen
        else:
            try:
                st = os.lstat(f.path)
                linked = stat.S_ISLNK(st.st_mode)
                if linked:
                    st = os.stat(f.path)
            except OSError as exc:
                raise InputError(f.name, os_error_reason(exc)) from None
            if stat.S_ISDIR(st.st_mode):
                raise InputError(f.name, "is a directory")
            size, mtime_ns, ino = st.st_size, st.st_mtime_ns, st.st_ino
        real = os.path.realpath(f.path) if linked else self._realpath(f.path, plain=True)
        where = (real, size, mtime_ns, ino)
        if self._files is None:
            self._files = self._all_files()
        if self._files is not False:
            return self._files.get(where), where
        row = self.db.execute(
            "SELECT digest FROM files WHERE path = ? AND size = ? AND mtime_ns = ? AND ino = ?",
            where,
        ).fetchone()
        return (str(row[0]) if row is not None else None), where

    def _all_files(self) -> dict[FileKey, str] | Literal[False]:
        """Every remembered file's hash in one query, or False: too many (:meth:`expect`)."""
        most = min(PRELOAD_FILES, 4 * self._expected)
        rows = self.db.execute(
            "SELECT path, size, mtime_ns, ino, digest FROM files LIMIT ?", (most + 1,)
        ).fetchall()
        if len(rows) > most:
            return False
        return {(p, s, m, i): str(d) for p, s, m, i, d in rows}

    def remember(self, where: FileKey, digest: str) -> None:
        """Remember a file's hash with its path, size, mtime and inode (written at commit)."""
        self._new_files.append((*where, digest))
        if isinstance(self._files, dict):
            self._files[where] = digest

    def _realpath(self, path: str, plain: bool = False) -> str:
        """``os.path.realpath``, each directory resolved once (from its parent's real path).

        ``plain``: the caller knows that ``path`` is no symbolic link.
        """
        head, name = os.path.split(path)
        if not head or name in ("", ".", "..") or (not plain and os.path.islink(path)):
            return os.path.realpath(path)
        return os.path.join(self._real_dir(head), name)

    def _real_dir(self, path: str) -> str:
        real = self._real_dirs.get(path)
        if real is not None:
            return real
        if len(self._real_dirs) > 65536:
            self._real_dirs.clear()
        head, name = os.path.split(path)
        if not head or head == path or name in ("", ".", "..") or os.path.islink(path):
            real = os.path.realpath(path)
        else:
            real = os.path.join(self._real_dir(head), name)
        self._real_dirs[path] = real
        return real

    def key(self, job: Job, digests: Sequence[str], dumps: Sequence[tuple[str, str]] = ()) -> str:
        """The cache key of a job (:func:`job_key` with this cache's versions)."""
        return job_key(self.versions, job, digests, dumps)

    def get(self, key: str) -> JobResult | None:
        """The cached result under ``key``, if any (marked as used)."""
        result = self.peek(key)
        if result is not None:
            self.touch(key)
        return result

    def peek(self, key: str) -> JobResult | None:
        """The cached result under ``key``, if any (not marked as used: see :meth:`touch`)."""
        row = self.db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        result: JobResult = json.loads(row[0])
        return result

    def touch(self, key: str) -> None:
        """Mark the result under ``key`` as used now (kept another :data:`CACHE_KEEP_DAYS`)."""
        self.db.execute("UPDATE results SET used = ? WHERE key = ?", (time.time(), key))

    def remember_hash(self, f: InputFile, digest: str) -> None:
        """Remember a hash worked out elsewhere (a worker) for a local file.

        A file found remembered, or that cannot be looked at now, is left as it is.
        """
        looked = self._looked.pop(f.path, None)
        if looked is None:
            try:
                looked = self.remembered(f)
            except InputError:
                return
        if looked[0] is None:
            self.remember(looked[1], digest)

    def put(self, key: str, result: str) -> None:
        """Remember a result as :func:`stored` gives it (call :meth:`commit` to make it durable)."""
        now = time.time()
        self.db.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", (key, result, now, now)
        )

    def commit(self) -> None:
        """Write what was remembered so far."""
        if self._new_files:
            self.db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)", self._new_files
            )
            self._new_files.clear()
        self.db.commit()

    def close(self) -> None:
        """Drop results unused for :data:`CACHE_KEEP_DAYS` and files gone, then close.

        Files gone are looked for once the table has grown (:data:`PRUNE_FILES_AFTER`).
        """
        with contextlib.suppress(sqlite3.Error):
            self.commit()
            self.db.execute(
                "DELETE FROM results WHERE used < ?", (time.time() - CACHE_KEEP_DAYS * 86400,)
            )
            self._prune_files()
            self.db.commit()
        self.db.close()

    def _prune_files(self) -> None:
        """Forget the files whose path is gone, when the table has grown enough to look."""
        db = self.db
        rows = int(db.execute("SELECT COUNT(*) FROM files").fetchone()[0])
        row = db.execute("SELECT value FROM meta WHERE key = 'files_kept'").fetchone()
        kept = int(row[0]) if row is not None and str(row[0]).isdigit() else 0
        if rows <= max(PRUNE_FILES_AFTER, 2 * kept):
            return
        gone = [(p,) for (p,) in db.execute("SELECT path FROM files") if not os.path.lexists(p)]
        db.executemany("DELETE FROM files WHERE path = ?", gone)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('files_kept', ?)", (str(rows - len(gone)),))


class ReadOnlyCache:
    """Results looked up, never written, in a cache that another process writes.

    A worker's view of the run's cache: it sees what the writer has committed. A cache that
    held no result when it was opened is not asked (what the run itself adds is not looked
    up), and one that cannot be opened or read finds nothing: the job is triaged.
    """

    def __init__(self, path: str, versions: str) -> None:
        self.path = path
        self.versions = versions
        self.db: sqlite3.Connection | None = None
        try:
            uri = Path(path).resolve().as_uri() + "?mode=ro"
            self.db = sqlite3.connect(uri, uri=True, timeout=30)
            if self.db.execute("SELECT 1 FROM results LIMIT 1").fetchone() is None:
                self.close()  # (a cold cache: one query instead of one a job)
        except (sqlite3.Error, OSError, ValueError):
            self.close()

    def peek(self, key: str) -> JobResult | None:
        """The result under ``key``, if the cache holds one."""
        if self.db is None:
            return None
        try:
            row = self.db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
            result: JobResult | None = json.loads(row[0]) if row is not None else None
        except (sqlite3.Error, ValueError):  # (a damaged row: triaged again)
            return None
        return result

    def close(self) -> None:
        """Close the database."""
        if self.db is not None:
            self.db.close()
            self.db = None


def url_digest(f: InputFile) -> str:
    """A content hash of a remote file: the store's own checksum when it has one."""
    fsspec = optional_module("fsspec")
    try:
        fs, path = fsspec.core.url_to_fs(f.path)
        info = fs.info(path)
        for key in ("ETag", "etag", "md5Hash", "crc32c", "md5", "checksum"):
            if info.get(key):
                return f"{key}:{info[key]}:{info.get('size')}"
        with fs.open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except FileNotFoundError:
        raise InputError(f.name, "no such file") from None
    except PermissionError:
        raise InputError(f.name, "permission denied") from None
    except Exception as exc:  # noqa: BLE001 - any filesystem
        raise InputError(f.name, f"{type(exc).__name__}: {exc}") from None
