"""The batch report as one self-contained HTML page.

Input: a :class:`~nccl_triage.batch.run.BatchResult`. Output: HTML with inline SVG charts, a
sortable table and every diagnosis, rendered by jinja2's sandbox with autoescaping on: every
string in it comes from untrusted logs.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from nccl_triage import __version__
from nccl_triage.batch.inputs import SEVERITY_ORDER, JobResult
from nccl_triage.batch.run import BatchResult
from nccl_triage.batch.table import (
    Summary,
    Timeline,
    failures_over_time,
    format_cell,
    is_missing,
    look_first_key,
)

# ----------------------------------------------------------------------------- html

CAUSE_COLORS = {
    "slow_checkpoint_save": "#4e79a7",
    "oom_hidden": "#e15759",
    "generate_zero3": "#f28e2b",
    "network_interface_misconfig": "#76b7b2",
    "network_fabric_failure": "#59a14f",
    "rank_desync_or_mismatched_collective": "#edc948",
    "straggler_or_slow_rank": "#b07aa1",
    "hardware_gpu_fault": "#9c755f",
    "version_or_driver_incompatibility": "#ff9da7",
    "timeout_too_short": "#8cd17d",
    "unknown": "#bab0ac",
}
_OTHER_COLOR = "#79706e"


def render_html(result: BatchResult, max_details: int = 1000) -> str:
    """A self-contained HTML page: charts as inline SVG, a sortable table, every diagnosis.

    Rendered by jinja2's sandbox with autoescaping: log lines are untrusted text. The page
    loads nothing (its Content-Security-Policy forbids it) and works from a file.
    """
    from importlib import resources

    import jinja2
    from jinja2.sandbox import SandboxedEnvironment

    summary = result.summary()
    df = result.table()
    env = SandboxedEnvironment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["advice"] = _advice_html
    text = resources.files("nccl_triage.render").joinpath("batch.html.j2").read_text("utf-8")
    rows = []
    for i, (o, rec) in enumerate(zip(result.outcomes, df.to_dict("records"), strict=True)):
        rows.append(
            {
                "id": f"job-{i}",
                "job": o.job.name,
                "verdict": o.verdict or "unreadable",
                "cause": _text(rec["cause"]),
                "color": CAUSE_COLORS.get(_text(rec["cause"]), _OTHER_COLOR),
                "rule": _text(rec["rule"]),
                "severity": _text(rec["severity"]),
                "severity_order": SEVERITY_ORDER.get(_text(rec["severity"]), -1),
                "confidence": _num(rec["confidence"]),
                "op_type": _text(rec["op_type"]),
                "seq": _num(rec["seq"]),
                "timeout": format_cell("timeout_ms", rec["timeout_ms"], 40),
                "timeout_ms": _num(rec["timeout_ms"]),
                "ranks_timed_out": _text(rec["ranks_timed_out"]),
                "culprit": _num(rec["culprit_rank"]),
                "hosts": _text(rec["hosts"]),
                "first_time": "" if is_missing(rec["first_time"]) else str(rec["first_time"])[:19],
                "lines": _num(rec["lines"]),
                "error": _text(rec["error"]),
                "detailed": False,
            }
        )
    order = sorted(
        (i for i, o in enumerate(result.outcomes) if o.verdict != "clean"),
        key=lambda i: look_first_key(result.outcomes[i]),
    )
    details = []
    for i in order[:max_details]:
        o = result.outcomes[i]
        rows[i]["detailed"] = True
        names = [f.name for f in o.job.files]
        diagnoses = []
        for d in o.diagnoses:
            evidence = [
                {
                    "where": f"{names[fi] if 0 <= fi < len(names) else o.job.name}:{line}",
                    "rank": "" if rank is None else f"rank {rank}",
                    "text": text_,
                }
                for fi, line, rank, text_ in d["evidence"]
            ]
            refs = [
                {"url": u, "link": u.startswith(("https://", "http://"))}
                for u in d.get("references", [])
            ]
            diagnoses.append(
                {
                    **d,
                    "evidence": evidence,
                    "references": refs,
                    "color": CAUSE_COLORS.get(d["cause"], _OTHER_COLOR),
                }
            )
        details.append(
            {
                "row": rows[i],
                "diagnoses": diagnoses,
                "errors": o.errors,
                "facts": _facts_line(o.result),
            }
        )
    return env.from_string(text).render(
        title="nccl-triage batch report",
        generated=datetime.now().strftime("%Y-%m-%d %H:%M"),
        version=__version__,
        ruleset=result.ruleset_version,
        summary=summary,
        stats=result.stats,
        causes_chart=_causes_chart(summary),
        time_chart=_time_chart(failures_over_time(result.outcomes, df)),
        rows=rows,
        details=details,
        hidden_details=max(0, len(order) - max_details),
        anchors={r["job"]: r["id"] for r in rows if r["detailed"]},
        colors=CAUSE_COLORS,
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _num(value: Any) -> float | int | None:
    if value is None or is_missing(value):
        return None
    f = float(value)
    return int(f) if f.is_integer() else round(f, 4)


def _facts_line(r: JobResult) -> str:
    parts = []
    if r.get("op_type"):
        parts.append(
            f"{r['op_type']}" + (f" SeqNum {r['seq']}" if r.get("seq") is not None else "")
        )
    if r.get("ranks_timed_out"):
        parts.append("ranks timed out: " + ",".join(str(x) for x in r["ranks_timed_out"]))
    if r.get("culprit_rank") is not None:
        parts.append(
            f"culprit rank {r['culprit_rank']}"
            + (f" on {r['culprit_host']}" if r.get("culprit_host") else "")
        )
    fr = r.get("flight_recorder")
    if fr and fr.get("culprit_ranks"):
        ranks = ",".join(str(x) for x in fr["culprit_ranks"])
        side = f" ({fr['side']} side)" if fr.get("side") else ""
        frame = f", last in {fr['frame']}" if fr.get("frame") else ""
        parts.append(f"flight recorder: rank(s) {ranks}{side}{frame}")
    if r.get("hosts"):
        parts.append("hosts: " + ", ".join(r["hosts"]))
    if r.get("lines") is not None:
        parts.append(f"{r['lines']} lines")
    return "; ".join(parts)


_CODE_SPAN = re.compile(r"`([^`]+)`")


def _advice_html(text: str) -> Any:
    """Advice (Markdown from the rule's template) as HTML: paragraphs, lists, code spans.

    Every piece is escaped before any tag is added, so nothing in the text becomes markup.
    """
    from markupsafe import Markup, escape

    def inline(s: str) -> str:
        return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", str(escape(s)))

    html: list[str] = []
    in_list = False
    para: list[str] = []

    def flush() -> None:
        if para:
            html.append("<p>" + inline(" ".join(para)) + "</p>")
            para.clear()

    for line in str(text).splitlines():
        stripped = line.strip()
        if stripped.startswith(("- ", "* ")):
            flush()
            if not in_list:
                html.append("<ul>")
                in_list = True
            html.append("<li>" + inline(stripped[2:]) + "</li>")
            continue
        if in_list and stripped and line.startswith("  "):
            html[-1] = html[-1][: -len("</li>")] + " " + inline(stripped) + "</li>"
            continue
        if in_list:
            html.append("</ul>")
            in_list = False
        if stripped:
            para.append(stripped)
        else:
            flush()
    flush()
    if in_list:
        html.append("</ul>")
    return Markup("\n".join(html))  # built from escaped pieces only


def _causes_chart(s: Summary) -> dict[str, Any]:
    bar_h, gap, label_w, bar_w = 22, 6, 300, 420
    bars = []
    most = max((n for _, n, _ in s.causes), default=1)
    for i, (cause, n, share) in enumerate(s.causes):
        bars.append(
            {
                "label": cause,
                "y": i * (bar_h + gap),
                "w": max(2.0, bar_w * n / most),
                "n": n,
                "share": f"{share:.1%}",
                "color": CAUSE_COLORS.get(cause, _OTHER_COLOR),
            }
        )
    height = max(1, len(bars)) * (bar_h + gap)
    return {
        "bars": bars,
        "bar_h": bar_h,
        "label_w": label_w,
        "width": label_w + bar_w + 110,
        "height": height,
    }


def _time_chart(timeline: Timeline) -> dict[str, Any]:
    """Failed jobs per day (or week, or month), stacked by cause, as SVG geometry."""
    if not timeline.periods:
        return {"bars": [], "basis": timeline.basis, "undated": timeline.undated}
    counts = timeline.counts
    label, basis, undated = timeline.unit, timeline.basis, timeline.undated
    plot_w, plot_h, left, top = 760, 180, 40, 10
    n = len(counts)
    step = plot_w / n
    peak = max((sum(row.values()) for row in counts), default=0) or 1
    bars = []
    for i, (period, row) in enumerate(zip(timeline.periods, counts, strict=True)):
        y = float(top + plot_h)
        for cause, k in row.items():
            if not k:
                continue
            h = plot_h * int(k) / peak
            y -= h
            bars.append(
                {
                    "x": left + i * step + step * 0.1,
                    "y": y,
                    "w": max(1.0, step * 0.8),
                    "h": h,
                    "color": CAUSE_COLORS.get(str(cause), _OTHER_COLOR),
                    "title": f"{period}: {k} × {cause}",
                }
            )
    ticks = sorted({0, n // 2, n - 1})
    labels = [
        {
            "x": left + i * step + step / 2,
            "text": timeline.periods[i],
            "anchor": "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle",
        }
        for i in ticks
    ]
    return {
        "bars": bars,
        "labels": labels,
        "peak": peak,
        "unit": label,
        "width": left + plot_w + 10,
        "height": top + plot_h + 30,
        "base": top + plot_h,
        "left": left,
        "top": top,
        "basis": basis,
        "undated": undated,
        "grid": [
            {"y": top + plot_h * (1 - v / peak), "v": v} for v in sorted({peak // 2, peak} - {0})
        ],
    }


def write_html(result: BatchResult, path: str, max_details: int = 1000) -> None:
    """Render the report and write it to ``path``."""
    Path(path).write_text(render_html(result, max_details), encoding="utf-8")
