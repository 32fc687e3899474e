"""A job's flight-recorder dumps as triage uses them: read once, analysed once, summarised.

Input: the dump sources of one job (directories, globs and files: ``triage --fr``, the dumps
``batch`` finds beside a job's logs, a rule example's ``dumps:``). Output: a
:class:`FlightRecorder`: the analysis (None when no dump could be read), one line per dump
that could not be read, the facts the job's facts gain, a few lines for people and the JSON
object of the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nccl_triage.flightrec.analysis import analyse
from nccl_triage.flightrec.reader import load_dumps
from nccl_triage.flightrec.result import Culprit, FindingKind, FrAnalysis, sizes_text
from nccl_triage.model.ranks import format_ranks

_SHOWN_CULPRITS = 4  # culprits given a line each in a report; the rest are counted


@dataclass(frozen=True, slots=True)
class FlightRecorder:
    """What a job's dumps say, with what could not be read."""

    sources: tuple[str, ...]  # as given: directories, globs, files
    problems: tuple[str, ...]  # one line per dump (or source) that could not be used
    analysis: FrAnalysis | None  # None when no dump could be read

    @property
    def hung(self) -> bool:
        """True when the dumps show a stuck or mismatched process group."""
        return self.analysis is not None and self.analysis.hung

    def facts(self) -> dict[str, Any]:
        """The ``fr_*`` job facts (:meth:`FrAnalysis.facts`); empty when nothing was read."""
        return self.analysis.facts() if self.analysis is not None else {}

    def to_dict(self) -> dict[str, Any]:
        """The report's ``flight_recorder`` object: sources, problems and the analysis."""
        out: dict[str, Any] = {
            "sources": list(self.sources),
            "problems": list(self.problems),
            "read": self.analysis is not None,
        }
        if self.analysis is not None:
            out.update(self.analysis.to_dict())
        return out

    def summary_lines(self) -> list[str]:
        """A few lines for a report: which ranks never reached which collective, side, frame."""
        a = self.analysis
        if a is None:
            return ["flight recorder: no dump could be read; the diagnosis rests on the log alone"]
        head = f"flight recorder: {len(a.dump_ranks)} dump(s), ranks {format_ranks(a.dump_ranks)}"
        if a.ranks_without_dump:
            head += f"; none from {format_ranks(a.ranks_without_dump)}"
        if not a.hung:
            return [f"{head}; no process group is stuck"]
        if not a.culprits:
            stuck = a.stuck
            what = f"process group {stuck.label}: {stuck.summary}" if stuck else "stuck"
            return [f"{head}; {what}; the dumps cannot tell which rank is at fault"]
        side = f", {a.side} side" if a.side else ""
        lines = [f"{head}; culprit rank(s) {format_ranks(a.culprit_ranks)}{side}"]
        for culprit in a.culprits[:_SHOWN_CULPRITS]:
            lines.append(f"  rank {culprit.rank}: {_what(culprit, a)}")
            if culprit.user_frame is not None:
                lines.append(f"    last user frame: {culprit.user_frame}")
        if len(a.culprits) > _SHOWN_CULPRITS:
            lines.append(f"  ... {len(a.culprits) - _SHOWN_CULPRITS} more culprit(s)")
        return lines


def _what(culprit: Culprit, analysis: FrAnalysis) -> str:
    """One culprit in a few words: its side, and the collective it never reached or finished."""
    side = f"[{culprit.side}] " if culprit.side else ""
    own = (g for g in analysis.groups if g.root and culprit.rank in g.suspects)
    stuck = next((g for g in own if g.kind is culprit.kind), None)
    if stuck is None or culprit.kind is FindingKind.MISMATCH:
        return side + culprit.reason
    reached = [s.rank for s in stuck.ranks if s.role == "ok"]
    what = f"{stuck.op} #{stuck.seq} {sizes_text(stuck.input_sizes)} of process group {stuck.label}"
    if culprit.kind is FindingKind.MISSING:
        text = f"never reached {what}"
        if reached:
            text += f", where rank(s) {format_ranks(reached)} wait"
        return side + text
    return side + culprit.reason


def read_flight_recorder(sources: Sequence[str]) -> FlightRecorder:
    """Read and analyse one job's dumps; a bad dump costs only itself.

    Args:
        sources: directories (their files whose names end in a rank number), globs and files.

    Returns:
        The analysis of every dump that could be read, and one line per problem.
    """
    load = load_dumps(sources)
    problems = list(load.problems)
    if not load.dumps:
        problems.append(
            f"{', '.join(sources) or 'no source'}: no flight-recorder dump could be read"
        )
        return FlightRecorder(tuple(sources), tuple(problems), None)
    analysis = analyse(load.dumps, load.unreadable_ranks)
    return FlightRecorder(tuple(sources), tuple(problems), analysis)
