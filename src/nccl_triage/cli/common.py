"""What every command shares: exit codes, one-line errors, the rule-source options.

Input: nothing. Output: helpers for the command modules; the exit codes are those of the JSON
contract (``docs/json-output.md``): 0 clean, 1 failure diagnosed, 2 usage error, bad rule file,
no input readable, or an internal error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from nccl_triage.errors import TriageError

if TYPE_CHECKING:
    from nccl_triage.ruleset import Ruleset

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def error(msg: str) -> None:
    """One line on standard error, as every message of the tool."""
    click.echo(f"nccl-triage: {msg}", err=True)


@contextmanager
def quiet_broken_pipe() -> Iterator[None]:
    """End quietly when the reader of our output goes away (``| head``)."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_CLEAN)


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


def load_rules(
    rule_dirs: tuple[str, ...], only: tuple[str, ...], disable: tuple[str, ...]
) -> Ruleset:
    """Load the ruleset, or print every problem of every rule file and exit 2."""
    from nccl_triage.ruleset import load_ruleset

    try:
        ruleset = load_ruleset(rule_dirs, only=only, disable=disable)
    except TriageError as exc:
        for line in str(exc).splitlines():
            error(line)
        sys.exit(EXIT_USAGE)
    for notice in ruleset.notices:
        error(notice)
    check_scan_engine()
    return ruleset


def check_scan_engine() -> None:
    """Exit 2 with one line when ``NCCL_TRIAGE_SCAN`` names no usable engine."""
    from nccl_triage.ingest.engines import check_choice

    try:
        check_choice()
    except TriageError as exc:
        error(str(exc))
        sys.exit(EXIT_USAGE)


def exit_status(read_any: bool, unreadable: bool, failed: bool) -> int:
    """The exit status of docs/json-output.md for a command over several inputs.

    0 only when every input was read and is clean; 1 when a failure was diagnosed; 2 when no
    input could be read, or when one could not and nothing else was found (an unread input
    is not a clean one).
    """
    if failed:
        return EXIT_FINDINGS
    if not read_any or unreadable:
        return EXIT_USAGE
    return EXIT_CLEAN
