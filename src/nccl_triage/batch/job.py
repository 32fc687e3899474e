"""One job through the pipeline: its files read into one triage, the result as plain data.

Input: a :class:`~nccl_triage.batch.inputs.Job` and a ruleset, and for a job new to the cache
where to look results up (a :class:`Lookup`). Output: a :data:`JobResult` (JSON-able: verdict,
diagnoses with evidence, facts, errors), what workers return and the cache keeps; for a new
job also what was worked out for the cache (:class:`CacheInfo`, under ``"_cache"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import IO, Any, Protocol, TypedDict

from nccl_triage.batch.cache import cacheable, job_key, read_digest, stored, url_digest
from nccl_triage.batch.inputs import (
    HEAD_BYTES,
    ISO_TIME_STR,
    MAX_EVIDENCE,
    MAX_TEXT,
    InputFile,
    Job,
    JobResult,
    first_iso_time,
    optional_module,
    os_error_reason,
)
from nccl_triage.errors import InputError, TemplateError
from nccl_triage.ingest.reader import chunks_of, iter_chunks, open_binary
from nccl_triage.model import Event, Report
from nccl_triage.pipeline import Triage, job_budget
from nccl_triage.ruleset import Ruleset

# ----------------------------------------------------------------------------- one job

HOLD_BYTES = 64 << 20  # a new job's bytes kept from hashing to triage (beyond: read twice)


class CacheInfo(TypedDict):
    """What a worker worked out for the cache about a new job (``result["_cache"]``)."""

    files: list[tuple[int, str]]  # (index in job.files, hash) of each local file hashed
    dumps: list[tuple[int, str]]  # the same for its flight-recorder dumps
    key: str | None  # the job's cache key; None when a file could not be read
    hit: bool  # the result came from the cache
    unreadable: bool  # no file could be read: not triaged
    stored: str | None  # the result as the cache stores it (:func:`stored`), when it may


class Lookup(Protocol):
    """Where the results of earlier runs are looked up: a cache, or a worker's view of it."""

    versions: str

    def peek(self, key: str) -> JobResult | None:
        """The result under ``key``, if any."""
        ...


def triage_new_job(job: Job, ruleset: Ruleset, lookup: Lookup) -> JobResult:
    """Hash a job the cache does not know, look its result up, and triage it when not found.

    The bytes hashed are the bytes triaged (read once, up to :data:`HOLD_BYTES`). The result
    holds what was worked out for the cache under ``"_cache"`` (:class:`CacheInfo`). A file
    that cannot be read is an error of the job, as in :func:`triage_job_files`.
    """
    files: list[InputFile] = []
    digests: list[str] = []
    hashed: list[tuple[int, str]] = []
    held: dict[str, bytes] = {}
    room = HOLD_BYTES
    for i, f in enumerate(job.files):
        if f.error:
            files.append(f)
            continue
        try:
            digest, data = _digest(f, room)
        except InputError as exc:
            files.append(replace(f, error=str(exc)))
            continue
        files.append(f)
        digests.append(digest)
        if not f.is_url:
            hashed.append((i, digest))
        if data is not None:
            held[f.path] = data
            room -= len(data)
    dumps: list[tuple[str, str]] = []  # (hash, name): a dump's rank may come from its name
    dump_hashes: list[tuple[int, str]] = []
    for i, d in enumerate(job.dumps):
        try:
            digest = "error" if d.error else _digest(d, 0)[0]
        except InputError:
            digest = "error"
        dumps.append((digest, d.name))
        if digest != "error" and not d.is_url:
            dump_hashes.append((i, digest))
    job = replace(job, files=tuple(files))
    key = job_key(lookup.versions, job, digests, dumps) if len(digests) == len(files) else None
    info = CacheInfo(
        files=hashed, dumps=dump_hashes, key=key, hit=False, unreadable=False, stored=None
    )
    found = lookup.peek(key) if key is not None else None
    if found is not None:
        info["hit"] = True
        result = found
    elif all(f.error for f in files):
        info["unreadable"] = True
        result = unreadable_result(job)
    else:
        result = triage_job_files(job, ruleset, held)
        if key is not None and cacheable(result):
            info["stored"] = stored(result, job)  # (the JSON made here, beside the work)
    result["_cache"] = info
    return result


def _digest(f: InputFile, hold: int) -> tuple[str, bytes | None]:
    """A file's content hash, and its bytes when at most ``hold`` (:func:`read_digest`).

    Raises:
        InputError: the file cannot be read.
    """
    if f.is_url:
        return url_digest(f), None
    try:
        return read_digest(f.path, hold)
    except IsADirectoryError:
        raise InputError(f.name, "is a directory") from None
    except OSError as exc:
        raise InputError(f.name, os_error_reason(exc)) from None


def unreadable_result(job: Job) -> JobResult:
    """The result of a job none of whose files could be read."""
    return {"verdict": None, "errors": [[i, f.error, "access"] for i, f in enumerate(job.files)]}


def triage_job_files(
    job: Job, ruleset: Ruleset, held: Mapping[str, bytes] | None = None
) -> JobResult:
    """Triage one job's files as one input and return the result as plain data.

    A file that cannot be read adds its error and nothing else; the job is triaged from the
    files that could be read. Line numbers stay per file, and evidence names its file by
    index into ``job.files``. In a job of several files, events of a file that does not say
    their rank get the file's rank: the one rank its lines name, or the layout's. The job's
    flight-recorder dumps join its facts; one that cannot be read is a note. ``held``: the
    bytes of files already read, by path.
    """
    errors: list[list[Any]] = [[i, f.error, "access"] for i, f in enumerate(job.files) if f.error]
    triage = Triage(ruleset, job.name, max_candidates=job_budget(len(job.files)))
    dump_notes = _read_dumps(triage, job)
    heads: list[str] = []
    read = 0
    for i, f in enumerate(job.files):
        if f.error:
            continue
        try:
            data = held.get(f.path) if held else None
            head = _feed_file(triage, f, len(job.files) > 1, data)
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
    result = _result(job, triage.report(), ruleset, heads, errors, read)
    result["notes"] = [*dump_notes, *result["notes"]]
    return result


def _read_dumps(triage: Triage, job: Job) -> list[str]:
    """Read the job's flight-recorder dumps into ``triage``; return one note per problem."""
    notes = [f"{d.error}" for d in job.dumps if d.error]
    remote = [d.name for d in job.dumps if d.is_url and not d.error]
    notes.extend(f"{name}: flight-recorder dumps are read from local paths only" for name in remote)
    local = [d.path for d in job.dumps if not d.is_url and not d.error]
    if local:
        notes.extend(triage.read_dumps(local).problems)
    return notes


def _feed_file(triage: Triage, f: InputFile, several: bool, data: bytes | None) -> str | None:
    """Read one file of a job (or its bytes, ``data``) into ``triage``.

    Return the ISO time its first bytes show.
    """
    triage.open(f.name, rank_hint=f.rank if several else None)
    head = b""
    with _chunks(f, data) as chunks:
        for chunk in chunks:
            if not head:
                head = chunk[:HEAD_BYTES]
            triage.feed(chunk, f.name)
    triage.close(f.name)
    return first_iso_time(head) if head else None


@contextlib.contextmanager
def _chunks(f: InputFile, data: bytes | None) -> Iterator[Iterator[bytes]]:
    if data is not None:
        yield chunks_of(data, f.name)
        return
    if not f.is_url:
        with open_binary(f.path) as reader:
            reader.name = f.name
            yield iter_chunks(reader)
        return
    fsspec = optional_module("fsspec")
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
        yield iter_chunks(reader)
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
    from nccl_triage.render.advice import advice_or_failure, render_advice

    index = {f.name: i for i, f in enumerate(job.files)}
    facts = report.facts
    notes: list[str] = list(report.notes)
    diagnoses = []
    for f in report.findings:
        try:
            advice = render_advice(f, facts, ruleset.template_dirs)
        except TemplateError as exc:
            advice = advice_or_failure(f, facts, ruleset.template_dirs)
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
        *(m.group(0) for e in everything if e.time and (m := ISO_TIME_STR.search(e.time))),
    ]
    culprit = _culprit(report)
    fr = report.flight_recorder
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
        "flight_recorder": _dump_summary(report) if fr is not None else None,
        "errors": errors,
        "notes": notes,
        "files_read": files_read,
    }


def _dump_summary(report: Report) -> dict[str, Any]:
    """What the job's dumps say, as plain data: counts, culprits, side, stuck collective, frame."""
    facts = report.facts
    stuck = None
    if facts.fr_stuck_op is not None:
        stuck = f"{facts.fr_stuck_op} #{facts.fr_stuck_seq} of process group {facts.fr_stuck_pg}"
        if facts.fr_stuck_pg_desc:
            stuck += f" ({facts.fr_stuck_pg_desc})"
    return {
        "dumps": facts.fr_dumps,
        "hung": facts.fr_hung,
        "culprit_ranks": facts.fr_culprit_ranks,
        "side": facts.fr_side,
        "kind": facts.fr_kind,
        "stuck": stuck,
        "frame": facts.fr_frame,
    }


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _first_failure(report: Report) -> Event | None:
    from nccl_triage.model import is_failure

    return next((e for e in report.events if is_failure(e)), None)


def _culprit(report: Report) -> int | None:
    """The rank most likely at fault (:meth:`Report.culprit`)."""
    return report.culprit()[0]


def _host_of(events: Iterable[Event], rank: int | None) -> str | None:
    if rank is None:
        return None
    return next((e.host for e in events if e.rank == rank and e.host), None)


def failed_result(job: Job, msg: str) -> JobResult:
    """The result of a job that could not be triaged (a worker died, an internal error)."""
    return {"verdict": None, "errors": [[-1, f"{job.name}: {msg}", "internal"]]}
