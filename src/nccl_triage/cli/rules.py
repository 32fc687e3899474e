"""``nccl-triage rules``: list, show, lint, test and scaffold diagnosis rules; print their schema.

Input: argv and rule directories. Output: text on stdout/stderr and an exit status: 0 when all
is well, 1 when lint found a problem or an example failed, 2 for a usage error or rule files
that do not load. The work is done by :mod:`nccl_triage.authoring`; this module only formats.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from nccl_triage.cli.common import EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, error, quiet_broken_pipe
from nccl_triage.errors import TriageError
from nccl_triage.ruleset import CAUSES, SHAPES, Ruleset

_DIRS = click.argument("dirs", nargs=-1, type=click.Path(file_okay=False), metavar="[DIR]...")
_RULES = click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A directory of team rules (repeatable); a rule with a built-in's id replaces it.",
)


@click.group()
def rules() -> None:
    """Write, check and test diagnosis rules (see CONTRIBUTING.md, "Writing a rule").

    Rules come from the built-ins, NCCL_TRIAGE_RULES (a path list) and the directories given.
    """


@rules.command("list")
@_RULES
@click.option("--only", multiple=True, metavar="ID", help="List only these rules.")
@click.option("--disable", multiple=True, metavar="ID", help="Leave these rules out.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md"]),
    default="table",
    show_default=True,
    help="table for a terminal, md for the rule reference (docs/rules.md).",
)
def list_rules(
    rule_dirs: tuple[str, ...], only: tuple[str, ...], disable: tuple[str, ...], fmt: str
) -> None:
    """List the rules: id, cause, severity, title and source file."""
    from nccl_triage.authoring import rule_rows, rules_markdown
    from nccl_triage.ruleset import load_ruleset

    ruleset = _load(lambda: load_ruleset(rule_dirs, only=only, disable=disable))
    with quiet_broken_pipe():
        if fmt == "md":
            click.echo(rules_markdown(ruleset), nl=False)
            return
        rows = [("id", "cause", "severity", "title", "source"), *rule_rows(ruleset.rules)]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for row in rows:
            cells = [f"{c:<{w}}" for c, w in zip(row, widths, strict=False)]
            click.echo("  ".join([*cells, row[4]]))


@rules.command()
@click.argument("rule_id", metavar="ID")
@_RULES
def show(rule_id: str, rule_dirs: tuple[str, ...]) -> None:
    """Print rule ID's file, and its advice rendered on its first matching example."""
    from nccl_triage.authoring import display_path
    from nccl_triage.authoring import show as show_rule
    from nccl_triage.ruleset import load_ruleset

    ruleset = _load(lambda: load_ruleset(rule_dirs))
    try:
        shown = show_rule(ruleset, rule_id)
    except TriageError as exc:
        error(str(exc))
        sys.exit(EXIT_USAGE)
    with quiet_broken_pipe():
        click.echo(f"# {display_path(shown.rule.source.source)}")
        click.echo(shown.text.rstrip("\n"))
        click.echo("")
        if shown.example is None:
            click.echo(f"# advice: {shown.note}")
        elif shown.advice is None:
            click.echo(f"# advice on example '{shown.example}': {shown.note}")
        else:
            click.echo(f"# advice, rendered on example '{shown.example}'")
            click.echo(shown.advice.rstrip("\n"))


@rules.command()
@_DIRS
def lint(dirs: tuple[str, ...]) -> None:
    """Check rule directories (default: the built-ins and NCCL_TRIAGE_RULES).

    Every problem of every file is printed as file:line: message: unknown or missing keys,
    duplicate keys, causes outside docs/causes.md, ids unique and equal to file names, patterns
    RE2 cannot compile, templates that do not render on a matching example, examples of both
    kinds, a reference URL. Exit 1 if there is any.
    """
    from nccl_triage.authoring import lint as lint_dirs

    result = lint_dirs(dirs)
    for notice in result.notices:
        error(notice)
    with quiet_broken_pipe():
        for problem in result.problems:
            click.echo(problem)
        what = (
            f"{_plural(result.rules, 'rule')}, {_plural(result.signals, 'signal')} "
            f"in {_plural(result.files, 'file')}"
        )
        if result.problems:
            click.echo(f"rules lint: {_plural(len(result.problems), 'problem')} ({what})")
        else:
            click.echo(f"rules lint: no problems ({what})")
    sys.exit(EXIT_FINDINGS if result.problems else EXIT_CLEAN)


@rules.command()
@_DIRS
@click.option("--only", multiple=True, metavar="ID", help="Run only these rules' examples.")
@click.option("--disable", multiple=True, metavar="ID", help="Skip these rules' examples.")
@click.option(
    "--corpus",
    type=click.Path(exists=True, file_okay=False),
    help="Also triage every log of this folder: with a manifest.yaml of labels beside the "
    "logs, print accuracy, per-cause precision and recall, confusions and misses; without "
    "one, where each rule fires.",
)
@click.option("-v", "--verbose", is_flag=True, help="List every example, not only failures.")
def test(
    dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    corpus: str | None,
    verbose: bool,
) -> None:
    """Run the examples of the rules in DIR (default: every rule) and say what fired.

    Each example must make its rule fire (expect: match) or not (expect: no-match); the
    whole ruleset runs, as in real use. Prints each failure, then "N passed, M failed".
    """
    from nccl_triage.authoring import corpus_hits, display_path, run_tests
    from nccl_triage.authoring.evaluate import evaluate_corpus, has_manifest

    run = run_tests(dirs, only, disable)
    for notice in run.notices:
        error(notice)
    if run.problems:
        for problem in run.problems:
            error(problem)
        error("no example was run: fix these first (nccl-triage rules lint shows them all)")
        sys.exit(EXIT_USAGE)
    with quiet_broken_pipe():
        for r in run.results:
            if r.passed:
                if verbose:
                    click.echo(f"ok    {r.id}")
                continue
            want = r.example.expect == "match"
            click.echo(f"FAIL  {r.id}  ({r.example.source})")
            click.echo(f"      expected: {r.rule.id} {'fires' if want else 'stays silent'}")
            click.echo(f"      fired:    {', '.join(r.fired) or 'nothing'}")
            if r.reason:
                click.echo(f"      {r.rule.id}: {r.reason}")
        for lr in run.line_results:
            if lr.passed:
                if verbose:
                    click.echo(f"ok    {lr.id}")
                continue
            click.echo(f"FAIL  {lr.id}  ({lr.example.source})")
            click.echo(f"      {lr.message}")
        if corpus is not None and run.selection is not None and has_manifest(corpus):
            # labelled logs: accuracy, precision and recall per cause, confusions, misses
            try:
                click.echo(evaluate_corpus(corpus, run.selection.ruleset).format(), nl=False)
            except TriageError as exc:
                error(str(exc))
                sys.exit(EXIT_USAGE)
        elif corpus is not None and run.selection is not None:
            try:
                found = corpus_hits(run.selection.ruleset, run.selection.rules, corpus)
            except TriageError as exc:
                error(str(exc))
                sys.exit(EXIT_USAGE)
            for err in found.errors:
                error(err)
            click.echo(f"corpus {corpus}: {len(found.logs)} logs")
            for rule_id, hits in found.hits.items():
                click.echo(f"  {rule_id}: fires on {len(hits)} of {len(found.logs)}")
                for log, line, top in hits:
                    first = "" if top == rule_id else f"  (first diagnosis: {top})"
                    click.echo(f"    {display_path(log)}:{line}{first}")
        click.echo(f"{run.passed} passed, {run.failed} failed")
    sys.exit(EXIT_FINDINGS if run.failed else EXIT_CLEAN)


@rules.command()
@click.argument("rule_id", metavar="ID")
@click.option(
    "--cause",
    required=True,
    type=click.Choice(CAUSES),
    help="The root cause the rule diagnoses (docs/causes.md).",
)
@click.option(
    "--dir",
    "directory",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="The rules directory to write to (created if needed).",
)
@click.option(
    "--severity",
    type=click.Choice(SHAPES["rule"].key("severity").values),
    default="high",
    show_default=True,
)
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def new(rule_id: str, cause: str, directory: str, severity: str, force: bool) -> None:
    """Write a new rule ID: its file, a signal, an advice template and examples that pass.

    Fill in each TODO (rules lint lists them), then run rules lint and rules test on DIR.
    """
    from nccl_triage.authoring import scaffold

    try:
        made = scaffold(rule_id, cause, directory, severity=severity, force=force)
    except TriageError as exc:
        error(str(exc))
        sys.exit(EXIT_USAGE)
    for notice in made.notices:
        error(notice)
    for path in made.paths:
        click.echo(f"wrote {path}")
    d = Path(directory)
    click.echo(
        f"next: fill in each TODO, then: nccl-triage rules lint {d} && nccl-triage rules test {d}"
    )


@rules.command()
def schema() -> None:
    """Print the JSON Schema of rule and signal files (docs/rule-schema.json).

    Generated from the loader's own definitions: nccl-triage rules schema > docs/rule-schema.json
    """
    from nccl_triage.authoring import schema_json

    click.echo(schema_json(), nl=False)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _load(load: Callable[[], Ruleset]) -> Ruleset:
    """Load a ruleset, or print every problem of every file and exit 2."""
    try:
        ruleset = load()
    except TriageError as exc:
        for line in str(exc).splitlines():
            error(line)
        sys.exit(EXIT_USAGE)
    for notice in ruleset.notices:
        error(notice)
    return ruleset
