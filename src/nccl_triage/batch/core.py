"""Many archived job logs in, one table out: discovery, grouping, parallel triage, cache, report.

Input: paths, directories (walked recursively), globs and fsspec URLs (``s3://``, ``gs://``,
``file://``) of log files, plain or compressed. Per-rank files of one job are grouped into one
job (torchrun's ``--log-dir`` layout, Slurm ``%j``/``%t`` output names, or a ``--group-by``
pattern), so that facts across ranks hold across files.
Output: a :class:`BatchResult`: one :class:`Outcome` per job, turned into a pandas DataFrame
(one row per job, or per diagnosis), a summary (causes, hosts, rules, jobs to look at first)
and a self-contained HTML page.

Jobs run in this process, in a pool of worker processes (``-j N``) or on a Dask cluster; each
job's result is plain data (:data:`JobResult`), cached in SQLite under the content hash of its
files, the ruleset's version and this code's version, so a rerun over a growing archive only
triages what is new or changed.

Only this module imports pandas, and it does so lazily: worker processes never pay for it,
and forking a pool before numpy starts its threads stays safe. The HTML page is rendered here
too, by jinja2's sandbox with autoescaping on: every string in it comes from untrusted logs.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hashlib
import json
import os
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from nccl_triage import __version__
from nccl_triage.errors import InputError, TemplateError, TriageError
from nccl_triage.ingest.reader import Reader, iter_chunks, open_binary
from nccl_triage.model import Event, Finding, Report
from nccl_triage.pipeline import Triage
from nccl_triage.ruleset.core import Ruleset

if TYPE_CHECKING:
    import pandas as pd

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
_ISO_TIME = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")
_ISO_TIME_STR = re.compile(_ISO_TIME.pattern.decode())

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
    return _optional("fsspec") is not None


def _optional(name: str) -> Any:
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
        return InputFile(path, path, error=f"{path}: {_reason(exc)}")
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
    out = [
        f for f in walked if f.error or regex.fullmatch(f.name if root != "." else "./" + f.name)
    ]
    if not any(f.error is None for f in out):
        out.append(InputFile(pattern, pattern, error=f"{pattern}: no file matches this pattern"))
    return out


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
    fsspec = _optional("fsspec")
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


# ----------------------------------------------------------------------------- one job


def triage_job_files(job: Job, ruleset: Ruleset) -> JobResult:
    """Triage one job's files as one input and return the result as plain data.

    A file that cannot be read adds its error and nothing else; the job is triaged from the
    files that could be read. Line numbers stay per file, and evidence names its file by
    index into ``job.files``. In a job of several files, events of a file that does not say
    their rank get the file's rank: the one rank its lines name, or the layout's.
    """
    errors: list[list[Any]] = [[i, f.error, "access"] for i, f in enumerate(job.files) if f.error]
    triage = Triage(ruleset, job.name)
    heads: list[str] = []
    read = 0
    for i, f in enumerate(job.files):
        if f.error:
            continue
        try:
            head = _feed_file(triage, f, len(job.files) > 1)
        except InputError as exc:
            # Damaged compression is a property of the bytes: cached with them. Access
            # problems (permissions, I/O) may be gone next time.
            kind = "content" if exc.msg.startswith(("truncated", "damaged")) else "access"
            errors.append([i, str(InputError(f.name, exc.msg)), kind])
            triage.discard(f.name)
            continue
        except Exception as exc:  # noqa: BLE001 - one odd file must not stop thousands of jobs
            errors.append([i, f"{f.name}: internal error: {type(exc).__name__}: {exc}", "internal"])
            triage.discard(f.name)
            continue
        read += 1
        if head:
            heads.append(head)
    if not read:
        return {"verdict": None, "errors": errors, "files_read": 0}
    return _result(job, triage.report(), ruleset, heads, errors, read)


def _feed_file(triage: Triage, f: InputFile, several: bool) -> str | None:
    """Read one file of a job into ``triage``; return the ISO time its first bytes show."""
    triage.open(f.name, rank_hint=f.rank if several else None)
    head = b""
    with _open(f) as fh:
        for chunk in iter_chunks(fh):
            if not head:
                head = chunk[:HEAD_BYTES]
            triage.feed(chunk, f.name)
    triage.close(f.name)
    first = _ISO_TIME.search(head) if head else None
    return first.group(0).decode() if first else None


@contextlib.contextmanager
def _open(f: InputFile) -> Iterator[Reader]:
    if not f.is_url:
        with open_binary(f.path) as reader:
            reader.name = f.name
            yield reader
        return
    fsspec = _optional("fsspec")
    if fsspec is None:
        raise InputError(f.name, "URLs need fsspec: pip install 'nccl-triage[dask]'")
    try:
        raw: IO[bytes] = fsspec.open(f.path, "rb").open()
    except FileNotFoundError:
        raise InputError(f.name, "no such file") from None
    except PermissionError:
        raise InputError(f.name, "permission denied") from None
    except Exception as exc:  # noqa: BLE001 - any filesystem: credentials, network
        raise InputError(f.name, f"{type(exc).__name__}: {exc}") from None
    try:
        reader = open_binary("-", stdin=raw)  # decompression recognised by content
        reader.name = f.name
        yield reader
    finally:
        raw.close()


def _result(
    job: Job,
    report: Report,
    ruleset: Ruleset,
    heads: list[str],
    errors: list[list[Any]],
    files_read: int,
) -> JobResult:
    from nccl_triage.render.core import render_advice

    index = {f.name: i for i, f in enumerate(job.files)}
    facts = report.facts
    notes: list[str] = []
    diagnoses = []
    for f in report.findings:
        try:
            advice = render_advice(f, facts, ruleset.template_dirs)
        except TemplateError as exc:
            advice = ""
            notes.append(f"advice not rendered: {exc}")
        evidence = sorted([*f.evidence, f.trigger], key=lambda e: (index.get(e.source, -1), e.line))
        diagnoses.append(
            {
                "rule": f.rule.id,
                "cause": f.rule.cause,
                "title": f.rule.title,
                "severity": f.rule.severity.value,
                "confidence": round(f.confidence, 4),
                "evidence": [
                    [index.get(e.source, -1), e.line, e.rank, _clip(e.text)]
                    for e in evidence[:MAX_EVIDENCE]
                ],
                "advice": advice,
                "references": list(f.rule.references),
            }
        )
    everything = [*report.events, *report.signals]
    trigger = report.findings[0].trigger if report.findings else _first_failure(report)
    times = [
        *heads,
        *(m.group(0) for e in everything if e.time and (m := _ISO_TIME_STR.search(e.time))),
    ]
    culprit = _culprit(report)
    return {
        "verdict": report.verdict,
        "diagnoses": diagnoses,
        "lines": report.lines,
        "events": len(report.events),
        "timeouts": facts.timeouts,
        "op_type": (trigger.op_type if trigger and trigger.op_type else None)
        or (",".join(facts.op_types) or None),
        "seq": trigger.seq if trigger and trigger.seq is not None else facts.min_seq,
        "timeout_ms": facts.timeout_ms,
        "ranks_timed_out": facts.ranks_timed_out,
        "ranks_not_timed_out": facts.ranks_not_timed_out,
        "world_size": facts.world_size,
        "culprit_rank": culprit,
        "culprit_host": _host_of(everything, culprit),
        "hosts": sorted({e.host for e in everything if e.host}),
        "first_time": min((t.replace(" ", "T") for t in times), default=None),
        "unparsed": len(report.unparsed),
        "errors": errors,
        "notes": notes,
        "files_read": files_read,
    }


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _first_failure(report: Report) -> Event | None:
    from nccl_triage.diagnose.engine import FAILURE_KINDS

    return next((e for e in report.events if e.kind in FAILURE_KINDS), None)


def _culprit(report: Report) -> int | None:
    """The rank most likely at fault: named by the top diagnosis's evidence, or by the facts."""
    facts = report.facts
    timed_out = set(facts.ranks_timed_out)
    top: Finding | None = report.findings[0] if report.findings else None
    if top is not None:
        for ev in top.evidence:
            if ev.rank is not None and ev.rank not in timed_out:
                return ev.rank
    if len(facts.ranks_not_timed_out) == 1:
        return facts.ranks_not_timed_out[0]
    if len(facts.furthest_behind) == 1:
        return facts.furthest_behind[0]
    if not timed_out and facts.first_failure_rank is not None:
        return facts.first_failure_rank
    return None


def _host_of(events: Iterable[Event], rank: int | None) -> str | None:
    if rank is None:
        return None
    return next((e.host for e in events if e.rank == rank and e.host), None)


# ----------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class PortableRuleset:
    """A ruleset as data, for workers that may not see the client's files (Dask)."""

    version: str
    ruleset: Ruleset
    templates: dict[str, str]  # advice template name -> text, first directory wins

    @classmethod
    def of(cls, ruleset: Ruleset) -> PortableRuleset:
        """Capture a ruleset and the text of its advice templates."""
        templates: dict[str, str] = {}
        for d in ruleset.template_dirs:
            for p in sorted(Path(d).glob("*.j2")):
                templates.setdefault(p.name, p.read_text(encoding="utf-8"))
        return cls(ruleset.version, ruleset, templates)

    def materialize(self) -> Ruleset:
        """The ruleset with its templates written to a private directory of this process."""
        cached = _WORKER_RULESETS.get(self.version)
        if cached is not None:
            return cached
        import atexit
        import shutil
        import tempfile

        tdir = Path(tempfile.mkdtemp(prefix="nccl-triage-templates-"))
        atexit.register(shutil.rmtree, tdir, ignore_errors=True)
        for name, text in self.templates.items():
            (tdir / name).write_text(text, encoding="utf-8")
        ruleset = replace(self.ruleset, template_dirs=[tdir])
        _WORKER_RULESETS[self.version] = ruleset
        return ruleset


_WORKER_RULESETS: dict[str, Ruleset] = {}
_worker_ruleset: Ruleset | None = None


def _init_worker(ruleset: Ruleset) -> None:
    global _worker_ruleset
    from nccl_triage.parse.grammar import parser

    _worker_ruleset = ruleset
    parser()  # build the grammar once per process, before the first job


def _run_chunk(jobs: list[Job]) -> list[JobResult]:
    assert _worker_ruleset is not None, "worker not initialised"
    return [_safe_triage(job, _worker_ruleset) for job in jobs]


def _run_chunk_dask(jobs: list[Job], portable: PortableRuleset) -> list[JobResult]:
    ruleset = portable.materialize()
    return [_safe_triage(job, ruleset) for job in jobs]


def _safe_triage(job: Job, ruleset: Ruleset) -> JobResult:
    try:
        return triage_job_files(job, ruleset)
    except Exception as exc:  # noqa: BLE001 - reported as the job's error, the run goes on
        return {
            "verdict": None,
            "errors": [
                [-1, f"{job.name}: internal error: {type(exc).__name__}: {exc}", "internal"]
            ],
        }


def _chunks(jobs: list[Job], workers: int, most: int) -> list[list[Job]]:
    # Large jobs first so that no worker is left with a big one at the end.
    ordered = sorted(jobs, key=lambda j: -sum(f.size or 0 for f in j.files))
    size = max(1, min(most, len(ordered) // (workers * 8) or 1))
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def run_serial(
    jobs: list[Job], ruleset: Ruleset, progress: Progress | None = None
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs one after the other in this process."""
    for i, job in enumerate(jobs, 1):
        yield job, _safe_triage(job, ruleset)
        if progress:
            progress(i, len(jobs))


def run_processes(
    jobs: list[Job], ruleset: Ruleset, workers: int, progress: Progress | None = None
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs in a pool of ``workers`` processes, yielding results as they come."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context(_start_method())
    if context.get_start_method() == "fork":
        from nccl_triage.parse.grammar import parser

        parser()  # built once here, inherited by every worker
    elif context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["nccl_triage.batch.core"])
    done = 0
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(ruleset,)
    ) as pool:
        futures = {pool.submit(_run_chunk, chunk): chunk for chunk in _chunks(jobs, workers, 32)}
        for fut in as_completed(futures):
            chunk = futures[fut]
            try:
                results = fut.result()
            except BrokenProcessPool as exc:
                msg = f"a worker process died ({exc or 'killed'})"
                results = [_failed(j, msg) for j in chunk]
            yield from zip(chunk, results, strict=True)
            done += len(chunk)
            if progress:
                progress(done, len(jobs))


def _start_method() -> str:
    """``fork`` while this process has one thread (fast: workers inherit the built grammar).

    Forking a process with other threads (numpy's, once pandas is imported) can deadlock the
    child, and Python 3.12+ warns about it; then ``forkserver`` (or ``spawn``) is used.
    """
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and _native_threads() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _native_threads() -> int:
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[17])
    except (OSError, ValueError, IndexError):
        import threading

        return threading.active_count() + 1  # unknown: assume native threads may exist


def run_dask(
    jobs: list[Job],
    ruleset: Ruleset,
    scheduler: str | None,
    workers: int,
    progress: Progress | None = None,
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs on a Dask cluster (``scheduler`` address), or on a local one of ``workers``.

    Workers read local paths as absolute paths (a shared file system) and URLs through
    fsspec; the ruleset travels as data, templates included.

    Raises:
        TriageError: dask.distributed is not installed, or the scheduler cannot be reached.
    """
    distributed = _optional("distributed")
    if distributed is None:
        raise TriageError(
            "--engine dask", "needs dask.distributed: pip install 'nccl-triage[dask]'"
        )
    import logging

    Client, LocalCluster, as_completed = (
        distributed.Client,
        distributed.LocalCluster,
        distributed.as_completed,
    )

    cluster = None
    try:
        if scheduler is None:
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",  # any free port: 8787 may be taken
                silence_logs=logging.ERROR,
            )
            client = Client(cluster)
        else:
            client = Client(scheduler, timeout="20s")
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise TriageError(f"--scheduler {scheduler}", f"cannot connect: {exc}") from None
    try:
        absolute = [_absolute(job) for job in jobs]
        by_name = {job.name: job for job in jobs}
        portable = client.scatter(PortableRuleset.of(ruleset), broadcast=True, hash=False)
        n = max(1, len(client.scheduler_info().get("workers", {})) or workers)
        chunks = _chunks(absolute, n, 64)
        futures = client.map(_run_chunk_dask, chunks, portable=portable, pure=False)
        index = {fut.key: chunk for fut, chunk in zip(futures, chunks, strict=True)}
        done = 0
        for fut in as_completed(futures):
            chunk = index[fut.key]
            try:
                results = fut.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker: those jobs become rows
                msg = f"dask task failed: {type(exc).__name__}: {exc}"
                results = [_failed(j, msg) for j in chunk]
            for job, res in zip(chunk, results, strict=True):
                yield by_name[job.name], res
            done += len(chunk)
            if progress:
                progress(done, len(jobs))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _absolute(job: Job) -> Job:
    files = tuple(f if f.is_url else replace(f, path=os.path.abspath(f.path)) for f in job.files)
    return replace(job, files=files)


# ----------------------------------------------------------------------------- cache


def default_db() -> Path:
    """``$XDG_CACHE_HOME/nccl-triage/batch.sqlite``, or under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nccl-triage" / "batch.sqlite"


# Modules that cannot change a job's result: the command line, live watching, rule tests.
# Everything else (a new module too) counts, so a change errs towards triaging again.
_NOT_IN_RESULTS = ("cli/*", "__main__.py", "live/*", "authoring/*")


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
        self.db = sqlite3.connect(str(path), timeout=30)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._schema()
        except sqlite3.DatabaseError:
            self.db.close()
            raise

    def _schema(self) -> None:
        db = self.db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None or row[0] != str(CACHE_SCHEMA):
            db.execute("DROP TABLE IF EXISTS files")
            db.execute("DROP TABLE IF EXISTS results")
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
            return _url_digest(f)
        try:
            st = os.stat(f.path)
        except OSError as exc:
            raise InputError(f.name, _reason(exc)) from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f.name, "is a directory")
        real = os.path.realpath(f.path)
        row = self.db.execute(
            "SELECT digest FROM files WHERE path = ? AND size = ? AND mtime_ns = ? AND ino = ?",
            (real, st.st_size, st.st_mtime_ns, st.st_ino),
        ).fetchone()
        if row is not None:
            return str(row[0])
        try:
            with open(f.path, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError as exc:
            raise InputError(f.name, _reason(exc)) from None
        self.db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
            (real, st.st_size, st.st_mtime_ns, st.st_ino, digest),
        )
        return digest

    def key(self, job: Job, digests: Sequence[str]) -> str:
        """The cache key of a job: its files' contents and ranks, in order, and the versions."""
        parts = [[d, f.rank] for f, d in zip(job.files, digests, strict=True)]
        blob = json.dumps([CACHE_SCHEMA, self.versions, len(job.files) > 1, parts])
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> JobResult | None:
        """The cached result under ``key``, if any."""
        row = self.db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        self.db.execute("UPDATE results SET used = ? WHERE key = ?", (time.time(), key))
        result: JobResult = json.loads(row[0])
        return result

    def put(self, key: str, result: JobResult) -> None:
        """Remember a result (call :meth:`commit` to make it durable)."""
        now = time.time()
        self.db.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)",
            (key, json.dumps(result, ensure_ascii=False), now, now),
        )

    def commit(self) -> None:
        """Write what was remembered so far."""
        self.db.commit()

    def close(self) -> None:
        """Drop results unused for :data:`CACHE_KEEP_DAYS`, then close the database."""
        with contextlib.suppress(sqlite3.Error):
            self.db.execute(
                "DELETE FROM results WHERE used < ?", (time.time() - CACHE_KEEP_DAYS * 86400,)
            )
            self.db.commit()
        self.db.close()


def _reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)


def _url_digest(f: InputFile) -> str:
    """A content hash of a remote file: the store's own checksum when it has one."""
    fsspec = _optional("fsspec")
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


# ----------------------------------------------------------------------------- batch run


@dataclass
class Outcome:
    """One job and what triage said about it."""

    job: Job
    result: JobResult
    cached: bool = False

    @property
    def verdict(self) -> str | None:
        """``clean``, ``nccl_timeout``, ``nccl_error``, or None when nothing could be read."""
        v = self.result.get("verdict")
        return str(v) if v is not None else None

    @property
    def errors(self) -> list[str]:
        """One message per file that could not be read."""
        return [str(entry[1]) for entry in self.result.get("errors", [])]

    @property
    def diagnoses(self) -> list[dict[str, Any]]:
        """The diagnoses, most likely first."""
        return list(self.result.get("diagnoses", []))


@dataclass
class BatchStats:
    """How the run went."""

    files: int = 0
    jobs: int = 0
    triaged: int = 0
    cached: int = 0
    seconds: float = 0.0
    engine: str = "serial"
    workers: int = 1
    cache_path: str | None = None
    cache_note: str | None = None  # why the cache was not used


@dataclass
class BatchResult:
    """The outcome of every job, in job-name order, and how the run went."""

    outcomes: list[Outcome]
    stats: BatchStats
    ruleset_version: str = ""
    notes: list[str] = field(default_factory=list)

    def table(self, per_diagnosis: bool = False) -> pd.DataFrame:
        """One row per job (or per diagnosis): see :data:`COLUMNS`."""
        return build_table(self.outcomes, per_diagnosis)

    def summary(self) -> Summary:
        """Causes, hosts and rules over the jobs, and the jobs to look at first."""
        return summarize(self.outcomes)

    @property
    def read_any(self) -> bool:
        """Tell whether at least one input could be read."""
        return any(o.verdict is not None for o in self.outcomes)

    @property
    def failed(self) -> bool:
        """Tell whether a failure was diagnosed in at least one job."""
        return any(o.verdict not in (None, "clean") for o in self.outcomes)


@dataclass
class BatchOptions:
    """How to find, group and triage the inputs."""

    include: Sequence[str] = DEFAULT_INCLUDE
    group_by: str | None = None
    per_file: bool = False
    workers: int = 0  # 0: one per CPU, serial for a few jobs
    engine: str = "local"  # local | dask
    scheduler: str | None = None
    db: Path | None = None  # None: no cache


def run_batch(
    paths: Sequence[str],
    ruleset: Ruleset,
    options: BatchOptions | None = None,
    progress: Progress | None = None,
) -> BatchResult:
    """Discover, group, look up the cache, triage the rest and collect every job's outcome.

    Raises:
        TriageError: a bad ``--group-by`` pattern, or the Dask engine cannot run.
    """
    opts = options or BatchOptions()
    start = time.perf_counter()
    files = discover(paths, opts.include)
    jobs = group_jobs(files, opts.group_by, opts.per_file)
    stats = BatchStats(files=sum(1 for f in files if f.error is None), jobs=len(jobs))
    notes: list[str] = []
    cache: ResultCache | None = None
    if opts.db is not None:
        stats.cache_path = str(opts.db)
        try:
            cache = ResultCache(opts.db, f"{code_version()}:{ruleset.version}")
        except (OSError, sqlite3.Error) as exc:
            stats.cache_note = f"cache {opts.db} not used: {exc}"
    outcomes: dict[str, Outcome] = {}
    todo: list[Job] = []
    keys: dict[str, str] = {}
    for job in jobs:
        if all(f.error for f in job.files):
            outcomes[job.name] = Outcome(job, _unreadable(job))
            continue
        if cache is not None:
            job = _hashed(job, cache, keys)  # files unreadable now carry their error
            if all(f.error for f in job.files):
                outcomes[job.name] = Outcome(job, _unreadable(job))
                continue
            hit = cache.get(keys[job.name]) if job.name in keys else None
            if hit is not None:
                outcomes[job.name] = Outcome(job, hit, cached=True)
                stats.cached += 1
                continue
        todo.append(job)
    workers = opts.workers or os.cpu_count() or 1
    try:
        for job, result in _engine(todo, ruleset, opts, workers, stats, progress):
            outcomes[job.name] = Outcome(job, result)
            stats.triaged += 1
            if cache is not None and job.name in keys and _cacheable(result):
                cache.put(keys[job.name], result)
                if stats.triaged % 500 == 0:
                    cache.commit()
    finally:
        if cache is not None:
            cache.commit()
            cache.close()
    for o in outcomes.values():
        notes.extend(n for n in o.result.get("notes", []) if n not in notes)
    stats.seconds = time.perf_counter() - start
    ordered = [outcomes[j.name] for j in jobs]
    return BatchResult(ordered, stats, ruleset.version, notes)


def _hashed(job: Job, cache: ResultCache, keys: dict[str, str]) -> Job:
    digests: list[str] = []
    files: list[InputFile] = []
    for f in job.files:
        if f.error:
            files.append(f)
            continue
        try:
            digests.append(cache.digest(f))
            files.append(f)
        except InputError as exc:
            files.append(replace(f, error=str(exc)))
    job = replace(job, files=tuple(files))
    if all(f.error is None for f in files):
        keys[job.name] = cache.key(job, digests)
    return job


def _cacheable(result: JobResult) -> bool:
    return all(entry[2] == "content" for entry in result.get("errors", []))


def _unreadable(job: Job) -> JobResult:
    return {"verdict": None, "errors": [[i, f.error, "access"] for i, f in enumerate(job.files)]}


def _failed(job: Job, msg: str) -> JobResult:
    return {"verdict": None, "errors": [[-1, f"{job.name}: {msg}", "internal"]]}


def _engine(
    todo: list[Job],
    ruleset: Ruleset,
    opts: BatchOptions,
    workers: int,
    stats: BatchStats,
    progress: Progress | None,
) -> Iterator[tuple[Job, JobResult]]:
    if opts.engine == "dask":
        stats.engine, stats.workers = "dask", workers
        if not todo:
            return iter(())
        return run_dask(todo, ruleset, opts.scheduler, workers, progress)
    if workers <= 1 or (opts.workers == 0 and len(todo) < SERIAL_BELOW):
        stats.engine, stats.workers = "serial", 1
        return run_serial(todo, ruleset, progress)
    workers = min(workers, max(1, len(todo)))
    stats.engine, stats.workers = "processes", workers
    return run_processes(todo, ruleset, workers, progress)


# ----------------------------------------------------------------------------- table

COLUMNS = (
    "job",  # the job's name: its file, or the common part of its per-rank files' paths
    "inputs",  # the job's files, separated by ";"
    "files",
    "verdict",  # clean | nccl_timeout | nccl_error; empty when no file could be read
    "cause",  # the top diagnosis's cause (spec/causes.md); "none" when clean
    "rule",
    "severity",
    "confidence",
    "diagnoses",  # how many diagnoses the job has
    "op_type",  # the collective that timed out or failed
    "seq",  # its SeqNum
    "timeout_ms",
    "ranks_timed_out",  # "0,1,3"
    "culprit_rank",  # the rank most likely at fault, when the log says
    "culprit_host",
    "hosts",  # every host the job's lines name, "," separated
    "first_time",  # the first dated timestamp in the job's logs
    "lines",
    "error",  # why a file could not be read ("; " separated)
)
_INT_COLUMNS = ("files", "diagnoses", "seq", "timeout_ms", "culprit_rank", "lines")


def _row(o: Outcome, d: dict[str, Any] | None) -> dict[str, Any]:
    r = o.result
    verdict = o.verdict
    if d is not None:
        cause, rule, severity, conf = d["cause"], d["rule"], d["severity"], d["confidence"]
    elif verdict == "clean":
        cause, rule, severity, conf = "none", None, None, None
    elif verdict is not None:
        cause, rule, severity, conf = "unknown", None, None, None
    else:
        cause, rule, severity, conf = None, None, None, None
    return {
        "job": o.job.name,
        "inputs": ";".join(f.name for f in o.job.files),
        "files": len(o.job.files),
        "verdict": verdict,
        "cause": cause,
        "rule": rule,
        "severity": severity,
        "confidence": conf,
        "diagnoses": len(o.diagnoses) if verdict is not None else None,
        "op_type": r.get("op_type"),
        "seq": r.get("seq"),
        "timeout_ms": r.get("timeout_ms"),
        "ranks_timed_out": ",".join(str(x) for x in r.get("ranks_timed_out") or []) or None,
        "culprit_rank": r.get("culprit_rank"),
        "culprit_host": r.get("culprit_host"),
        "hosts": ",".join(r.get("hosts") or []) or None,
        "first_time": r.get("first_time"),
        "lines": r.get("lines"),
        "error": "; ".join(o.errors) or None,
    }


def build_table(outcomes: Sequence[Outcome], per_diagnosis: bool = False) -> pd.DataFrame:
    """The outcomes as a DataFrame: one row per job, or one per diagnosis (``diagnosis`` n)."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for o in outcomes:
        diagnoses = o.diagnoses
        if per_diagnosis and diagnoses:
            for n, d in enumerate(diagnoses, 1):
                rows.append({**_row(o, d), "diagnosis": n})
        else:
            row = _row(o, diagnoses[0] if diagnoses else None)
            if per_diagnosis:
                row["diagnosis"] = 1 if diagnoses else None
            rows.append(row)
    columns = list(COLUMNS)
    if per_diagnosis:
        columns.insert(columns.index("cause"), "diagnosis")
    df = pd.DataFrame.from_records(rows, columns=columns)
    for col in (*_INT_COLUMNS, *(("diagnosis",) if per_diagnosis else ())):
        df[col] = df[col].astype("Int64")
    df["confidence"] = df["confidence"].astype("float64")
    df["first_time"] = pd.to_datetime(df["first_time"], format="ISO8601", errors="coerce")
    for col in columns:
        if col not in (*_INT_COLUMNS, "diagnosis", "confidence", "first_time"):
            df[col] = df[col].astype("string")
    return df


def write_table(df: pd.DataFrame, path: str) -> None:
    """Write the table as CSV, Parquet or JSON Lines, chosen by the file's extension.

    Raises:
        TriageError: an unknown extension, or Parquet without pyarrow.
    """
    lower = path.lower()
    if lower.endswith(".csv"):
        df.to_csv(path, index=False)
    elif lower.endswith((".jsonl", ".ndjson")):
        df.to_json(path, orient="records", lines=True, date_format="iso", force_ascii=False)
    elif lower.endswith(".parquet"):
        if _optional("pyarrow") is None:
            raise TriageError(
                path, "writing Parquet needs pyarrow: pip install 'nccl-triage[parquet]'"
            )
        df.to_parquet(path, index=False)
    else:
        raise TriageError(path, "unknown table format (use .csv, .parquet or .jsonl)")


def format_table(df: pd.DataFrame, width: int = 48) -> str:
    """The job table as aligned text for a terminal (long cells cut to ``width``)."""
    shown = [
        ("job", "job"),
        ("verdict", "verdict"),
        ("cause", "cause"),
        ("rule", "rule"),
        ("confidence", "conf"),
        ("op_type", "op"),
        ("seq", "seq"),
        ("timeout_ms", "timeout"),
        ("ranks_timed_out", "timed out"),
        ("culprit_rank", "culprit"),
        ("hosts", "hosts"),
        ("first_time", "first time"),
        ("lines", "lines"),
        ("error", "error"),
    ]
    if "diagnosis" in df.columns:
        shown.insert(2, ("diagnosis", "#"))
    cells: list[list[str]] = []
    for rec in df.to_dict("records"):
        row = []
        for col, _ in shown:
            value = rec.get(col)
            row.append(_cell(col, value, width))
        cells.append(row)
    heads = [h for _, h in shown]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(heads)]
    right = {"confidence", "seq", "timeout_ms", "culprit_rank", "lines", "diagnosis"}
    lines = []
    for row in [heads, *cells]:
        parts = [
            f"{c:>{w}}" if col in right else f"{c:<{w}}"
            for c, w, (col, _) in zip(row, widths, shown, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def _cell(col: str, value: Any, width: int) -> str:
    if value is None or (not isinstance(value, str) and _isna(value)):
        return "-"
    if col == "confidence":
        return f"{float(value):.2f}"
    if col == "timeout_ms":
        from nccl_triage.render.core import human_ms

        return human_ms(value)
    if col == "first_time":
        return str(value)[:16]
    text = str(value)
    if len(text) <= width:
        return text
    if col == "job":
        return "…" + text[-(width - 1) :]
    return text[: width - 1] + "…"


def _isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


# ----------------------------------------------------------------------------- summary


@dataclass
class Summary:
    """The fleet's view: what failed, why, where, and which jobs to look at first."""

    jobs: int
    files: int
    failed: int
    clean: int
    unreadable: int  # jobs none of whose files could be read
    with_errors: int  # jobs with at least one unreadable file
    causes: list[tuple[str, int, float]]  # cause, failed jobs, share of failed jobs
    hosts: list[tuple[str, int, int]]  # host, failed jobs naming it, as culprit host
    rules: list[tuple[str, int]]  # rule, jobs where it is the top diagnosis
    first: list[tuple[str, str, str, float]]  # job, cause, severity, confidence


def summarize(outcomes: Sequence[Outcome], top: int = 10) -> Summary:
    """Count causes, hosts and rules over the failed jobs; order the jobs to look at first."""
    import pandas as pd

    df = build_table(outcomes)
    failed = df[df["verdict"].notna() & (df["verdict"] != "clean")]
    counts = failed["cause"].fillna("unknown").value_counts()
    total = int(counts.sum())
    causes = [(str(c), int(n), n / total) for c, n in counts.items()]
    hosts_s = failed["hosts"].dropna().str.split(",").explode()
    culprits = failed["culprit_host"].dropna().value_counts()
    host_counts = hosts_s.value_counts() if len(hosts_s) else pd.Series(dtype="int64")
    hosts = [(str(h), int(n), int(culprits.get(h, 0))) for h, n in host_counts.items()]
    hosts.sort(key=lambda x: (-x[1], -x[2], x[0]))
    rules = [(str(r), int(n)) for r, n in failed["rule"].dropna().value_counts().items()]
    failed_jobs = sorted((o for o in outcomes if o.verdict not in (None, "clean")), key=_priority)
    first = []
    for o in failed_jobs[:5]:
        d = o.diagnoses[0] if o.diagnoses else {}
        first.append(
            (
                o.job.name,
                str(d.get("cause", "unknown")),
                str(d.get("severity", "-")),
                float(d.get("confidence", 0.0)),
            )
        )
    return Summary(
        jobs=len(df),
        files=int(df["files"].sum()),
        failed=len(failed),
        clean=int((df["verdict"] == "clean").sum()),
        unreadable=int(df["verdict"].isna().sum()),
        with_errors=int(df["error"].notna().sum()),
        causes=causes,
        hosts=hosts[:top],
        rules=rules[:top],
        first=first,
    )


def format_summary(s: Summary, stats: BatchStats | None = None) -> str:
    """The summary as text."""
    out = [
        f"{s.jobs} jobs ({s.files} files): {s.failed} failed, {s.clean} clean, "
        f"{s.unreadable} unreadable"
        + (f"; {s.with_errors} with unreadable files" if s.with_errors > s.unreadable else "")
    ]
    if stats is not None:
        engine = stats.engine + (f" x{stats.workers}" if stats.workers > 1 else "")
        out.append(
            f"{stats.triaged} triaged ({engine}), {stats.cached} from cache, "
            f"{stats.seconds:.{2 if stats.seconds < 10 else 1}f} s"
            + (
                f" ({stats.triaged / stats.seconds:.0f} jobs/s)"
                if stats.triaged and stats.seconds
                else ""
            )
        )
    if s.causes:
        out += ["", "causes (failed jobs by top diagnosis)"]
        w = max(len(c) for c, _, _ in s.causes)
        out += [f"  {c:<{w}}  {n:>6}  {share:6.1%}" for c, n, share in s.causes]
    if s.hosts:
        out += ["", "top hosts (failed jobs naming the host, as culprit's host)"]
        w = max(len(h) for h, _, _ in s.hosts)
        out += [f"  {h:<{w}}  {n:>6}  {c:>6}" for h, n, c in s.hosts]
    if s.rules:
        out += ["", "top rules (jobs where the rule is the top diagnosis)"]
        w = max(len(r) for r, _ in s.rules)
        out += [f"  {r:<{w}}  {n:>6}" for r, n in s.rules]
    if s.first:
        out += ["", "look at first (most severe, most confident)"]
        w = max(len(job) for job, _, _, _ in s.first)
        out += [f"  {job:<{w}}  {cause} ({sev}, {conf:.2f})" for job, cause, sev, conf in s.first]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- html

CAUSE_COLORS = {
    "slow_checkpoint_save": "#4e79a7",
    "oom_hidden": "#e15759",
    "generate_zero3": "#f28e2b",
    "network_interface_misconfig": "#76b7b2",
    "network_fabric_failure": "#59a14f",
    "rank_desync_or_mismatched_collective": "#edc948",
    "straggler_or_slow_rank": "#b07aa1",
    "hardware_gpu_fault": "#9c755f",
    "version_or_driver_incompatibility": "#ff9da7",
    "timeout_too_short": "#8cd17d",
    "unknown": "#bab0ac",
}
_OTHER_COLOR = "#79706e"


def render_html(result: BatchResult, max_details: int = 1000) -> str:
    """A self-contained HTML page: charts as inline SVG, a sortable table, every diagnosis.

    Rendered by jinja2's sandbox with autoescaping: log lines are untrusted text. The page
    loads nothing (its Content-Security-Policy forbids it) and works from a file.
    """
    from importlib import resources

    import jinja2
    from jinja2.sandbox import SandboxedEnvironment

    summary = result.summary()
    df = result.table()
    env = SandboxedEnvironment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["advice"] = _advice_html
    text = (
        resources.files("nccl_triage").joinpath("report_templates/batch.html.j2").read_text("utf-8")
    )
    rows = []
    for i, (o, rec) in enumerate(zip(result.outcomes, df.to_dict("records"), strict=True)):
        rows.append(
            {
                "id": f"job-{i}",
                "job": o.job.name,
                "verdict": o.verdict or "unreadable",
                "cause": _text(rec["cause"]),
                "color": CAUSE_COLORS.get(_text(rec["cause"]), _OTHER_COLOR),
                "rule": _text(rec["rule"]),
                "severity": _text(rec["severity"]),
                "severity_order": SEVERITY_ORDER.get(_text(rec["severity"]), -1),
                "confidence": _num(rec["confidence"]),
                "op_type": _text(rec["op_type"]),
                "seq": _num(rec["seq"]),
                "timeout": _cell("timeout_ms", rec["timeout_ms"], 40),
                "timeout_ms": _num(rec["timeout_ms"]),
                "ranks_timed_out": _text(rec["ranks_timed_out"]),
                "culprit": _num(rec["culprit_rank"]),
                "hosts": _text(rec["hosts"]),
                "first_time": "" if _isna(rec["first_time"]) else str(rec["first_time"])[:19],
                "lines": _num(rec["lines"]),
                "error": _text(rec["error"]),
                "detailed": False,
            }
        )
    order = sorted(
        (i for i, o in enumerate(result.outcomes) if o.verdict != "clean"),
        key=lambda i: _priority(result.outcomes[i]),
    )
    details = []
    for i in order[:max_details]:
        o = result.outcomes[i]
        rows[i]["detailed"] = True
        names = [f.name for f in o.job.files]
        diagnoses = []
        for d in o.diagnoses:
            evidence = [
                {
                    "where": f"{names[fi] if 0 <= fi < len(names) else o.job.name}:{line}",
                    "rank": "" if rank is None else f"rank {rank}",
                    "text": text_,
                }
                for fi, line, rank, text_ in d["evidence"]
            ]
            refs = [
                {"url": u, "link": u.startswith(("https://", "http://"))}
                for u in d.get("references", [])
            ]
            diagnoses.append(
                {
                    **d,
                    "evidence": evidence,
                    "references": refs,
                    "color": CAUSE_COLORS.get(d["cause"], _OTHER_COLOR),
                }
            )
        details.append(
            {
                "row": rows[i],
                "diagnoses": diagnoses,
                "errors": o.errors,
                "facts": _facts_line(o.result),
            }
        )
    return env.from_string(text).render(
        title="nccl-triage batch report",
        generated=datetime.now().strftime("%Y-%m-%d %H:%M"),
        version=__version__,
        ruleset=result.ruleset_version,
        summary=summary,
        stats=result.stats,
        causes_chart=_causes_chart(summary),
        time_chart=_time_chart(result.outcomes, df),
        rows=rows,
        details=details,
        hidden_details=max(0, len(order) - max_details),
        anchors={r["job"]: r["id"] for r in rows if r["detailed"]},
        colors=CAUSE_COLORS,
    )


def _priority(o: Outcome) -> tuple[int, float, float, str]:
    """The order to look at failed jobs in: most severe, most confident, most recent first."""
    d = o.diagnoses[0] if o.diagnoses else None
    recent = 0.0
    with contextlib.suppress(KeyError, ValueError, OverflowError):  # None, or "2024-13-45"
        recent = -datetime.fromisoformat(str(o.result["first_time"])).timestamp()
    if d is None:
        return (1, 0.0, recent, o.job.name)
    severity = -SEVERITY_ORDER.get(str(d["severity"]), -1)
    return (severity, -float(d["confidence"]), recent, o.job.name)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _num(value: Any) -> float | int | None:
    if value is None or _isna(value):
        return None
    f = float(value)
    return int(f) if f.is_integer() else round(f, 4)


def _facts_line(r: JobResult) -> str:
    parts = []
    if r.get("op_type"):
        parts.append(
            f"{r['op_type']}" + (f" SeqNum {r['seq']}" if r.get("seq") is not None else "")
        )
    if r.get("ranks_timed_out"):
        parts.append("ranks timed out: " + ",".join(str(x) for x in r["ranks_timed_out"]))
    if r.get("culprit_rank") is not None:
        parts.append(
            f"culprit rank {r['culprit_rank']}"
            + (f" on {r['culprit_host']}" if r.get("culprit_host") else "")
        )
    if r.get("hosts"):
        parts.append("hosts: " + ", ".join(r["hosts"]))
    if r.get("lines") is not None:
        parts.append(f"{r['lines']} lines")
    return "; ".join(parts)


_CODE_SPAN = re.compile(r"`([^`]+)`")


def _advice_html(text: str) -> Any:
    """Advice (Markdown from the rule's template) as HTML: paragraphs, lists, code spans.

    Every piece is escaped before any tag is added, so nothing in the text becomes markup.
    """
    from markupsafe import Markup, escape

    def inline(s: str) -> str:
        return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", str(escape(s)))

    html: list[str] = []
    in_list = False
    para: list[str] = []

    def flush() -> None:
        if para:
            html.append("<p>" + inline(" ".join(para)) + "</p>")
            para.clear()

    for line in str(text).splitlines():
        stripped = line.strip()
        if stripped.startswith(("- ", "* ")):
            flush()
            if not in_list:
                html.append("<ul>")
                in_list = True
            html.append("<li>" + inline(stripped[2:]) + "</li>")
            continue
        if in_list and stripped and line.startswith("  "):
            html[-1] = html[-1][: -len("</li>")] + " " + inline(stripped) + "</li>"
            continue
        if in_list:
            html.append("</ul>")
            in_list = False
        if stripped:
            para.append(stripped)
        else:
            flush()
    flush()
    if in_list:
        html.append("</ul>")
    return Markup("\n".join(html))  # built from escaped pieces only


def _causes_chart(s: Summary) -> dict[str, Any]:
    bar_h, gap, label_w, bar_w = 22, 6, 300, 420
    bars = []
    most = max((n for _, n, _ in s.causes), default=1)
    for i, (cause, n, share) in enumerate(s.causes):
        bars.append(
            {
                "label": cause,
                "y": i * (bar_h + gap),
                "w": max(2.0, bar_w * n / most),
                "n": n,
                "share": f"{share:.1%}",
                "color": CAUSE_COLORS.get(cause, _OTHER_COLOR),
            }
        )
    height = max(1, len(bars)) * (bar_h + gap)
    return {
        "bars": bars,
        "bar_h": bar_h,
        "label_w": label_w,
        "width": label_w + bar_w + 110,
        "height": height,
    }


def _time_chart(outcomes: Sequence[Outcome], df: pd.DataFrame) -> dict[str, Any]:
    """Failed jobs per day (or week, or month), stacked by cause.

    Jobs are placed by the first dated line of their logs. Only when no failed job has one
    are they placed by their files' modification time (an archive's files usually keep the
    time the job ended); the two are never mixed.
    """
    import pandas as pd

    failed = df["verdict"].notna() & (df["verdict"] != "clean")
    when = df["first_time"]
    basis = "log"
    undated = int((failed & when.isna()).sum())
    if not (failed & when.notna()).any():
        mtimes = pd.Series([o.job.mtime for o in outcomes], index=df.index, dtype="float64")
        when = pd.to_datetime(mtimes, unit="s", errors="coerce")
        basis, undated = "mtime", int((failed & when.isna()).sum())
    data = pd.DataFrame({"when": when, "cause": df["cause"].fillna("unknown")})[
        failed & when.notna()
    ]
    if data.empty:
        return {"bars": [], "basis": basis, "undated": undated}
    span = (data["when"].max() - data["when"].min()).days
    freq, label = ("D", "day") if span <= 90 else ("W", "week") if span <= 700 else ("MS", "month")
    periods = data["when"].dt.to_period(freq[0] if freq != "MS" else "M").dt.start_time
    counts = data.assign(period=periods).groupby(["period", "cause"]).size().unstack(fill_value=0)
    full = pd.period_range(
        counts.index.min(), counts.index.max(), freq=freq[0] if freq != "MS" else "M"
    ).start_time
    counts = counts.reindex(full, fill_value=0)
    plot_w, plot_h, left, top = 760, 180, 40, 10
    n = len(counts)
    step = plot_w / n
    peak = int(counts.sum(axis=1).max()) or 1
    bars = []
    for i, (period, row) in enumerate(counts.iterrows()):
        y = float(top + plot_h)
        for cause, k in row.items():
            if not k:
                continue
            h = plot_h * int(k) / peak
            y -= h
            bars.append(
                {
                    "x": left + i * step + step * 0.1,
                    "y": y,
                    "w": max(1.0, step * 0.8),
                    "h": h,
                    "color": CAUSE_COLORS.get(str(cause), _OTHER_COLOR),
                    "title": f"{str(period)[:10]}: {k} × {cause}",
                }
            )
    ticks = sorted({0, n // 2, n - 1})
    labels = [
        {
            "x": left + i * step + step / 2,
            "text": str(counts.index[i])[: 7 if freq == "MS" else 10],
            "anchor": "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle",
        }
        for i in ticks
    ]
    return {
        "bars": bars,
        "labels": labels,
        "peak": peak,
        "unit": label,
        "width": left + plot_w + 10,
        "height": top + plot_h + 30,
        "base": top + plot_h,
        "left": left,
        "top": top,
        "basis": basis,
        "undated": undated,
        "grid": [
            {"y": top + plot_h * (1 - v / peak), "v": v} for v in sorted({peak // 2, peak} - {0})
        ],
    }


def write_html(result: BatchResult, path: str, max_details: int = 1000) -> None:
    """Render the report and write it to ``path``."""
    Path(path).write_text(render_html(result, max_details), encoding="utf-8")
