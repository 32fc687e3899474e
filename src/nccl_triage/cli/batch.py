"""``nccl-triage batch``: options in, a table, a summary and an HTML report out, and the exit code.

Input: paths, directories, globs and URLs of archived job logs, and the options below.
Output: the job table on stdout (or ``--out FILE``), the summary on stdout, ``--html FILE``,
one warning on stderr per input that could not be read, a progress bar on a terminal, and the
exit status of ``docs/json-output.md``: 0 when every job read is clean, 1 when a failure was
diagnosed, 2 for a usage error or when no input could be read at all. The work is done by
:mod:`nccl_triage.batch`, imported only when the command runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from nccl_triage.cli.common import (
    EXIT_CLEAN,
    EXIT_FINDINGS,
    EXIT_USAGE,
    error,
    load_rules,
    quiet_broken_pipe,
    rule_source_options,
)
from nccl_triage.errors import TriageError


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "-j",
    "--jobs",
    "workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Worker processes (0: one per CPU, none for a few jobs); Dask workers of a local cluster.",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the table to FILE: .csv, .parquet (needs pyarrow) or .jsonl; not printed then.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a self-contained HTML report: charts, sortable table, every diagnosis.",
)
@click.option("--per-diagnosis", is_flag=True, help="One row per diagnosis instead of per job.")
@click.option(
    "--group-by",
    metavar="REGEX",
    help="Group files into jobs by this pattern (named groups 'job' and 'rank'); "
    "torchrun --log-dir and Slurm %j/%t names are grouped without it.",
)
@click.option("--no-group", is_flag=True, help="Every file is a job of its own.")
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="File names to take inside directories (repeatable; default *.log *.out *.err *.txt, "
    "compressed or not).",
)
@click.option(
    "--fr-pattern",
    "fr_patterns",
    multiple=True,
    metavar="GLOB",
    help="Names of flight-recorder dumps (repeatable; default nccl_trace_rank_* *fr_trace* "
    "*fr_dump* _dump_*, and the name must end in the rank number). Dumps are read with the job "
    "whose logs share their folder, never triaged as logs.",
)
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False),
    help="The result cache (SQLite) [default: $XDG_CACHE_HOME/nccl-triage/batch.sqlite].",
)
@click.option("--no-cache", is_flag=True, help="Triage everything; read and write no cache.")
@click.option(
    "--engine",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="local processes, or a Dask cluster (pip install 'nccl-triage[dask]').",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="The Dask scheduler (tcp://host:8786); without it a local cluster of -j workers.",
)
@rule_source_options
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar (default: when stderr is a terminal).",
)
def batch(
    paths: tuple[str, ...],
    workers: int,
    out_path: str | None,
    html_path: str | None,
    per_diagnosis: bool,
    group_by: str | None,
    no_group: bool,
    include: tuple[str, ...],
    fr_patterns: tuple[str, ...],
    db_path: str | None,
    no_cache: bool,
    engine: str,
    scheduler: str | None,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    progress: bool | None,
) -> None:
    """Triage every job log under PATH... into one table, a summary and an HTML report.

    PATH is a file, a directory (searched recursively), a glob, or an fsspec URL (s3://,
    gs://, file://). PyTorch flight-recorder dumps found beside a job's logs are read with it
    (--fr-pattern). Results are cached by content, so a rerun over a growing archive only
    triages what is new or changed.
    """
    from nccl_triage import batch as b

    if scheduler and engine != "dask":
        _usage("--scheduler needs --engine dask")
    if db_path and no_cache:
        _usage("--db and --no-cache exclude each other")
    if out_path and not out_path.lower().endswith((".csv", ".parquet", ".jsonl", ".ndjson")):
        _usage(f"--out {out_path}: unknown table format (use .csv, .parquet or .jsonl)")
    if out_path and out_path.lower().endswith(".parquet") and not _have("pyarrow"):
        _usage(
            f"--out {out_path}: writing Parquet needs pyarrow: pip install 'nccl-triage[parquet]'"
        )
    if engine == "dask" and not _have("distributed"):
        _usage("--engine dask needs dask.distributed: pip install 'nccl-triage[dask]'")
    ruleset = load_rules(rule_dirs, only, disable)
    options = b.BatchOptions(
        include=include or b.DEFAULT_INCLUDE,
        fr_patterns=fr_patterns or b.DEFAULT_FR_PATTERNS,
        group_by=group_by,
        per_file=no_group,
        workers=workers,
        engine=engine,
        scheduler=scheduler,
        db=None if no_cache else Path(db_path) if db_path else b.default_db(),
    )
    show = sys.stderr.isatty() if progress is None else progress
    from nccl_triage.pipeline import settle_collector

    settle_collector()  # (thousands of jobs allocate as much as one big log)
    try:
        with _progress_bar(show) as bar:
            result = b.run_batch(paths, ruleset, options, progress=bar)
    except TriageError as exc:
        _usage(str(exc))
    if result.stats.cache_note:
        error(result.stats.cache_note)
    for o in result.outcomes:
        for msg in o.errors:
            error(msg)
    for note in result.notes:
        error(note)
    if not result.outcomes:
        error("no log files found in " + ", ".join(paths))
        sys.exit(EXIT_USAGE)
    table = result.table(per_diagnosis)
    out = sys.stdout
    with quiet_broken_pipe():
        if out_path:
            try:
                b.write_table(table, out_path)
            except (TriageError, OSError) as exc:
                _usage(str(exc) if isinstance(exc, TriageError) else f"{out_path}: {exc}")
        else:
            out.write(b.format_table(table))
            out.write("\n")
        out.write(b.format_summary(result.summary(), result.stats))
        if out_path:
            out.write(f"\ntable: {out_path} ({len(table)} rows)\n")
        if html_path:
            try:
                from nccl_triage.render.html import write_html

                write_html(result, html_path)
            except OSError as exc:
                _usage(f"{html_path}: {exc.strerror or exc}")
            out.write(f"{'' if out_path else chr(10)}report: {html_path}\n")
        out.flush()
    if not result.read_any:
        sys.exit(EXIT_USAGE)
    sys.exit(EXIT_FINDINGS if result.failed else EXIT_CLEAN)


def _usage(msg: str) -> NoReturn:
    error(msg)
    sys.exit(EXIT_USAGE)


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@contextmanager
def _progress_bar(show: bool) -> Iterator[Any]:
    """A callback drawing a bar on stderr (nothing at all when ``show`` is false)."""
    if not show:
        yield None
        return
    state: dict[str, Any] = {"bar": None, "done": 0}

    def update(done: int, total: int) -> None:
        if state["bar"] is None:
            state["bar"] = click.progressbar(
                length=total, label="triage", file=sys.stderr, show_pos=True, show_eta=True
            ).__enter__()
        state["bar"].update(done - state["done"])
        state["done"] = done

    try:
        yield update
    finally:
        if state["bar"] is not None:
            state["bar"].__exit__(None, None, None)
