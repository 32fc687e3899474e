"""The ``watch`` and ``run`` commands: options in, :mod:`nccl_triage.live` does the work.

Input: argv (and standard input for ``watch``, a command line for ``run``). Output: the job's
bytes unchanged on stdout/stderr, diagnoses on stderr or in ``--report FILE``, and an exit
status: ``watch`` as ``triage`` (0 clean, 1 failure, 2 no diagnosis possible), 130 after Ctrl-C;
``run`` the command's own (128+N for a signal N). Loaded lazily by :mod:`nccl_triage.cli`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO, Any

import click

from nccl_triage.cli.common import EXIT_USAGE, error, rule_source_options
from nccl_triage.live.link import AnalyserConfig, start_analyser
from nccl_triage.live.pump import open_archive, run_command, watch_stream


def _report_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--report",
            "report_path",
            type=click.Path(dir_okay=False, writable=True),
            help="Write the diagnoses to FILE (each update appended) instead of stderr.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["text", "markdown", "json"]),
            default="text",
            show_default=True,
            help="Format of the diagnoses; json is one report object per line (JSON Lines).",
        ),
        click.option(
            "--color/--no-color",
            default=None,
            help="Colour the text diagnoses (default: when stderr is a terminal, unless NO_COLOR).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return rule_source_options(func)


def _config(
    source: str,
    report_path: str | None,
    fmt: str,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    color: bool | None,
    command: str | None = None,
) -> AnalyserConfig:
    if report_path:
        try:  # fail now, before the job starts, not when the first diagnosis is due
            with open(report_path, "w", encoding="utf-8"):
                pass
        except OSError as exc:
            error(f"{report_path}: {exc.strerror or exc}")
            sys.exit(EXIT_USAGE)
    if color is None:
        color = not report_path and sys.stderr.isatty() and not os.environ.get("NO_COLOR")
    return AnalyserConfig(
        source=source,
        fmt=fmt,
        report=os.path.abspath(report_path) if report_path else None,
        color=bool(color) and fmt == "text",
        rules=[os.path.abspath(d) for d in rule_dirs],
        only=list(only),
        disable=list(disable),
        command=command,
    )


@click.command()
@_report_options
def watch(
    report_path: str | None,
    fmt: str,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    color: bool | None,
) -> None:
    """Pass standard input through unchanged and diagnose it as it goes.

    \b
        torchrun --nproc-per-node 8 train.py 2>&1 | nccl-triage watch

    Every byte reaches stdout at once, whatever it is. A diagnosis goes to stderr within a
    second of the line that completes it, again when the picture changes, and a final one at
    the end of input. Exit status as `triage`; 130 after Ctrl-C, 143 after SIGTERM.
    """  # noqa: D301 - click's no-rewrap marker is the \b (backspace) character itself
    config = _config("<stdin>", report_path, fmt, rule_dirs, only, disable, color)
    link = start_analyser(config)
    sys.exit(watch_stream(link))


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Archive the command's whole output (stdout and stderr by lines) to FILE; "
    "compressed when it ends in .gz or .zst. Line numbers in the diagnosis are this file's.",
)
@click.option(
    "--buffered",
    is_flag=True,
    help="Leave the command's Python output buffering alone (by default PYTHONUNBUFFERED=1 "
    "is set when it is not, so that prints show at once, as on a terminal).",
)
@_report_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
def run(
    log_path: str | None,
    buffered: bool,
    report_path: str | None,
    fmt: str,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    color: bool | None,
    command: tuple[str, ...],
) -> None:
    """Run CMD, pass its stdout and stderr through, and diagnose it when it ends.

    \b
        nccl-triage run --log job.log.zst -- torchrun --nproc-per-node 8 train.py

    SIGINT and SIGTERM (and SIGHUP, SIGQUIT, SIGUSR1/2) go to the command's process group.
    Diagnoses appear on stderr while it runs (as with `watch`) and once more when it exits.
    The exit status is the command's own: 128+N when signal N ended it.
    """  # noqa: D301 - click's no-rewrap marker is the \b (backspace) character itself
    name = os.path.basename(command[0]) or command[0]
    source = log_path if log_path else f"<{name}>"
    config = _config(source, report_path, fmt, rule_dirs, only, disable, color, command=name)
    log: IO[bytes] | None = None
    if log_path:
        try:
            log = open_archive(log_path)
        except OSError as exc:
            error(f"{log_path}: {exc.strerror or exc}")
            sys.exit(EXIT_USAGE)
    env = None
    if not buffered and "PYTHONUNBUFFERED" not in os.environ:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    link = start_analyser(config)
    sys.exit(run_command(command, link, log, log_path or "", env))
