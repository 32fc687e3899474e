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
