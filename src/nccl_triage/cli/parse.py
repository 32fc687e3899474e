"""``nccl-triage parse``: the structured events of each input, as a table or JSON Lines.

Input: paths (``-`` for stdin, compressed or not). Output: the events the grammar read (every
timeout with its rank, process group, SeqNum, op, sizes, timeout and elapsed time, and every
other NCCL / torchrun failure message), or with ``--unparsed`` the candidate lines it could not
read: the way to find what the grammar lacks in a corpus.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import click

from nccl_triage.cli.common import check_scan_engine, error, exit_status, quiet_broken_pipe
from nccl_triage.errors import TriageError
from nccl_triage.model import Event, Kind, Report


@click.command()
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "jsonl"]),
    default="table",
    show_default=True,
    help="table for people, jsonl (one event per line) for scripts.",
)
@click.option("--unparsed", is_flag=True, help="List candidate lines the grammar could not read.")
def parse(logs: tuple[str, ...], fmt: str, unparsed: bool) -> None:
    """Print the structured events of each LOG (a path, - for stdin; .gz/.bz2/.xz/.zst too)."""
    from nccl_triage.pipeline import parse_path, settle_collector

    check_scan_engine()
    settle_collector()
    out = sys.stdout
    read_any = False
    unreadable = False
    failed = False
    with quiet_broken_pipe():
        for path in logs:
            try:
                result = parse_path(path)
            except TriageError as exc:
                error(str(exc))
                unreadable = True
                continue
            read_any = True
            failed = failed or result.verdict != "clean"
            if unparsed:
                _print_unparsed(result, out)
            elif fmt == "jsonl":
                _print_jsonl(result, out)
            else:
                _print_table(result, out, many=len(logs) > 1)
    sys.exit(exit_status(read_any, unreadable, failed))


def _print_jsonl(result: Report, out: TextIO) -> None:
    for ev in result.events:
        obj = {"source": result.source, **ev.to_dict()}
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")


def _print_unparsed(result: Report, out: TextIO) -> None:
    out.writelines(f"{result.source}:{item.line}: {item.text}\n" for item in result.unparsed)


_COLUMNS: tuple[tuple[str, str, Callable[[Event], Any]], ...] = (
    ("line", ">", lambda e: e.line),
    ("rank", ">", lambda e: "" if e.rank is None else e.rank),
    ("kind", "<", lambda e: e.kind + ("*" if e.partial else "")),
    ("pg", "<", lambda e: e.pg or ""),
    ("seq", ">", lambda e: "" if e.seq is None else e.seq),
    ("op", "<", lambda e: e.op_type or ""),
    ("numel_in", ">", lambda e: "" if e.numel_in is None else e.numel_in),
    ("numel_out", ">", lambda e: "" if e.numel_out is None else e.numel_out),
    ("timeout_ms", ">", lambda e: "" if e.timeout_ms is None else e.timeout_ms),
    ("ran_for_ms", ">", lambda e: "" if e.ran_for_ms is None else e.ran_for_ms),
    ("what", "<", lambda e: _summary(e)),
)


def _summary(ev: Event) -> str:
    d = ev.detail
    parts: list[str] = []
    if ev.form and ev.kind != Kind.WATCHDOG_TIMEOUT:
        parts.append(ev.form)
    for key in (
        "exit_code",
        "signal",
        "nccl_code",
        "errstr",
        "last_error",
        "nccl_version",
        "interfaces",
        "nranks",
        "from_rank",
        "reason",
        "message",
        "cuda_error",
        "exception_type",
        "error",
    ):
        value = d.get(key)
        if value is not None and value != "":
            parts.append(f"{key}={value}")
    if ev.kind == Kind.WATCHDOG_TIMEOUT:
        parts.insert(0, ev.form or "")
        if ev.last_enqueued is not None:
            parts.append(f"enqueued={ev.last_enqueued} completed={ev.last_completed}")
        if ev.occurrences:
            parts.append(f"+{len(ev.occurrences)} lines")
    if ev.repeats:
        parts.append(f"repeated {ev.repeats}x")
    text = " ".join(parts)
    return text if len(text) <= 100 else text[:97] + "..."


def _print_table(result: Report, out: TextIO, many: bool) -> None:
    if many:
        out.write(f"== {result.source}\n")
    if not result.events:
        out.write(f"no NCCL events in {result.lines} lines\n")
        return
    rows = [[str(fn(ev)) for _, _, fn in _COLUMNS] for ev in result.events]
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, (name, _, _) in enumerate(_COLUMNS)]
    widths[-1] = 0
    line = "  ".join(f"{name:{al}{w}}" for (name, al, _), w in zip(_COLUMNS, widths, strict=True))
    out.write(line.rstrip() + "\n")
    for row in rows:
        cells = [
            f"{cell:{al}{w}}" for cell, (_, al, _), w in zip(row, _COLUMNS, widths, strict=True)
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    timeouts = [e for e in result.events if e.kind == Kind.WATCHDOG_TIMEOUT]
    partial = sum(1 for e in result.events if e.partial)
    note = f"{len(result.events)} events, {len(timeouts)} timeouts in {result.lines} lines"
    if partial:
        note += f" (* = damaged line, {partial} partial)"
    if result.unparsed:
        note += f"; {len(result.unparsed)} candidate lines not understood (--unparsed lists them)"
    out.write(note + "\n")
