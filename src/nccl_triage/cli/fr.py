"""The ``fr`` command: read a job's flight-recorder dumps and name the ranks that hung it.

Input: paths, directories and globs of per-rank dumps, and ``--format``. Output: the analysis
on stdout (text or JSON), one line per unreadable dump on stderr, and the exit status: 0 when
no process group is stuck, 1 when one is (a culprit found), 2 when no dump could be read.
"""

from __future__ import annotations

import click

from nccl_triage.cli.common import EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, error


@click.command("fr")
@click.argument("sources", nargs=-1, required=True, metavar="DIR_OR_GLOB...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: a table per stuck group, then the culprits; json: one object.",
)
@click.pass_context
def fr(ctx: click.Context, sources: tuple[str, ...], fmt: str) -> None:
    """Name the ranks that hung a job, from its PyTorch flight-recorder dumps.

    DIR_OR_GLOB: a folder of per-rank dumps (files whose names end in the rank number, as
    nccl_trace_rank_3 or fr_dump_3.json), a glob, or single files. Pickle and JSON dumps are
    read; pickles may build plain data only. Exit status: 0 nothing stuck, 1 stuck (culprits
    named), 2 no dump could be read.
    """
    from nccl_triage.flightrec.analysis import analyse
    from nccl_triage.flightrec.reader import load_dumps
    from nccl_triage.flightrec.render import render_json, render_text

    load = load_dumps(sources)
    for problem in load.problems:
        error(problem)
    if not load.dumps:
        error("no flight-recorder dump could be read")
        ctx.exit(EXIT_USAGE)
    analysis = analyse(load.dumps, load.unreadable_ranks)
    render = render_json if fmt == "json" else render_text
    click.echo(render(analysis, load.problems), nl=False)
    ctx.exit(EXIT_FINDINGS if analysis.hung else EXIT_CLEAN)
