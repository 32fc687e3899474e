#!/usr/bin/env python3
"""Measure ``nccl-triage batch`` on a synthetic archive: engines, cache, and the table's accuracy.

Generates the archive with ``gen_jobs.py`` when it is missing, then times (wall clock, the
whole command: interpreter start, discovery, triage, table, summary) these runs, each in a
fresh process:

1. ``-j 1 --no-cache``                       serial
2. ``-j 2 --no-cache``                       two worker processes
3. ``--engine dask -j 2 --no-cache``         a local Dask cluster of two worker processes
                                             (its start-up included)
4. ``-j 2 --db NEW``                         cold cache: hashing and writing results too
5. ``-j 2 --db SAME``                        warm cache: nothing changed
6. ``-j 2 --db SAME`` after adding 1% jobs   a morning rerun over a grown archive

It checks that every run gives the same table, and compares the top cause of each job with
the cause the generator wrote (``manifest.csv``). Prints a Markdown table for the README: the
jobs per second over the whole command, and as the command counts them itself (from
discovery to the last job: no interpreter start-up, table or summary). ``--repeat N`` runs
the whole sequence N times and shows the best of N (with the median beside it): on a shared
machine the figures of one run move by a tenth.

    python bench/bench_batch.py --jobs 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_jobs import generate


def run(label: str, args: list[str], out: Path) -> dict[str, object]:
    cmd = [sys.executable, "-m", "nccl_triage", "batch", *args, "--no-progress", "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode not in (0, 1):
        sys.exit(f"{label}: exit {proc.returncode}\n{proc.stderr}")
    stats = next(line for line in proc.stdout.splitlines() if " triaged (" in line)
    print(f"{label:<34} {wall:7.1f} s  cpu {cpu:7.1f} s   {stats}", file=sys.stderr)
    # the command's own count, over every job (those from the cache too): from discovery to
    # the last job, without interpreter start-up, table or summary
    counts = re.search(r"(\d+) triaged .*?, (\d+) from cache, ([\d.]+) s", stats)
    own = (int(counts[1]) + int(counts[2])) / float(counts[3]) if counts else 0.0
    return {"run": label, "wall": wall, "cpu": cpu, "stats": stats, "table": out, "own": own}


def one_round(
    archive: Path, work: Path, args: argparse.Namespace
) -> tuple[list[dict[str, object]], pd.DataFrame]:
    """Every step once: from no cache to a cold cache, a warm one, and a grown archive.

    And the table of the first step, which every other step but the last gives too.
    """
    grown = archive / "grown"
    if grown.exists():
        shutil.rmtree(grown)
    db = work / "cache.sqlite"
    for p in work.glob("cache.sqlite*"):
        p.unlink()
    target = [str(archive)]
    runs = [
        run("-j 1, no cache", [*target, "-j", "1", "--no-cache"], work / "j1.csv"),
        run("-j 2, no cache", [*target, "-j", "2", "--no-cache"], work / "j2.csv"),
    ]
    if not args.skip_dask:
        runs.append(
            run(
                "dask, 2 local workers, no cache",
                [*target, "--engine", "dask", "-j", "2", "--no-cache"],
                work / "dask.csv",
            )
        )
    runs.append(run("-j 2, cold cache", [*target, "-j", "2", "--db", str(db)], work / "cold.csv"))
    runs.append(run("-j 2, warm cache", [*target, "-j", "2", "--db", str(db)], work / "warm.csv"))
    added = max(1, args.jobs // 100)
    generate(grown, added, seed=8, filler=120)
    runs.append(
        run(
            f"-j 2, warm cache, +{added} new jobs",
            [*target, "-j", "2", "--db", str(db)],
            work / "grown.csv",
        )
    )
    reference = pd.read_csv(work / "j1.csv")
    for r in runs[1:-1]:
        other = pd.read_csv(r["table"])  # type: ignore[arg-type]
        pd.testing.assert_frame_equal(reference, other, check_exact=False)
    return runs, reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, default=Path("bench/out/jobs"))
    ap.add_argument("--work", type=Path, default=Path("bench/out/batch-runs"))
    ap.add_argument("--skip-dask", action="store_true")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run every step N times: the best figure of N shown"
    )
    args = ap.parse_args()
    archive: Path = args.dir
    manifest = archive / "manifest.csv"
    if not manifest.is_file() or sum(1 for _ in manifest.open(encoding="utf-8")) != args.jobs + 1:
        print(f"generating {args.jobs} jobs in {archive}", file=sys.stderr)
        generate(archive, args.jobs, seed=7, filler=120)
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    done = [one_round(archive, work, args) for _ in range(args.repeat)]
    rounds = [runs for runs, _table in done]
    added = max(1, args.jobs // 100)
    runs, reference = done[0]
    for _runs, table in done[1:]:
        pd.testing.assert_frame_equal(reference, table, check_exact=False)
    print("tables: identical across runs", file=sys.stderr)

    want = pd.read_csv(manifest)
    want["job"] = str(archive) + "/" + want["job"]
    got = want.merge(reference[["job", "cause"]], on="job", how="left", suffixes=("", "_found"))
    right = got["cause"] == got["cause_found"]
    by_cause = got.assign(right=right).groupby("cause")["right"].agg(["sum", "count"])

    jobs = len(reference)
    print(
        f"\n{jobs} jobs, {sum(1 for _ in archive.rglob('*.*'))} files; "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}\n"
    )
    rep = f", best of {args.repeat} (median)" if args.repeat > 1 else ""
    print(f"| run | wall time{rep} | jobs/s | jobs/s (its own count) | CPU time (all processes) |")
    print("|---|---:|---:|---:|---:|")
    for i, r in enumerate(runs):
        n = jobs + (added if "new jobs" in str(r["run"]) else 0)
        walls = sorted(float(rd[i]["wall"]) for rd in rounds)  # type: ignore[arg-type]
        own = sorted(float(rd[i]["own"]) for rd in rounds)  # type: ignore[arg-type]
        cpus = sorted(float(rd[i]["cpu"]) for rd in rounds)  # type: ignore[arg-type]
        wall, cpu = walls[0], cpus[0]
        mid = f" ({statistics.median(walls):.1f} s)" if args.repeat > 1 else ""
        counted = f"{own[-1]:.0f}"
        if args.repeat > 1:
            counted += f" ({statistics.median(own):.0f})"
        print(f"| {r['run']} | {wall:.1f} s{mid} | {n / wall:.0f} | {counted} | {cpu:.1f} s |")
    print(
        f"\ntop cause equals the generated cause: {int(right.sum())}/{len(got)} ({right.mean():.1%})"
    )
    for cause, row in by_cause.iterrows():
        if row["sum"] != row["count"]:
            print(f"  {cause}: {int(row['sum'])}/{int(row['count'])}")


if __name__ == "__main__":
    main()
