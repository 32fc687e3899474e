"""Outcomes as a table and a summary.

Input: :class:`~nccl_triage.batch.run.Outcome` objects. Output: a pandas DataFrame (one row per
job, or per diagnosis), written as CSV, Parquet or JSON Lines, and a summary (causes, hosts,
rules, jobs to look at first). Only this module imports pandas, lazily: worker processes
never pay for it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nccl_triage.errors import TriageError

if TYPE_CHECKING:
    import pandas as pd

    from nccl_triage.batch.run import BatchStats, Outcome

from nccl_triage.batch.inputs import SEVERITY_ORDER, optional_module

# ----------------------------------------------------------------------------- table

COLUMNS = (
    "job",  # the job's name: its file, or the common part of its per-rank files' paths
    "inputs",  # the job's files, separated by ";"
    "files",
    "verdict",  # clean | nccl_timeout | nccl_error; empty when no file could be read
    "cause",  # the top diagnosis's cause (docs/causes.md); "none" when clean
    "rule",
    "severity",
    "confidence",
    "diagnoses",  # how many diagnoses the job has
    "op_type",  # the collective that timed out or failed
    "seq",  # its SeqNum
    "timeout_ms",
    "ranks_timed_out",  # "0,1,3"
    "culprit_rank",  # the rank most likely at fault, when the log says
    "culprit_host",
    "hosts",  # every host the job's lines name, "," separated
    "first_time",  # the first dated timestamp in the job's logs
    "lines",
    "fr_dumps",  # flight-recorder dumps read with the job (found beside its logs)
    "fr_culprit_ranks",  # the ranks they blame, "3" or "9,14"
    "fr_side",  # cpu | gpu
    "fr_frame",  # the first culprit's last user frame, "train.py:187 in train_step"
    "error",  # why a file could not be read ("; " separated)
)
_INT_COLUMNS = ("files", "diagnoses", "seq", "timeout_ms", "culprit_rank", "lines", "fr_dumps")


def _row(o: Outcome, d: dict[str, Any] | None) -> dict[str, Any]:
    r = o.result
    fr = r.get("flight_recorder")
    verdict = o.verdict
    if d is not None:
        cause, rule, severity, conf = d["cause"], d["rule"], d["severity"], d["confidence"]
    elif verdict == "clean":
        cause, rule, severity, conf = "none", None, None, None
    elif verdict is not None:
        cause, rule, severity, conf = "unknown", None, None, None
    else:
        cause, rule, severity, conf = None, None, None, None
    return {
        "job": o.job.name,
        "inputs": ";".join(f.name for f in o.job.files),
        "files": len(o.job.files),
        "verdict": verdict,
        "cause": cause,
        "rule": rule,
        "severity": severity,
        "confidence": conf,
        "diagnoses": len(o.diagnoses) if verdict is not None else None,
        "op_type": r.get("op_type"),
        "seq": r.get("seq"),
        "timeout_ms": r.get("timeout_ms"),
        "ranks_timed_out": ",".join(str(x) for x in r.get("ranks_timed_out") or []) or None,
        "culprit_rank": r.get("culprit_rank"),
        "culprit_host": r.get("culprit_host"),
        "hosts": ",".join(r.get("hosts") or []) or None,
        "first_time": r.get("first_time"),
        "lines": r.get("lines"),
        "fr_dumps": fr.get("dumps") if fr else None,
        "fr_culprit_ranks": ",".join(str(x) for x in fr.get("culprit_ranks") or []) or None
        if fr
        else None,
        "fr_side": fr.get("side") if fr else None,
        "fr_frame": fr.get("frame") if fr else None,
        "error": "; ".join(o.errors) or None,
    }


def preload() -> None:
    """Import pandas in a thread of its own, for the table at the end of a run.

    Called once worker processes are forked (a process with the threads numpy starts must not
    fork): the import then overlaps the run instead of following it.
    """
    if "pandas" not in sys.modules:
        threading.Thread(target=_import_pandas, name="nccl-triage-pandas").start()


def _import_pandas() -> None:
    with contextlib.suppress(ImportError):
        import pandas  # noqa: F401 - imported for later


def build_table(outcomes: Sequence[Outcome], per_diagnosis: bool = False) -> pd.DataFrame:
    """The outcomes as a DataFrame: one row per job, or one per diagnosis (``diagnosis`` n)."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for o in outcomes:
        diagnoses = o.diagnoses
        if per_diagnosis and diagnoses:
            for n, d in enumerate(diagnoses, 1):
                rows.append({**_row(o, d), "diagnosis": n})
        else:
            row = _row(o, diagnoses[0] if diagnoses else None)
            if per_diagnosis:
                row["diagnosis"] = 1 if diagnoses else None
            rows.append(row)
    columns = list(COLUMNS)
    if per_diagnosis:
        columns.insert(columns.index("cause"), "diagnosis")
    df = pd.DataFrame.from_records(rows, columns=columns)
    for col in (*_INT_COLUMNS, *(("diagnosis",) if per_diagnosis else ())):
        df[col] = df[col].astype("Int64")
    df["confidence"] = df["confidence"].astype("float64")
    df["first_time"] = pd.to_datetime(df["first_time"], format="ISO8601", errors="coerce")
    for col in columns:
        if col not in (*_INT_COLUMNS, "diagnosis", "confidence", "first_time"):
            df[col] = df[col].astype("string")
    return df


def write_table(df: pd.DataFrame, path: str) -> None:
    """Write the table as CSV, Parquet or JSON Lines, chosen by the file's extension.

    Raises:
        TriageError: an unknown extension, or Parquet without pyarrow.
    """
    lower = path.lower()
    if lower.endswith(".csv"):
        df.to_csv(path, index=False)
    elif lower.endswith((".jsonl", ".ndjson")):
        df.to_json(path, orient="records", lines=True, date_format="iso", force_ascii=False)
    elif lower.endswith(".parquet"):
        if optional_module("pyarrow") is None:
            raise TriageError(
                path, "writing Parquet needs pyarrow: pip install 'nccl-triage[parquet]'"
            )
        df.to_parquet(path, index=False)
    else:
        raise TriageError(path, "unknown table format (use .csv, .parquet or .jsonl)")


def format_table(df: pd.DataFrame, width: int = 48) -> str:
    """The job table as aligned text for a terminal (long cells cut to ``width``)."""
    shown = [
        ("job", "job"),
        ("verdict", "verdict"),
        ("cause", "cause"),
        ("rule", "rule"),
        ("confidence", "conf"),
        ("op_type", "op"),
        ("seq", "seq"),
        ("timeout_ms", "timeout"),
        ("ranks_timed_out", "timed out"),
        ("culprit_rank", "culprit"),
        ("hosts", "hosts"),
        ("first_time", "first time"),
        ("lines", "lines"),
        ("error", "error"),
    ]
    if "diagnosis" in df.columns:
        shown.insert(2, ("diagnosis", "#"))
    cells: list[list[str]] = []
    for rec in df.to_dict("records"):
        row = []
        for col, _ in shown:
            value = rec.get(col)
            row.append(format_cell(col, value, width))
        cells.append(row)
    heads = [h for _, h in shown]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(heads)]
    right = {"confidence", "seq", "timeout_ms", "culprit_rank", "lines", "diagnosis"}
    lines = []
    for row in [heads, *cells]:
        parts = [
            f"{c:>{w}}" if col in right else f"{c:<{w}}"
            for c, w, (col, _) in zip(row, widths, shown, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def format_cell(col: str, value: Any, width: int) -> str:
    """One cell of the text table, at most ``width`` characters."""
    if value is None or (not isinstance(value, str) and is_missing(value)):
        return "-"
    if col == "confidence":
        return f"{float(value):.2f}"
    if col == "timeout_ms":
        from nccl_triage.render.advice import human_ms

        return human_ms(value)
    if col == "first_time":
        return str(value)[:16]
    text = str(value)
    if len(text) <= width:
        return text
    if col == "job":
        return "…" + text[-(width - 1) :]
    return text[: width - 1] + "…"


def is_missing(value: Any) -> bool:
    """Tell whether a table value is missing (None, NaN, NaT)."""
    import pandas as pd

    return bool(pd.isna(value))


# ----------------------------------------------------------------------------- summary


@dataclass
class Summary:
    """The fleet's view: what failed, why, where, and which jobs to look at first."""

    jobs: int
    files: int
    failed: int
    clean: int
    unreadable: int  # jobs none of whose files could be read
    with_errors: int  # jobs with at least one unreadable file
    causes: list[tuple[str, int, float]]  # cause, failed jobs, share of failed jobs
    hosts: list[tuple[str, int, int]]  # host, failed jobs naming it, as culprit host
    rules: list[tuple[str, int]]  # rule, jobs where it is the top diagnosis
    first: list[tuple[str, str, str, float]]  # job, cause, severity, confidence
    with_dumps: int = 0  # jobs whose flight-recorder dumps were read with them


def summarize(
    outcomes: Sequence[Outcome], top: int = 10, table: pd.DataFrame | None = None
) -> Summary:
    """Count causes, hosts and rules over the failed jobs; order the jobs to look at first.

    ``table``: :func:`build_table` of the outcomes (one row per job), when already built.
    """
    import pandas as pd

    df = build_table(outcomes) if table is None else table
    failed = df[df["verdict"].notna() & (df["verdict"] != "clean")]
    counts = failed["cause"].fillna("unknown").value_counts()
    total = int(counts.sum())
    causes = [(str(c), int(n), n / total) for c, n in counts.items()]
    hosts_s = failed["hosts"].dropna().str.split(",").explode()
    culprits = failed["culprit_host"].dropna().value_counts()
    host_counts = hosts_s.value_counts() if len(hosts_s) else pd.Series(dtype="int64")
    hosts = [(str(h), int(n), int(culprits.get(h, 0))) for h, n in host_counts.items()]
    hosts.sort(key=lambda x: (-x[1], -x[2], x[0]))
    rules = [(str(r), int(n)) for r, n in failed["rule"].dropna().value_counts().items()]
    failed_jobs = sorted(
        (o for o in outcomes if o.verdict not in (None, "clean")), key=look_first_key
    )
    first = []
    for o in failed_jobs[:5]:
        d = o.diagnoses[0] if o.diagnoses else {}
        first.append(
            (
                o.job.name,
                str(d.get("cause", "unknown")),
                str(d.get("severity", "-")),
                float(d.get("confidence", 0.0)),
            )
        )
    return Summary(
        jobs=len(df),
        files=int(df["files"].sum()),
        failed=len(failed),
        clean=int((df["verdict"] == "clean").sum()),
        unreadable=int(df["verdict"].isna().sum()),
        with_errors=int(df["error"].notna().sum()),
        causes=causes,
        hosts=hosts[:top],
        rules=rules[:top],
        first=first,
        with_dumps=int(df["fr_dumps"].notna().sum()),
    )


def format_summary(s: Summary, stats: BatchStats | None = None) -> str:
    """The summary as text."""
    out = [
        f"{s.jobs} jobs ({s.files} files): {s.failed} failed, {s.clean} clean, "
        f"{s.unreadable} unreadable"
        + (f"; {s.with_errors} with unreadable files" if s.with_errors > s.unreadable else "")
    ]
    if s.with_dumps:
        out[0] += f"; {s.with_dumps} with flight-recorder dumps"
    if stats is not None:
        engine = stats.engine + (f" x{stats.workers}" if stats.workers > 1 else "")
        out.append(
            f"{stats.triaged} triaged ({engine}), {stats.cached} from cache, "
            f"{stats.seconds:.{2 if stats.seconds < 10 else 1}f} s"
            + (
                f" ({stats.triaged / stats.seconds:.0f} jobs/s)"
                if stats.triaged and stats.seconds
                else ""
            )
        )
    if s.causes:
        out += ["", "causes (failed jobs by top diagnosis)"]
        w = max(len(c) for c, _, _ in s.causes)
        out += [f"  {c:<{w}}  {n:>6}  {share:6.1%}" for c, n, share in s.causes]
    if s.hosts:
        out += ["", "top hosts (failed jobs naming the host, as culprit's host)"]
        w = max(len(h) for h, _, _ in s.hosts)
        out += [f"  {h:<{w}}  {n:>6}  {c:>6}" for h, n, c in s.hosts]
    if s.rules:
        out += ["", "top rules (jobs where the rule is the top diagnosis)"]
        w = max(len(r) for r, _ in s.rules)
        out += [f"  {r:<{w}}  {n:>6}" for r, n in s.rules]
    if s.first:
        out += ["", "look at first (most severe, most confident)"]
        w = max(len(job) for job, _, _, _ in s.first)
        out += [f"  {job:<{w}}  {cause} ({sev}, {conf:.2f})" for job, cause, sev, conf in s.first]
    return "\n".join(out) + "\n"


def look_first_key(o: Outcome) -> tuple[int, float, float, str]:
    """The order to look at failed jobs in: most severe, most confident, most recent first."""
    d = o.diagnoses[0] if o.diagnoses else None
    recent = 0.0
    with contextlib.suppress(KeyError, ValueError, OverflowError):  # None, or "2024-13-45"
        recent = -datetime.fromisoformat(str(o.result["first_time"])).timestamp()
    if d is None:
        return (1, 0.0, recent, o.job.name)
    severity = -SEVERITY_ORDER.get(str(d["severity"]), -1)
    return (severity, -float(d["confidence"]), recent, o.job.name)


@dataclass(frozen=True)
class Timeline:
    """Failed jobs per period (day, week or month), by cause, for the report's chart."""

    periods: list[str]  # each period's first day (a month: YYYY-MM)
    counts: list[dict[str, int]]  # per period: cause -> failed jobs
    unit: str  # day | week | month
    basis: str  # log: the first dated line of the logs; mtime: the files' modification time
    undated: int  # failed jobs that could not be placed


def failures_over_time(outcomes: Sequence[Outcome], df: pd.DataFrame) -> Timeline:
    """Failed jobs per day (or week, or month), stacked by cause.

    Jobs are placed by the first dated line of their logs. Only when no failed job has one
    are they placed by their files' modification time (an archive's files usually keep the
    time the job ended); the two are never mixed.
    """
    import pandas as pd

    failed = df["verdict"].notna() & (df["verdict"] != "clean")
    when = df["first_time"]
    basis = "log"
    undated = int((failed & when.isna()).sum())
    if not (failed & when.notna()).any():
        mtimes = pd.Series([o.job.mtime for o in outcomes], index=df.index, dtype="float64")
        when = pd.to_datetime(mtimes, unit="s", errors="coerce")
        basis, undated = "mtime", int((failed & when.isna()).sum())
    data = pd.DataFrame({"when": when, "cause": df["cause"].fillna("unknown")})[
        failed & when.notna()
    ]
    if data.empty:
        return Timeline([], [], "day", basis, undated)
    span = (data["when"].max() - data["when"].min()).days
    freq, label = ("D", "day") if span <= 90 else ("W", "week") if span <= 700 else ("MS", "month")
    periods = data["when"].dt.to_period(freq[0] if freq != "MS" else "M").dt.start_time
    counts = data.assign(period=periods).groupby(["period", "cause"]).size().unstack(fill_value=0)
    full = pd.period_range(
        counts.index.min(), counts.index.max(), freq=freq[0] if freq != "MS" else "M"
    ).start_time
    counts = counts.reindex(full, fill_value=0)
    labels = [str(p)[: 7 if freq == "MS" else 10] for p in counts.index]
    rows = [{str(c): int(k) for c, k in row.items() if k} for _, row in counts.iterrows()]
    return Timeline(labels, rows, label, basis, undated)
