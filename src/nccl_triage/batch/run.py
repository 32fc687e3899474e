"""A batch run: jobs through the cache and an engine into outcomes and statistics.

Input: paths and options. Output: a :class:`BatchResult`, one :class:`Outcome` per job.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nccl_triage.errors import InputError
from nccl_triage.ruleset import Ruleset

if TYPE_CHECKING:
    import pandas as pd

from nccl_triage.batch.cache import ResultCache, cacheable, code_version, stored
from nccl_triage.batch.engines import CacheView, run_dask, run_processes, run_serial
from nccl_triage.batch.inputs import (
    DEFAULT_FR_PATTERNS,
    DEFAULT_INCLUDE,
    SERIAL_BELOW,
    InputFile,
    Job,
    JobResult,
    Progress,
    attach_dumps,
    discover,
    group_jobs,
)
from nccl_triage.batch.job import CacheInfo, unreadable_result
from nccl_triage.batch.table import Summary, build_table, preload, summarize

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
    dumps: int = 0  # flight-recorder dumps found (read with their jobs, not as logs)
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
    # the tables built so far, by per_diagnosis (the outcomes do not change)
    _tables: dict[bool, pd.DataFrame] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def table(self, per_diagnosis: bool = False) -> pd.DataFrame:
        """One row per job (or per diagnosis): see :data:`COLUMNS` (a copy of it)."""
        return self._built(per_diagnosis).copy()

    def summary(self) -> Summary:
        """Causes, hosts and rules over the jobs, and the jobs to look at first."""
        return summarize(self.outcomes, table=self._built(False))

    def _built(self, per_diagnosis: bool) -> pd.DataFrame:
        built = self._tables.get(per_diagnosis)
        if built is None:
            built = self._tables[per_diagnosis] = build_table(self.outcomes, per_diagnosis)
        return built

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
    fr_patterns: Sequence[str] = DEFAULT_FR_PATTERNS  # names of flight-recorder dumps
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
    files = discover(paths, opts.include, opts.fr_patterns)
    jobs, notes = attach_dumps(group_jobs(files, opts.group_by, opts.per_file), files)
    stats = BatchStats(
        files=sum(1 for f in files if f.error is None and not f.dump),
        dumps=sum(1 for f in files if f.dump),
        jobs=len(jobs),
    )
    cache: ResultCache | None = None
    if opts.db is not None:
        stats.cache_path = str(opts.db)
        try:
            cache = ResultCache(opts.db, f"{code_version()}:{ruleset.version}")
        except (OSError, sqlite3.Error) as exc:
            stats.cache_note = f"cache {opts.db} not used: {exc}"
    outcomes: dict[str, Outcome] = {}
    keys: dict[str, str] = {}

    def looked_up(job: Job) -> Job | None:
        """The job to triage, or None: unreadable, or its result cached (its outcome kept)."""
        if all(f.error for f in job.files):
            outcomes[job.name] = Outcome(job, unreadable_result(job))
            return None
        if cache is not None:
            job = _hashed(job, cache, keys)  # files unreadable now carry their error
            if all(f.error for f in job.files):
                outcomes[job.name] = Outcome(job, unreadable_result(job))
                return None
            hit = cache.get(keys[job.name]) if job.name in keys else None
            if hit is not None:
                outcomes[job.name] = Outcome(job, _renamed(hit, job), cached=True)
                stats.cached += 1
                return None
        return job

    # Jobs whose files the cache knows (or without a cache) are looked up now; the others,
    # whose files must be hashed first, by the process that triages them, as it reads them
    # (it looks their results up itself: a copy of a file seen before is found).
    todo: list[Job] = []
    new: list[Job] = []
    if cache is not None:
        cache.expect(sum(len(job.files) for job in jobs))
    for job in jobs:
        if cache is not None and not cache.knows(job.files):  # (a file to read: no error)
            new.append(job)
        elif (ready := looked_up(job)) is not None:
            todo.append(ready)
    workers = opts.workers or os.cpu_count() or 1
    try:
        found = _engine(todo, new, looked_up, ruleset, opts, workers, stats, progress, cache)
        for job, result in found:
            info: CacheInfo | None = result.pop("_cache", None)
            key = keys.get(job.name)
            if info is not None and cache is not None:
                key = _remember_hashes(cache, job, info)
                if info["hit"] and key is not None:
                    cache.touch(key)
                    outcomes[job.name] = Outcome(job, _renamed(result, job), cached=True)
                    stats.cached += 1
                    continue
            outcomes[job.name] = Outcome(job, result)
            if info is not None and info["unreadable"]:
                continue  # (as looked_up finds it: not triaged)
            stats.triaged += 1
            if cache is not None and key is not None and cacheable(result):
                text = info["stored"] if info is not None else None
                cache.put(key, text if text is not None else stored(result, job))
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
    dumps: list[tuple[str, str]] = []  # (digest, name): a dump's rank may come from its name
    for d in job.dumps:
        try:
            dumps.append((cache.digest(d) if d.error is None else "error", d.name))
        except InputError:
            dumps.append(("error", d.name))
    job = replace(job, files=tuple(files))
    if all(f.error is None for f in files):
        keys[job.name] = cache.key(job, digests, dumps)
    return job


def _remember_hashes(cache: ResultCache, job: Job, info: CacheInfo) -> str | None:
    """Remember the hashes a worker worked out for a job's files; return the job's key."""
    for i, digest in info["files"]:
        cache.remember_hash(job.files[i], digest)
    for i, digest in info["dumps"]:
        cache.remember_hash(job.dumps[i], digest)
    return info["key"]


def _renamed(result: JobResult, job: Job) -> JobResult:
    """A cached result, naming this job's files where it named those it was made from.

    The same bytes may have been cached under another path.
    """
    old = result.pop("file_names", None)
    if not isinstance(old, list) or len(old) != len(job.files):
        return result
    pairs = [(o, f.name) for o, f in zip(old, job.files, strict=True) if o != f.name]
    if not pairs:
        return result

    def rename(text: str) -> str:
        for before, after in pairs:
            text = text.replace(before, after)
        return text

    out = dict(result)
    out["errors"] = [[e[0], rename(str(e[1])), *e[2:]] for e in result.get("errors", [])]
    out["notes"] = [rename(str(n)) for n in result.get("notes", [])]
    return out


def _engine(
    todo: list[Job],
    new: list[Job],
    looked_up: Callable[[Job], Job | None],
    ruleset: Ruleset,
    opts: BatchOptions,
    workers: int,
    stats: BatchStats,
    progress: Progress | None,
    cache: ResultCache | None,
) -> Iterator[tuple[Job, JobResult]]:
    """Triage ``todo`` and ``new``, the jobs new to the cache.

    Locally, whatever triages a new job hashes it and looks it up first; on Dask (whose
    workers may not see the cache) ``looked_up`` hashes and looks it up here.
    """
    count = len(todo) + len(new)
    if opts.engine == "dask":
        stats.engine, stats.workers = "dask", workers
        jobs = todo + [ready for job in new if (ready := looked_up(job)) is not None]
        if not jobs:
            return iter(())
        return run_dask(jobs, ruleset, opts.scheduler, workers, progress)
    if workers <= 1 or (opts.workers == 0 and count < SERIAL_BELOW):
        stats.engine, stats.workers = "serial", 1
        return run_serial(todo, ruleset, progress, new, cache)
    stats.engine, stats.workers = "processes", min(workers, max(1, count))
    view = CacheView(str(cache.path), cache.versions) if cache is not None and new else None

    def forking() -> None:
        if cache is not None:
            cache.release()  # (no connection across the fork)

    def forked() -> None:
        if cache is not None:
            cache.reopen()
        preload()

    return run_processes(
        todo, ruleset, stats.workers, progress, new, view, forking=forking, forked=forked
    )
