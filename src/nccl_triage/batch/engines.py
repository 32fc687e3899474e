"""Where jobs run: in this process, in a pool of worker processes, or on a Dask cluster.

Input: jobs and a ruleset. Output: their :data:`JobResult` objects, in order. Workers build
the grammar once and never import pandas, so forking a pool stays cheap and safe.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from nccl_triage.batch.inputs import Job, JobResult, Progress, optional_module
from nccl_triage.batch.job import failed_result, triage_job_files
from nccl_triage.errors import TriageError
from nccl_triage.ruleset import Ruleset

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
    from nccl_triage.pipeline import settle_collector

    _worker_ruleset = ruleset
    parser()  # build the grammar once per process, before the first job
    settle_collector()  # a worker of ours: the collector tuned as the command line's


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
    jobs: Iterable[Job],
    ruleset: Ruleset,
    workers: int,
    progress: Progress | None = None,
    total: int | None = None,
) -> Iterator[tuple[Job, JobResult]]:
    """Triage jobs in a pool of ``workers`` processes, yielding results as they come.

    A list is handed out largest jobs first; any other iterable is drawn as the workers need
    more (a few chunks ahead), so whatever makes its jobs (hashing them for the cache) runs
    while the workers triage. ``total``: how many jobs there are at most (for ``progress``).
    """
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    if isinstance(jobs, list):
        total = len(jobs)
        chunks: Iterator[list[Job]] = iter(_chunks(jobs, workers, 32))
    else:
        size = max(1, min(32, (total or 0) // (workers * 8) or 1))
        chunks = _chunked(iter(jobs), size)
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
        pending: dict[Future[list[JobResult]], list[Job]] = {}
        failed: list[list[Job]] = []  # chunks no worker will take

        def hand_out(count: int) -> None:
            nonlocal broken
            for chunk in itertools.islice(chunks, count):
                if broken is None:
                    try:
                        pending[pool.submit(_run_chunk, chunk)] = chunk
                        continue
                    except BrokenProcessPool as exc:
                        broken = f"a worker process died ({exc or 'killed'})"
                failed.append(chunk)

        hand_out(ahead)
        while pending or failed:
            finished = wait(pending, return_when=FIRST_COMPLETED)[0] if pending else set()
            out: list[tuple[list[Job], list[JobResult]]] = []
            for fut in finished:
                chunk = pending.pop(fut)
                try:
                    out.append((chunk, fut.result()))
                except BrokenProcessPool as exc:
                    broken = broken or f"a worker process died ({exc or 'killed'})"
                    out.append((chunk, [failed_result(j, broken) for j in chunk]))
            hand_out(len(finished))
            if broken is not None:  # the rest as the old pool failed them: every job, at once
                hand_out(sys.maxsize)
            while failed:
                chunk = failed.pop(0)
                out.append((chunk, [failed_result(j, broken or "not triaged") for j in chunk]))
            for chunk, results in out:
                yield from zip(chunk, results, strict=True)
                done += len(chunk)
                if progress:
                    progress(done, max(done, total or done))


def _chunked(jobs: Iterator[Job], size: int) -> Iterator[list[Job]]:
    """Lists of ``size`` jobs (the last one shorter), drawn as they are asked for."""
    while chunk := list(itertools.islice(jobs, size)):
        yield chunk


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
