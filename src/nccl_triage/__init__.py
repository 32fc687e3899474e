"""nccl-triage: find the root cause behind a PyTorch NCCL watchdog timeout in torchrun logs.

The library API, for notebooks and scripts (the command line is built on the same calls)::

    import nccl_triage

    report = nccl_triage.triage("job.log")                # a path, compressed or not
    report = nccl_triage.triage(["rank0.log", "rank1.log"])  # one job of per-rank files
    report = nccl_triage.triage(open("job.log").read())    # the text of a log
    report.verdict, report.findings[0].rule.cause, report.findings[0].evidence
    report = nccl_triage.triage("job.log", dumps="/tmp/dumps/")  # with flight-recorder dumps
    report.facts.fr_culprit_ranks, report.facts.fr_side, report.facts.fr_frame

    rules = nccl_triage.load_ruleset(["team_rules/"])      # built-ins plus a team's rules
    table = nccl_triage.triage_batch(["/archive/jobs"], rules=rules)  # a DataFrame, a row a job

Everything is imported when first used, so ``import nccl_triage`` costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from nccl_triage.model import Report
    from nccl_triage.ruleset import Ruleset

__version__ = "0.1.0"
__all__ = ["Report", "Ruleset", "__version__", "load_ruleset", "triage", "triage_batch"]

PathLike = str | os.PathLike[str]


def load_ruleset(
    rule_dirs: Sequence[PathLike] = (),
    *,
    only: Sequence[str] = (),
    disable: Sequence[str] = (),
) -> Ruleset:
    """The built-in rules, ``NCCL_TRIAGE_RULES`` and ``rule_dirs``, validated.

    Raises:
        RuleError: a rule or signal file is invalid (every problem, as ``file:line: msg``).
    """
    from nccl_triage.ruleset import load_ruleset as load

    return load([os.fspath(d) for d in rule_dirs], only=tuple(only), disable=tuple(disable))


def triage(
    source: PathLike | Sequence[PathLike],
    *,
    rules: Ruleset | Sequence[PathLike] | None = None,
    dumps: PathLike | Sequence[PathLike] | None = None,
) -> Report:
    """Triage a log: a path (``-`` for stdin), the text of a log, or a job's per-rank files.

    A string holding a newline is taken as the log's text. ``rules`` is a ruleset, or rule
    directories added to the built-ins. ``dumps`` are the job's PyTorch flight-recorder dumps
    (a directory of per-rank dumps, a glob, files, or a list of them), as ``triage --fr``
    reads them: their facts (``fr_*``) join the log's, ``report.flight_recorder`` holds their
    analysis, and a dump that cannot be read is a line of ``report.flight_recorder.problems``.

    Raises:
        InputError: the input cannot be read.
        RuleError: a rule directory holds an invalid file.
    """
    from nccl_triage.pipeline import triage_job, triage_path, triage_text

    ruleset = _ruleset(rules)
    fr = _dump_sources(dumps)
    if isinstance(source, str) and "\n" in source:
        return triage_text(source, ruleset, dumps=fr)
    if isinstance(source, str | os.PathLike):
        return triage_path(os.fspath(source), ruleset, dumps=fr)
    return triage_job([os.fspath(p) for p in source], ruleset, dumps=fr)


def _dump_sources(dumps: PathLike | Sequence[PathLike] | None) -> list[str] | None:
    if dumps is None:
        return None
    if isinstance(dumps, str | os.PathLike):
        return [os.fspath(dumps)]
    return [os.fspath(d) for d in dumps]


def triage_batch(
    paths: Sequence[PathLike],
    *,
    rules: Ruleset | Sequence[PathLike] | None = None,
    per_diagnosis: bool = False,
    workers: int = 0,
) -> pd.DataFrame:
    """Triage an archive of job logs (files, directories, globs) into a table, one row a job.

    The columns are those of ``nccl-triage batch --out`` (``per_diagnosis``: one row a
    diagnosis). No result cache is used; the command line's ``batch`` has one. (Not called
    ``batch``: that name is the subpackage :mod:`nccl_triage.batch`.)
    """
    from nccl_triage.batch import BatchOptions, run_batch

    result = run_batch(
        [os.fspath(p) for p in paths], _ruleset(rules), BatchOptions(workers=workers)
    )
    return result.table(per_diagnosis)


def _ruleset(rules: Ruleset | Sequence[PathLike] | None) -> Ruleset:
    from nccl_triage.ruleset import Ruleset

    if isinstance(rules, Ruleset):
        return rules
    return load_ruleset(rules or ())


def __getattr__(name: str) -> object:
    """``nccl_triage.Report`` and ``nccl_triage.Ruleset``, imported when first used."""
    if name == "Report":
        from nccl_triage.model import Report

        return Report
    if name == "Ruleset":
        from nccl_triage.ruleset import Ruleset

        return Ruleset
    raise AttributeError(f"module 'nccl_triage' has no attribute {name!r}")
