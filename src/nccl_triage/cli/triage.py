"""``nccl-triage triage``: the diagnosis of each input, as text, Markdown or JSON.

Input: paths (``-`` for stdin, compressed or not), the job's flight-recorder dumps (``--fr``)
and the rule sources. Output: per input, the verdict, the causes most likely first with the
lines that prove them, what the dumps say, and the advice; one line on stderr per input or
dump that cannot be read; the exit status of the JSON contract.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from nccl_triage.cli.common import (
    error,
    exit_status,
    load_rules,
    quiet_broken_pipe,
    rule_source_options,
)
from nccl_triage.errors import TriageError


@click.command()
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
@click.option(
    "--fr",
    "fr_sources",
    multiple=True,
    metavar="DIR_OR_GLOB",
    help="The job's PyTorch flight-recorder dumps (repeatable): a folder of per-rank dumps "
    "(names ending in the rank), a glob or files. Their culprit ranks, side and frame join "
    "the diagnosis of each LOG.",
)
@click.option(
    "--max-candidates",
    type=click.IntRange(min=0),
    default=500_000,
    show_default=True,
    help="Read at most this many candidate lines of each LOG (its first ones and its last "
    "fifth); the report says how many it skipped. 0 reads them all.",
)
def triage(
    logs: tuple[str, ...],
    fmt: str,
    rule_dirs: tuple[str, ...],
    only: tuple[str, ...],
    disable: tuple[str, ...],
    explain: bool,
    color: bool | None,
    max_candidates: int,
    fr_sources: tuple[str, ...],
) -> None:
    """Name the most likely cause of the NCCL failure in each LOG, with evidence and advice.

    With --fr, the job's flight-recorder dumps are read once and joined to each LOG: the ranks
    they blame, on the CPU or the GPU side, and the code those ranks were last in.
    """
    from nccl_triage.pipeline import settle_collector, triage_path
    from nccl_triage.render.report import render_json_line, render_markdown, render_text

    ruleset = load_rules(rule_dirs, only, disable)
    dumps = None
    if fr_sources:  # the dumps' reader and analysis are imported only when there are dumps
        from nccl_triage.flightrec.job import read_flight_recorder

        dumps = read_flight_recorder(fr_sources)
    for problem in dumps.problems if dumps is not None else ():
        error(problem)
    settle_collector()
    out = sys.stdout
    if color is None:
        color = out.isatty() and not os.environ.get("NO_COLOR")
    read_any = False
    unreadable = False
    failed = False
    with quiet_broken_pipe():
        for path in logs:
            try:
                report = triage_path(path, ruleset, max_candidates=max_candidates, dumps=dumps)
                if fmt == "json":
                    text = render_json_line(report, ruleset.template_dirs) + "\n"
                elif fmt == "markdown":
                    text = render_markdown(report, ruleset.template_dirs)
                else:
                    text = render_text(report, ruleset.template_dirs, color=color)
            except TriageError as exc:
                error(str(exc))
                unreadable = True
                continue
            read_any = True
            failed = failed or report.verdict != "clean"
            for note in report.notes:
                if "empty input" in note or "binary data" in note:
                    error(f"{report.source}: {note}")
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
        f = exp.finding
        if f is None:
            continue
        lines.append(
            f"         confidence {f.confidence:.2f} = prior {f.prior:.2f} x "
            f"(0.55 + 0.45 x evidence {_strength(f):.2f})"
        )
        for ev, w in zip(f.evidence, f.weights, strict=True):
            lines.append(
                f"         line {ev.line} {ev.kind}: proximity {w.proximity:.2f}, timing "
                f"{w.timing:.2f}, rank {w.rank:.2f}, running {w.running:.2f} -> {w.score:.2f}"
            )
    return "\n".join(lines) + "\n"


def _strength(finding: Any) -> float:
    weights = finding.weights
    return sum(w.score for w in weights) / len(weights) if weights else 1.0
