"""Which files make which jobs: discovery of log files and their grouping into jobs.

Input: paths, directories (walked recursively), globs and fsspec URLs (``s3://``, ``gs://``,
``file://``) of log files, plain or compressed. Output: :class:`InputFile` objects grouped into
:class:`Job` objects: per-rank files of one job (torchrun's ``--log-dir`` layout, Slurm
``%j``/``%t`` output names, or a ``--group-by`` pattern) make one job, so that facts across
ranks hold across files.

Flight-recorder dumps are files whose names match a dump pattern (:data:`DEFAULT_FR_PATTERNS`,
``--fr-pattern``) and end in a rank number. They are never triaged as logs: each folder of
dumps joins the one job whose logs sit in that folder or above it (else the one job below it,
as torchrun's run folder holds its ``attempt_N``); a folder that more than one job could claim
is left out, with a note.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import operator
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from nccl_triage.errors import TriageError
from nccl_triage.flightrec.reader import rank_from_name

JobResult = dict[str, Any]  # plain JSON data: what a worker returns and the cache keeps
Progress = Callable[[int, int], None]  # (jobs done, jobs to do)

CACHE_SCHEMA = 2  # bump when the layout of JobResult or of the database changes
CACHE_KEEP_DAYS = 90  # results not used for this long are dropped from the cache
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
DEFAULT_INCLUDE = ("*.log", "*.out", "*.err", "*.txt")  # in directories; with COMPRESSED too
# Names of flight-recorder dumps (the name must also end in the rank number, extensions aside):
# PyTorch's default TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix
# (/tmp/nccl_trace_rank_<rank>), names with fr_trace or fr_dump, and nvidia-resiliency-ext's
# _dump_<rank>.
DEFAULT_FR_PATTERNS = ("nccl_trace_rank_*", "*fr_trace*", "*fr_dump*", "_dump_*")
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
# (found from the "-" on: a pattern that starts with a literal is searched for it first)
_ISO_TAIL = re.compile(rb"-\d\d-\d\d[T ]\d\d:\d\d:\d\d")
ISO_TIME_STR = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")

SEVERITY_ORDER = {"critical": 4, "high": 3, "medium": 2, "low": 1, "info": 0}


def first_iso_time(data: bytes) -> str | None:
    """The first ISO date and time (``2025-04-06 10:18:00``, ``T`` or a space) in ``data``."""
    at = 0
    while (m := _ISO_TAIL.search(data, at)) is not None:
        start = m.start()
        if start >= 4 and data[start - 4 : start].isdigit():
            return data[start - 4 : m.end()].decode()
        at = start + 1
    return None


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
    dump: bool = False  # a flight-recorder dump (read with its job's logs, never as a log)
    # as discovery saw a local file: its mtime in ns, its inode and whether its path is a
    # symbolic link (what the cache remembers its hash with)
    seen: tuple[int, int, bool] | None = None

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
    dumps: tuple[InputFile, ...] = ()  # its flight-recorder dumps, found beside its logs

    @property
    def mtime(self) -> float | None:
        """The newest modification time of the job's files."""
        times = [f.mtime for f in self.files if f.mtime is not None]
        return max(times) if times else None


def discover(
    paths: Iterable[str],
    include: Sequence[str] = DEFAULT_INCLUDE,
    fr_patterns: Sequence[str] = DEFAULT_FR_PATTERNS,
) -> list[InputFile]:
    """Expand paths, directories, globs and URLs into files, sorted by name.

    Files named explicitly or matched by a glob are always taken; inside directories only the
    names matching ``include`` (with or without a compression suffix) are, and the
    flight-recorder dumps (:func:`is_dump_name` with ``fr_patterns``), marked ``dump``. What
    cannot be listed (a missing path, an unreadable directory, a directory loop, a glob that
    matches nothing) becomes an :class:`InputFile` carrying its error, so that it shows as a row.
    """
    found: dict[str, InputFile] = {}
    take = (tuple(include), tuple(fr_patterns))
    for path in paths:
        if _URL.match(path) and not path.startswith("file://"):
            items = _discover_url(path, take)
        elif path.startswith("file://"):
            items = (
                _discover_url(path, take)
                if _have_fsspec()
                else _discover_local(_file_url_path(path), take)
            )
        else:
            items = _discover_local(path, take)
        for item in items:
            if item.error is None and is_dump_name(item.name, fr_patterns):
                item = replace(item, dump=True)
            found.setdefault(item.name, item)
    return sorted(found.values(), key=lambda f: f.name)


_Take = tuple[tuple[str, ...], tuple[str, ...]]  # (include, fr_patterns): names a walk takes


def is_dump_name(name: str, fr_patterns: Sequence[str] = DEFAULT_FR_PATTERNS) -> bool:
    """Tell whether a file is a flight-recorder dump by its name.

    Its base name matches one of ``fr_patterns`` (globs) and ends in a rank number, optionally
    followed by extensions (``nccl_trace_rank_3``, ``fr_dump_3.json``, ``job7_fr_trace_12.pkl``).
    """
    base = name.rstrip("/").rsplit("/", 1)[-1]
    matched = _globs(tuple(fr_patterns)).match(os.path.normcase(base)) is not None
    return matched and rank_from_name(base) is not None


@functools.lru_cache(maxsize=64)
def _globs(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """Whether a name matches any of the globs, as ``fnmatch.fnmatch`` says: one pattern."""
    if not patterns:
        return re.compile(r"(?!)")
    return re.compile("|".join(f"(?:{fnmatch.translate(os.path.normcase(p))})" for p in patterns))


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
    return _globs(tuple(include)).match(os.path.normcase(base)) is not None


def _discover_local(path: str, take: _Take) -> list[InputFile]:
    if "**" in path and not os.path.lexists(path):
        return _recursive_glob(path)
    if _GLOB_CHARS.search(path) and not os.path.lexists(path):
        matches = sorted(glob.glob(path))
        if not matches:
            return [InputFile(path, path, error=f"{path}: no file matches this pattern")]
        out: list[InputFile] = []
        for m in matches:
            out.extend(_walk(m, take) if os.path.isdir(m) else [_local_file(m)])
        return out
    if os.path.isdir(path):
        return _walk(path, take)
    if os.path.islink(path) and not os.path.exists(path):
        return [InputFile(path, path, error=f"{path}: broken symbolic link")]
    if not os.path.lexists(path):
        return [InputFile(path, path, error=f"{path}: no such file")]
    return [_local_file(path)]


def _local_file(
    path: str, st: os.stat_result | None = None, linked: bool | None = None
) -> InputFile:
    """A local file as ``st`` (its path's ``stat``, links followed) shows it.

    ``linked``: whether the path is a symbolic link, when known.
    """
    try:
        st = st or os.stat(path)
    except OSError as exc:
        return InputFile(path, path, error=f"{path}: {os_error_reason(exc)}")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or a device would block or never end; a batch reads files at rest.
        return InputFile(path, path, error=f"{path}: not a regular file")
    seen = (st.st_mtime_ns, st.st_ino, linked) if linked is not None else None
    return InputFile(path, path, size=st.st_size, mtime=st.st_mtime, seen=seen)


def _recursive_glob(pattern: str) -> list[InputFile]:
    """``**`` globs by the loop-safe walk (``glob`` itself would follow a link loop)."""
    head = _GLOB_CHARS.split(pattern, maxsplit=1)[0]
    root = head.rsplit("/", 1)[0] if "/" in head else "."
    regex = _glob_regex(pattern if root != "." or pattern.startswith("./") else "./" + pattern)
    walked = _walk(root or "/", (("*",), ()))

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


def _walk(root: str, take: _Take) -> list[InputFile]:
    """Walk a directory tree, following links to directories but never around a loop.

    ``take``: the names to take, logs (``include``) and flight-recorder dumps.
    """
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
                entries = sorted(it, key=_NAME)
        except OSError as exc:
            out.append(InputFile(path, path, error=f"{path}: cannot list: {exc.strerror or exc}"))
            return
        inner = {**ancestors, ident: path}
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = entry.name if path == "." else entry.path  # (os.path.join'd)
            try:
                is_dir = entry.is_dir()  # follows links
                is_file = not is_dir and entry.is_file()
            except OSError:
                is_dir = is_file = False
            if is_dir:
                visit(child, inner)
            elif not _takes(entry.name, take):
                continue
            elif is_file:
                try:
                    out.append(_local_file(child, entry.stat(), entry.is_symlink()))
                except OSError:
                    out.append(_local_file(child))
            elif entry.is_symlink():
                out.append(InputFile(child, child, error=f"{child}: broken symbolic link"))

    visit(root, {})
    return out


_NAME = operator.attrgetter("name")


def _takes(name: str, take: _Take) -> bool:
    return _included(name, take[0]) or is_dump_name(name, take[1])


def _discover_url(url: str, take: _Take) -> list[InputFile]:
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
                out.extend(_discover_url(fs.unstrip_protocol(name), take))
            continue
        if not explicit and not _takes(name, take):
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
        if f.dump:
            continue  # dumps join jobs afterwards (attach_dumps)
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


def attach_dumps(jobs: Sequence[Job], files: Iterable[InputFile]) -> tuple[list[Job], list[str]]:
    """Give each folder of flight-recorder dumps to the one job it belongs to.

    A folder of dumps belongs to the job whose logs share the deepest folder that holds it (the
    dumps sit beside the logs or below them); when no job's folder holds it, to the one job
    whose logs are below it (torchrun's run folder above ``attempt_N``). When two jobs could
    claim it, or none, its dumps are left out and a note says so.

    Returns:
        The jobs, with their ``dumps``, and one note per folder of dumps left out.
    """
    dumps: dict[str, list[InputFile]] = {}
    for f in files:
        if f.dump:
            dumps.setdefault(_folder(f.name), []).append(f)
    homes = {job.name: _home(job) for job in jobs}
    claimed: dict[str, list[InputFile]] = {}
    notes: list[str] = []
    for folder, found in sorted(dumps.items()):
        above = [j for j in jobs if _inside(folder, homes[j.name])]
        if above:
            deepest = max(len(homes[j.name]) for j in above)
            owners = [j for j in above if len(homes[j.name]) == deepest]
        else:
            owners = [j for j in jobs if _inside(homes[j.name], folder)]
        if len(owners) == 1:
            claimed.setdefault(owners[0].name, []).extend(found)
            continue
        where = f"{len(owners)} jobs could claim them" if owners else "no job's logs are there"
        notes.append(
            f"{folder}: {len(found)} flight-recorder dump(s) left out: {where} "
            "(keep one job per folder, or read them with nccl-triage triage LOG --fr DIR)"
        )
    out = [
        replace(j, dumps=tuple(sorted(claimed[j.name], key=lambda f: f.name)))
        if j.name in claimed
        else j
        for j in jobs
    ]
    return out, notes


def _folder(name: str) -> str:
    head = name.rstrip("/").rsplit("/", 1)
    return head[0] if len(head) == 2 and head[0] else "."


def _home(job: Job) -> str:
    """The deepest folder holding every log of a job."""
    folders = [_folder(f.name).split("/") for f in job.files]
    common: list[str] = []
    for parts in zip(*folders, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return "/".join(common) or "."


def _inside(path: str, folder: str) -> bool:
    """Tell whether ``path`` is ``folder`` or below it (``.`` holds every relative path)."""
    if folder == ".":
        return not path.startswith("/") and not _URL.match(path)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def os_error_reason(exc: OSError) -> str:
    """Why a file could not be read, in a few words."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)
