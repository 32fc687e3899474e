"""Command line: options in, the library's results out, and the exit code.

Input: argv. Output: text on stdout/stderr and an exit status (0 clean, 1 failure found,
2 usage error, no input readable, or an internal error, as ``docs/json-output.md`` says).
Only this package imports click; each command lives in its own module, imported only when it
runs, so that piping into ``watch`` never pays for pandas and ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from typing import Any

import click

from nccl_triage import __version__
from nccl_triage.cli.common import EXIT_USAGE, error

_COMMANDS = {
    "triage": "nccl_triage.cli.triage:triage",
    "parse": "nccl_triage.cli.parse:parse",
    "watch": "nccl_triage.cli.live:watch",
    "run": "nccl_triage.cli.live:run",
    "batch": "nccl_triage.cli.batch:batch",
    "rules": "nccl_triage.cli.rules:rules",
    "fr": "nccl_triage.cli.fr:fr",
    "docs": "nccl_triage.cli.docs:docs",
}
# The first sentence of each command's help, for the top-level --help without importing every
# command (a test keeps them equal to the commands' own).
_SUMMARIES = {
    "batch": "Triage every job log under PATH... into one table, a summary and an HTML report.",
    "docs": "Print a reference document: causes, json-output, log-formats, rules or rule-schema.",
    "fr": "Name the ranks that hung a job, from its PyTorch flight-recorder dumps.",
    "parse": (
        "Print the structured events of each LOG (a path, - for stdin; .gz/.bz2/.xz/.zst too)."
    ),
    "rules": 'Write, check and test diagnosis rules (see CONTRIBUTING.md, "Writing a rule").',
    "run": "Run CMD, pass its stdout and stderr through, and diagnose it when it ends.",
    "triage": (
        "Name the most likely cause of the NCCL failure in each LOG, with evidence and advice."
    ),
    "watch": "Pass standard input through unchanged and diagnose it as it goes.",
}
DEBUG_ENV = "NCCL_TRIAGE_DEBUG"


class _LazyGroup(click.Group):
    """Commands imported when used; an unexpected exception becomes one line and exit 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n, target in _COMMANDS.items() if _module_exists(target))
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        target = _COMMANDS.get(cmd_name)
        if cmd is not None or target is None or not _module_exists(target):
            return cmd
        module_name, attr = target.split(":")
        loaded = getattr(importlib.import_module(module_name), attr)
        return loaded if isinstance(loaded, click.Command) else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their summaries, as click writes them, without importing them."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            summary = _SUMMARIES.get(name)
            if summary is None:
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(limit)))
            else:
                # shortened as click shortens a command's own help
                rows.append((name, click.Command(name, help=summary).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must not look like "failure found" (1)
            if os.environ.get(DEBUG_ENV):
                traceback.print_exc()
            where = _origin(exc)
            error(
                f"internal error: {type(exc).__name__}: {exc}{where} "
                f"(a bug: run with --debug for the traceback, and report it)"
            )
            sys.exit(EXIT_USAGE)


def _origin(exc: BaseException) -> str:
    """`` at file:line`` of the innermost frame of the package that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "nccl_triage" in f.filename]
    if not ours:
        return ""
    f = ours[-1]
    return f" at {f.filename.rsplit('nccl_triage/', 1)[-1]}:{f.lineno}"


def _module_exists(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


def _debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        os.environ[DEBUG_ENV] = "1"


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="The causes a diagnosis names: nccl-triage docs causes (docs/causes.md). The JSON "
    "report and exit status: nccl-triage docs json-output (docs/json-output.md).",
)
@click.version_option(__version__, prog_name="nccl-triage")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_debug,
    help="On an internal error, print the traceback (also: NCCL_TRIAGE_DEBUG=1).",
)
def main() -> None:
    """Find why a PyTorch distributed job died with an NCCL watchdog timeout."""
