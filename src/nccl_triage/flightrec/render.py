"""Turn a flight-recorder analysis into text or JSON for people and scripts.

Input: an :class:`~nccl_triage.flightrec.analysis.FrAnalysis` and the reader's problem lines.
Output: strings. Text is a table per stuck process group that the culprits explain (ranks in
the same state folded into one row), one line per group stuck only because its ranks wait
elsewhere, then the culprits with their side, reason, user frame and stack; JSON is one object
(``culprit_ranks``, ``side``, ``stuck``, ``groups``, ``culprits``, ...) as
:meth:`FrAnalysis.to_dict` gives it, with the problems added.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from nccl_triage.flightrec.result import (
    Culprit,
    FrAnalysis,
    GroupFinding,
    RankStatus,
    is_user_frame,
)
from nccl_triage.model.ranks import format_ranks

_STACK_LINES = 12


def render_json(analysis: FrAnalysis, problems: Sequence[str] = ()) -> str:
    """Render the analysis as one JSON object.

    Args:
        analysis: the analysis.
        problems: one line per dump that could not be read.

    Returns:
        Indented JSON text ending with a newline.
    """
    data = analysis.to_dict()
    data["problems"] = list(problems)
    return json.dumps(data, indent=2) + "\n"


def render_text(analysis: FrAnalysis, problems: Sequence[str] = ()) -> str:
    """Render the analysis for a terminal.

    Args:
        analysis: the analysis.
        problems: one line per dump that could not be read (shown as notes at the end).

    Returns:
        Lines of text ending with a newline.
    """
    ranks = format_ranks(analysis.dump_ranks) or "-"
    lines = [f"flight recorder: {len(analysis.dump_ranks)} dump(s), ranks {ranks}"]
    if analysis.ranks_without_dump:
        lines[0] += f"; no dump from {format_ranks(analysis.ranks_without_dump)}"
    if not analysis.hung:
        lines.append("no process group is stuck: every collective enqueued was completed by all")
    for finding in (f for f in analysis.groups if f.root):
        lines.append("")
        lines.extend(_group_lines(finding))
    explained = [f for f in analysis.groups if not f.root]
    if explained:
        lines.append("")
        lines.append("stuck because of the above (their ranks wait on unfinished work elsewhere):")
        lines.extend(f"  process group {f.label}: {f.summary}" for f in explained)
    if analysis.hung:
        lines.append("")
        lines.extend(_culprit_lines(analysis))
    notes = [*analysis.notes, *problems]
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return "\n".join(lines) + "\n"


def _group_lines(finding: GroupFinding) -> list[str]:
    head = (
        f"process group {finding.label}, ranks {format_ranks(finding.members)}: {finding.summary}"
    )
    seq = f"{'p2p ' if finding.p2p else ''}#{finding.seq}"
    rows = [("ranks", "enqueued", "completed", "started", f"at {seq}")]
    keyed = [(_row_key(s), s.rank) for s in finding.ranks]
    for key, run in groupby(keyed, key=lambda item: item[0]):
        ranks = [rank for _, rank in run]
        rows.append((format_ranks(ranks), *key))
    # groupby folds only neighbours; fold equal rows that are apart too.
    folded: dict[tuple[str, ...], list[str]] = {}
    for row in rows[1:]:
        folded.setdefault(row[1:], []).append(row[0])
    table = [rows[0]] + [(",".join(r), *key) for key, r in folded.items()]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    body = [
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        for row in table
    ]
    return [head, *body]


def _row_key(status: RankStatus) -> tuple[str, str, str, str]:
    def number(value: int | None) -> str:
        return "-" if value is None else str(value)

    if status.record is not None:
        r = status.record
        sizes = ",".join(str(list(s)) for s in r.input_sizes) or "[]"
        what = f"{r.op} {sizes} {','.join(sorted(set(r.input_dtypes))) or '-'} {r.state}"
    else:
        what = status.note or "no record"
    if status.role != "ok":
        what = f"{status.role}: {status.note}" if status.note else status.role
        if status.record is not None and status.role == "mismatch":
            what = f"mismatch: {status.note} {status.record.state}"
    return (
        number(status.last_enqueued),
        number(status.last_completed),
        number(status.last_started),
        what,
    )


def _culprit_lines(analysis: FrAnalysis) -> list[str]:
    if not analysis.culprits:
        return ["culprits: none can be named from the dumps alone (see the notes)"]
    side = f" ({analysis.side} side)" if analysis.side else ""
    lines = [f"culprit rank(s): {format_ranks(analysis.culprit_ranks)}{side}"]
    for culprit in analysis.culprits:
        lines.extend(_one_culprit(culprit))
    return lines


def _one_culprit(culprit: Culprit) -> list[str]:
    side = str(culprit.side) if culprit.side else "side unknown"
    lines = [f"  rank {culprit.rank} [{side}]: {culprit.reason}"]
    if culprit.user_frame is not None:
        lines.append(f"    user frame: {culprit.user_frame}")
    elif culprit.record is not None and not culprit.frames:
        lines.append("    user frame: none (the dump has no stack frames; JSON dumps never do)")
    if culprit.frames:
        lines.append("    stack of that record (innermost first):")
        shown = culprit.frames[:_STACK_LINES]
        lines.extend(
            f"      {'>' if is_user_frame(f) else ' '} {f.filename}:{f.line} in {f.name}"
            for f in shown
        )
        if len(culprit.frames) > len(shown):
            lines.append(f"        ... {len(culprit.frames) - len(shown)} more")
    return lines
