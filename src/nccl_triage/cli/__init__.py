"""Command line: options in, the library's results out, and the exit code.

Input: argv. Output: text on stdout/stderr and an exit status (0 clean, 1 failure found,
2 usage error or no input readable, as ``spec/json-output.md`` says). Only this module
imports click; it chains the library's stages and formats what they return.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

import click

from nccl_triage import __version__
from nccl_triage.errors import TriageError
from nccl_triage.model import Event, Kind

if TYPE_CHECKING:  # the grammar (lark) is imported only by the commands that parse
    from nccl_triage.model import Report

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def rule_source_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--rules DIR`` (repeatable), ``--only ID`` and ``--disable ID`` to a command."""
    options = (
        click.option(
            "--rules",
            "rule_dirs",
            multiple=True,
            type=click.Path(file_okay=False),
            help="A directory of team rules (repeatable); a rule with a built-in's id replaces it.",
        ),
        click.option("--only", multiple=True, metavar="ID", help="Evaluate only these rules."),
        click.option("--disable", multiple=True, metavar="ID", help="Do not evaluate these rules."),
    )
    for option in reversed(options):
        func = option(func)
    return func


# Commands that live in their own modules, imported only when used (so that piping into
# ``watch`` never pays for pandas, and ``--help`` stays fast).
_LAZY_COMMANDS = {
    "watch": "nccl_triage.cli.live:watch",
    "run": "nccl_triage.cli.live:run",
    "batch": "nccl_triage.cli.batch:batch",
    "rules": "nccl_triage.cli.rules:rules",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n, target in _LAZY_COMMANDS.items() if _module_exists(target))
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        target = _LAZY_COMMANDS.get(cmd_name)
        if cmd is not None or target is None or not _module_exists(target):
            return cmd
        module_name, attr = target.split(":")
        loaded = getattr(importlib.import_module(module_name), attr)
        return loaded if isinstance(loaded, click.Command) else None


def _module_exists(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nccl-triage")
def main() -> None:
    """Find why a PyTorch distributed job died with an NCCL watchdog timeout."""


@main.command()
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
    out = sys.stdout
    read_any = False
    unreadable = False
    failed = False
    with _quiet_broken_pipe():
        for path in logs:
            try:
                from nccl_triage.pipeline import parse_path

                result = parse_path(path)
            except TriageError as exc:
                _error(str(exc))
                unreadable = True
                continue
            read_any = True
            failed = failed or any(_is_failure(e) for e in result.events)
            if unparsed:
                _print_unparsed(result, out)
            elif fmt == "jsonl":
                _print_jsonl(result, out)
            else:
                _print_table(result, out, many=len(logs) > 1)
    sys.exit(exit_status(read_any, unreadable, failed))


@main.command()
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="text for a terminal, markdown to paste into an issue, json (one object per input).",
)
@rule_source_options
@click.option(
    "--explain",
    is_flag=True,
    help="Show which rules were considered and why each did or did not fire.",
)
@click.option(
    "--color/--no-color",
    default=None,
    help="Colour the text output (default: on a terminal, unless NO_COLOR is set).",
)
def triage(
    logs: tuple[str, ...],
    fmt: str,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    explain: bool,
    color: bool | None,
) -> None:
    """Name the most likely cause of the NCCL failure in each LOG, with evidence and advice."""
    from nccl_triage.pipeline import triage_path
    from nccl_triage.render.report import render_json_line, render_markdown, render_text
    from nccl_triage.ruleset import load_ruleset

    try:
        ruleset = load_ruleset(rule_dirs, only=only, disable=disable)
    except TriageError as exc:
        for line in str(exc).splitlines():
            _error(line)
        sys.exit(EXIT_USAGE)
    for notice in ruleset.notices:
        _error(notice)
    out = sys.stdout
    if color is None:
        color = out.isatty() and not os.environ.get("NO_COLOR")
    read_any = False
    unreadable = False
    failed = False
    with _quiet_broken_pipe():
        for path in logs:
            try:
                report = triage_path(path, ruleset)
                if fmt == "json":
                    text = render_json_line(report, ruleset.template_dirs) + "\n"
                elif fmt == "markdown":
                    text = render_markdown(report, ruleset.template_dirs)
                else:
                    text = render_text(report, ruleset.template_dirs, color=color)
            except TriageError as exc:
                _error(str(exc))
                unreadable = True
                continue
            read_any = True
            failed = failed or report.verdict != "clean"
            out.write(text)
            if explain and report.correlation is not None:
                out.write(_explain(report.correlation))
            elif explain:
                out.write("   (clean: no rule evaluated)\n")
            out.flush()
    sys.exit(exit_status(read_any, unreadable, failed))


def _explain(correlation: Any) -> str:
    lines = ["", "rules considered:"]
    for exp in correlation.explanations:
        mark = "fired " if exp.fired else "silent"
        lines.append(f"  {mark} {exp.rule.id:<28} {exp.rule.cause:<38} {exp.reason}")
    return "\n".join(lines) + "\n"


def exit_status(read_any: bool, unreadable: bool, failed: bool) -> int:
    """The exit status of spec/json-output.md for a command over several inputs.

    0 only when every input was read and is clean; 1 when a failure was diagnosed; 2 when no
    input could be read, or when one could not and nothing else was found (an unread input
    is not a clean one).
    """
    if failed:
        return EXIT_FINDINGS
    if not read_any or unreadable:
        return EXIT_USAGE
    return EXIT_CLEAN


def _is_failure(ev: Event) -> bool:
    return ev.kind in _FAILURE_KINDS


_FAILURE_KINDS = frozenset(
    {
        Kind.WATCHDOG_TIMEOUT,
        Kind.NCCL_ERROR,
        Kind.WATCHDOG_EXCEPTION,
        Kind.HEARTBEAT_TIMEOUT,
        Kind.COLLECTIVE_MISMATCH,
        Kind.STORE_TIMEOUT,
        Kind.GLOO_ERROR,
    }
)


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


def _error(msg: str) -> None:
    click.echo(f"nccl-triage: {msg}", err=True)


@contextmanager
def _quiet_broken_pipe() -> Iterator[None]:
    """End quietly when the reader of our output goes away (``| head``)."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_CLEAN)
