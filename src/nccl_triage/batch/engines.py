"""Where jobs run: in this process, in a pool of worker processes, or on a Dask cluster.

Input: jobs and a ruleset, and the jobs new to the cache with where to look results up.
Output: their :data:`JobResult` objects. Workers build the grammar once and never import
pandas, so forking a pool stays cheap and safe; they hash the jobs new to the cache as they
read them and look their results up in the cache themselves (read only).
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from nccl_triage.batch.cache import ReadOnlyCache
from nccl_triage.batch.inputs import Job, JobResult, Progress, optional_module
from nccl_triage.batch.job import Lookup, failed_result, triage_job_files, triage_new_job
from nccl_triage.errors import TriageError
from nccl_triage.ruleset import Ruleset

# ----------------------------------------------------------------------------- workers


T = TypeVar("T")
Task = tuple[Job, bool]  # a job, and whether it is new to the cache (hashed and looked up)


@dataclass(frozen=True, slots=True)
class CacheView:
    """Where a worker looks results up: the run's cache, read only."""

    path: str
    versions: str


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
_worker_caches: dict[CacheView, ReadOnlyCache] = {}


def _init_worker(ruleset: Ruleset) -> None:
    global _worker_ruleset
    from nccl_triage.parse.grammar import parser
    from nccl_triage.pipeline import settle_collector

    _worker_ruleset = ruleset
    parser()  # build the grammar once per process, before the first job
    settle_collector()  # a worker of ours: the collector tuned as the command line's


def _run_chunk(tasks: list[Task], view: CacheView | None) -> list[JobResult]:
    assert _worker_ruleset is not None, "worker not initialised"
    lookup: Lookup | None = None
    if view is not None and any(new for _, new in tasks):
        lookup = _worker_caches.get(view)
        if lookup is None:
            lookup = _worker_caches[view] = ReadOnlyCache(view.path, view.versions)
    return [_safe_triage(job, _worker_ruleset, lookup if new else None) for job, new in tasks]


def _run_chunk_dask(jobs: list[Job], portable: PortableRuleset) -> list[JobResult]:
    ruleset = portable.materialize()
    return [_safe_triage(job, ruleset) for job in jobs]


def _safe_triage(job: Job, ruleset: Ruleset, lookup: Lookup | None = None) -> JobResult:
    try:
        if lookup is not None:
            return triage_new_job(job, ruleset, lookup)
        return triage_job_files(job, ruleset)
    except Exception as exc:  # noqa: BLE001 - reported as the job's error, the run goes on
        return {
            "verdict": None,
            "errors": [
                [-1, f"{job.name}: internal error: {type(exc).__name__}: {exc}", "internal"]
            ],
        }


def _chunks(items: list[T], job_of: Callable[[T], Job], workers: int, most: int) -> list[list[T]]:
    # Large jobs first so that no worker is left with a big one at the end.
    ordered = sorted(items, key=lambda t: -sum(f.size or 0 for f in job_of(t).files))
    size = max(1, min(most, len(ordered) // (workers * 8) or 1))
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def _same(job: Job) -> Job:
    return job


def run_serial(
    jobs: list[Job],
    ruleset: Ruleset,
    progress: Progress | None = None,
    new: Sequence[Job] = (),
    lookup: Lookup | None = None,
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs one after the other in this process.

    ``new``: jobs new to the cache, hashed as they are read and looked up in ``lookup``
    first (:func:`~nccl_triage.batch.job.triage_new_job`).
    """
    total = len(jobs) + len(new)
    tasks = itertools.chain(((j, None) for j in jobs), ((j, lookup) for j in new))
    for i, (job, looks) in enumerate(tasks, 1):
        yield job, _safe_triage(job, ruleset, looks)
        if progress:
            progress(i, total)


def run_processes(
    jobs: list[Job],
    ruleset: Ruleset,
    workers: int,
    progress: Progress | None = None,
    new: Sequence[Job] = (),
    cache: CacheView | None = None,
    forking: Callable[[], None] | None = None,
    forked: Callable[[], None] | None = None,
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs in a pool of ``workers`` processes, yielding results as they come.

    Jobs are handed out largest first. ``new``: jobs new to the cache, which the workers hash
    as they read them and look up in ``cache`` first
    (:func:`~nccl_triage.batch.job.triage_new_job`). ``forking`` is called just before the
    worker processes start, ``forked`` once no more will be forked from this one.
    """
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    tasks: list[Task] = [(j, False) for j in jobs] + [(j, True) for j in new]
    total = len(tasks)
    chunks = iter(_chunks(tasks, operator.itemgetter(0), workers, 32))
    context = multiprocessing.get_context(_start_method())
    if context.get_start_method() == "fork":
        from nccl_triage.parse.grammar import parser

        parser()  # built once here, inherited by every worker
    elif context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["nccl_triage.batch.job"])
    done = 0
    ahead = workers * 4  # chunks handed out before their turn: no worker waits for the next
    broken: str | None = None  # why the pool cannot take more (a worker died)
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(ruleset,)
    ) as pool:
        pending: dict[Future[list[JobResult]], list[Task]] = {}
        failed: list[list[Task]] = []  # chunks no worker will take

        def hand_out(count: int) -> None:
            nonlocal broken
            for chunk in itertools.islice(chunks, count):
                if broken is None:
                    try:
                        pending[pool.submit(_run_chunk, chunk, cache)] = chunk
                        continue
                    except BrokenProcessPool as exc:
                        broken = f"a worker process died ({exc or 'killed'})"
                failed.append(chunk)

        if forking is not None:
            forking()
        try:
            # (CPython's pool starts every worker at the first job handed out when it forks,
            # and never another: concurrent.futures.process, _launch_processes)
            hand_out(ahead)
        finally:
            if forked is not None:
                forked()
        while pending or failed:
            finished = wait(pending, return_when=FIRST_COMPLETED)[0] if pending else set()
            out: list[tuple[list[Task], list[JobResult]]] = []
            for fut in finished:
                chunk = pending.pop(fut)
                try:
                    out.append((chunk, fut.result()))
                except BrokenProcessPool as exc:
                    broken = broken or f"a worker process died ({exc or 'killed'})"
                    out.append((chunk, [failed_result(j, broken) for j, _ in chunk]))
            hand_out(len(finished))
            if broken is not None:  # the rest as the old pool failed them: every job, at once
                hand_out(sys.maxsize)
            while failed:
                chunk = failed.pop(0)
                out.append((chunk, [failed_result(j, broken or "not triaged") for j, _ in chunk]))
            for chunk, results in out:
                yield from zip((job for job, _ in chunk), results, strict=True)
                done += len(chunk)
                if progress:
                    progress(done, total)


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
    distributed = optional_module("distributed")
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
        chunks = _chunks(absolute, _same, n, 64)
        futures = client.map(_run_chunk_dask, chunks, portable=portable, pure=False)
        index = {fut.key: chunk for fut, chunk in zip(futures, chunks, strict=True)}
        done = 0
        for fut in as_completed(futures):
            chunk = index[fut.key]
            try:
                results = fut.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker: those jobs become rows
                msg = f"dask task failed: {type(exc).__name__}: {exc}"
                results = [failed_result(j, msg) for j in chunk]
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
