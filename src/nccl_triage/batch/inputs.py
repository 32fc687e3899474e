"""Which files make which jobs: discovery of log files and their grouping into jobs.

Input: paths, directories (walked recursively), globs and fsspec URLs (``s3://``, ``gs://``,
``file://``) of log files, plain or compressed. Output: :class:`InputFile` objects grouped into
:class:`Job` objects: per-rank files of one job (torchrun's ``--log-dir`` layout, Slurm
``%j``/``%t`` output names, or a ``--group-by`` pattern) make one job, so that facts across
ranks hold across files.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from nccl_triage.errors import TriageError

JobResult = dict[str, Any]  # plain JSON data: what a worker returns and the cache keeps
Progress = Callable[[int, int], None]  # (jobs done, jobs to do)

CACHE_SCHEMA = 1  # bump when the layout of JobResult or of the database changes
CACHE_KEEP_DAYS = 90  # results not used for this long are dropped from the cache
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
DEFAULT_INCLUDE = ("*.log", "*.out", "*.err", "*.txt")  # in directories; with COMPRESSED too
MAX_EVIDENCE = 20  # evidence lines kept per diagnosis
MAX_TEXT = 500  # characters kept per evidence line
HEAD_BYTES = 64 << 10  # where the first timestamp of a file is looked for
SERIAL_BELOW = 24  # fewer jobs than this to triage: worker processes would cost more than save

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB_CHARS = re.compile(r"[*?\[]")
# torchrun --log-dir: <dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log
_ATTEMPT = re.compile(r"attempt_\d+")
# Slurm --output/--error with %j (job id) and %t (task id): "train-123456-3.out", "123456.3.err".
_SLURM_TASK = re.compile(
    r"^(?P<stem>(?:.*[._-])?)(?P<job>\d{3,})(?P<sep>[._-])(?P<task>\d{1,5})\.(?:out|err|log)$"
)
_SLURM_JOB = re.compile(r"^(?P<stem>(?:.*[._-])?)(?P<job>\d{3,})\.(?:out|err)$")  # .out + .err
ISO_TIME = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")
ISO_TIME_STR = re.compile(ISO_TIME.pattern.decode())

SEVERITY_ORDER = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class InputFile:
    """One log file of a job (or an input that could not be listed, carrying its error)."""

    name: str  # as tables and messages show it: the path as given, or the URL
    path: str  # what to open: a local path or an fsspec URL
    rank: int | None = None  # from the layout: attempt_N/<rank>/, Slurm %t, --group-by's rank
    size: int | None = None
    mtime: float | None = None
    error: str | None = None  # why it cannot be read, when that is known before triage

    @property
    def is_url(self) -> bool:
        """Tell whether the file is read through fsspec."""
        return bool(_URL.match(self.path))


@dataclass(frozen=True, slots=True)
class Job:
    """The files of one job, triaged together so that facts across ranks span the files."""

    name: str
    files: tuple[InputFile, ...]
    layout: str  # file, torchrun, slurm, pattern

    @property
    def mtime(self) -> float | None:
        """The newest modification time of the job's files."""
        times = [f.mtime for f in self.files if f.mtime is not None]
        return max(times) if times else None


def discover(paths: Iterable[str], include: Sequence[str] = DEFAULT_INCLUDE) -> list[InputFile]:
    """Expand paths, directories, globs and URLs into files, sorted by name.

    Files named explicitly or matched by a glob are always taken; inside directories only the
    names matching ``include`` (with or without a compression suffix) are. What cannot be
    listed (a missing path, an unreadable directory, a directory loop, a glob that matches
    nothing) becomes an :class:`InputFile` carrying its error, so that it shows as a row.
    """
    found: dict[str, InputFile] = {}
    for path in paths:
        if _URL.match(path) and not path.startswith("file://"):
            items = _discover_url(path, include)
        elif path.startswith("file://"):
            items = (
                _discover_url(path, include)
                if _have_fsspec()
                else _discover_local(_file_url_path(path), include)
            )
        else:
            items = _discover_local(path, include)
        for item in items:
            found.setdefault(item.name, item)
    return sorted(found.values(), key=lambda f: f.name)


def _file_url_path(url: str) -> str:
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(url).path)


def _have_fsspec() -> bool:
    return optional_module("fsspec") is not None


def optional_module(name: str) -> Any:
    """An optional library (the ``dask`` and ``parquet`` extras), or None when not installed.

    Imported as ``Any``: these libraries ship no complete type information.
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _included(name: str, include: Sequence[str]) -> bool:
    base = name.rsplit("/", 1)[-1]
    for suffix in COMPRESSED:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return any(fnmatch.fnmatch(base, pat) for pat in include)


def _discover_local(path: str, include: Sequence[str]) -> list[InputFile]:
    if "**" in path and not os.path.lexists(path):
        return _recursive_glob(path)
    if _GLOB_CHARS.search(path) and not os.path.lexists(path):
        matches = sorted(glob.glob(path))
        if not matches:
            return [InputFile(path, path, error=f"{path}: no file matches this pattern")]
        out: list[InputFile] = []
        for m in matches:
            out.extend(_walk(m, include) if os.path.isdir(m) else [_local_file(m)])
        return out
    if os.path.isdir(path):
        return _walk(path, include)
    if os.path.islink(path) and not os.path.exists(path):
        return [InputFile(path, path, error=f"{path}: broken symbolic link")]
    if not os.path.lexists(path):
        return [InputFile(path, path, error=f"{path}: no such file")]
    return [_local_file(path)]


def _local_file(path: str, st: os.stat_result | None = None) -> InputFile:
    try:
        st = st or os.stat(path)
    except OSError as exc:
        return InputFile(path, path, error=f"{path}: {os_error_reason(exc)}")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or a device would block or never end; a batch reads files at rest.
        return InputFile(path, path, error=f"{path}: not a regular file")
    return InputFile(path, path, size=st.st_size, mtime=st.st_mtime)


def _recursive_glob(pattern: str) -> list[InputFile]:
    """``**`` globs by the loop-safe walk (``glob`` itself would follow a link loop)."""
    head = _GLOB_CHARS.split(pattern, maxsplit=1)[0]
    root = head.rsplit("/", 1)[0] if "/" in head else "."
    regex = _glob_regex(pattern if root != "." or pattern.startswith("./") else "./" + pattern)
    walked = _walk(root or "/", ("*",))

    def matches(f: InputFile) -> bool:
        return regex.fullmatch(f.name if root != "." else "./" + f.name) is not None

    # a broken link is reported when the pattern names it; a directory that cannot be read
    # (a loop, no permission) always, since files that match may be inside it
    out = [f for f in walked if matches(f) or (f.error and _directory_error(f.error))]
    if not any(f.error is None for f in out):
        out.append(InputFile(pattern, pattern, error=f"{pattern}: no file matches this pattern"))
    return out


def _directory_error(message: str) -> bool:
    return (
        ": cannot list:" in message
        or ": directory loop" in message
        or message.endswith(("Permission denied", "No such file or directory"))
    )


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Glob to regex: ``**/`` spans directories, ``*`` and ``?`` stay within one."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1 : end]
            out.append(
                "[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]"
            )
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def _walk(root: str, include: Sequence[str]) -> list[InputFile]:
    """Walk a directory tree, following links to directories but never around a loop."""
    out: list[InputFile] = []
    seen: set[tuple[int, int]] = set()

    def visit(path: str, ancestors: dict[tuple[int, int], str]) -> None:
        try:
            st = os.stat(path)
        except OSError as exc:
            out.append(InputFile(path, path, error=f"{path}: {exc.strerror or exc}"))
            return
        ident = (st.st_dev, st.st_ino)
        if ident in ancestors:
            out.append(
                InputFile(
                    path, path, error=f"{path}: directory loop (leads back to {ancestors[ident]})"
                )
            )
            return
        if ident in seen:
            return  # reached twice through links: its files are listed once
        seen.add(ident)
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            out.append(InputFile(path, path, error=f"{path}: cannot list: {exc.strerror or exc}"))
            return
        inner = {**ancestors, ident: path}
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = entry.name if path == "." else os.path.join(path, entry.name)
            try:
                is_dir = entry.is_dir()  # follows links
                is_file = not is_dir and entry.is_file()
            except OSError:
                is_dir = is_file = False
            if is_dir:
                visit(child, inner)
            elif not _included(entry.name, include):
                continue
            elif is_file:
                try:
                    out.append(_local_file(child, entry.stat()))
                except OSError:
                    out.append(_local_file(child))
            elif entry.is_symlink():
                out.append(InputFile(child, child, error=f"{child}: broken symbolic link"))

    visit(root, {})
    return out


def _discover_url(url: str, include: Sequence[str]) -> list[InputFile]:
    fsspec = optional_module("fsspec")
    if fsspec is None:
        return [
            InputFile(url, url, error=f"{url}: URLs need fsspec: pip install 'nccl-triage[dask]'")
        ]
    try:
        fs, root = fsspec.core.url_to_fs(url)
        if _GLOB_CHARS.search(root):
            infos = fs.glob(root, detail=True)
            if not infos:
                return [InputFile(url, url, error=f"{url}: no file matches this pattern")]
            explicit = True
        elif fs.isdir(root):
            infos = fs.find(root, detail=True)
            explicit = False
        else:
            infos = {root: fs.info(root)}
            explicit = True
    except FileNotFoundError:
        return [InputFile(url, url, error=f"{url}: no such file")]
    except Exception as exc:  # noqa: BLE001 - any filesystem: credentials, network, permissions
        return [InputFile(url, url, error=f"{url}: {type(exc).__name__}: {exc}")]
    out: list[InputFile] = []
    for name, info in sorted(infos.items()):
        if info.get("type") == "directory":
            if explicit:
                out.extend(_discover_url(fs.unstrip_protocol(name), include))
            continue
        if not explicit and not _included(name, include):
            continue
        full = fs.unstrip_protocol(name)
        out.append(InputFile(full, full, size=info.get("size"), mtime=_info_mtime(info)))
    return out


def _info_mtime(info: dict[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value).timestamp()
    return None


# ----------------------------------------------------------------------------- grouping


def group_jobs(
    files: Iterable[InputFile], pattern: str | None = None, per_file: bool = False
) -> list[Job]:
    """Group files into jobs: ``pattern`` first, then torchrun's and Slurm's layouts.

    ``pattern`` is a regular expression searched in each path. The job is the path up to the
    end of its ``job`` group (or of the whole match when there is none), so that the same job
    id in two directories names two jobs; a ``rank`` group gives the file's rank. Files it
    does not match are grouped by the built-in layouts, and files no layout claims are jobs
    of their own. ``per_file`` turns grouping off.

    Raises:
        TriageError: the pattern is not a valid regular expression.
    """
    regex = None
    if pattern is not None:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise TriageError("--group-by", f"not a regular expression: {exc}") from None
    groups: dict[str, list[InputFile]] = {}
    layouts: dict[str, str] = {}
    for f in files:
        key, rank, layout = (f.name, None, "file")
        if f.error is None and not per_file:
            key, rank, layout = _job_key(f.name, regex)
        if key in groups and layouts[key] != layout:
            key = f"{key} [{layout}]"
        groups.setdefault(key, []).append(replace(f, rank=rank) if rank is not None else f)
        layouts[key] = layout
    return sorted(
        (
            Job(key, tuple(sorted(members, key=lambda f: f.name)), layouts[key])
            for key, members in groups.items()
        ),
        key=lambda j: j.name,
    )


def _job_key(name: str, regex: re.Pattern[str] | None) -> tuple[str, int | None, str]:
    if regex is not None and (m := regex.search(name)):
        group = "job" if "job" in regex.groupindex else 0
        end = m.end(group)
        rank = m.group("rank") if "rank" in regex.groupindex else None
        return name[:end], int(rank) if rank and rank.isdigit() else None, "pattern"
    parts = name.split("/")
    if len(parts) >= 3 and parts[-2].isdigit() and _ATTEMPT.fullmatch(parts[-3]):
        return "/".join(parts[:-2]), int(parts[-2]), "torchrun"
    base = parts[-1]
    for suffix in COMPRESSED:
        base = base.removesuffix(suffix)
    head = "/".join(parts[:-1])
    prefix = head + "/" if head else ""
    m = _SLURM_TASK.match(base)
    # Slurm names array tasks slurm-%A_%a.out by default: those are separate jobs, not ranks.
    if m and not (m.group("stem") == "slurm-" and m.group("sep") == "_"):
        return prefix + m.group("stem") + m.group("job"), int(m.group("task")), "slurm"
    m = _SLURM_JOB.match(base)
    if m:
        return prefix + m.group("stem") + m.group("job"), None, "slurm"
    return name, None, "file"


def os_error_reason(exc: OSError) -> str:
    """Why a file could not be read, in a few words."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)
