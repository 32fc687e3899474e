#!/usr/bin/env python3
"""Time ``nccl-triage triage`` on logs made of nothing but NCCL failure lines.

A real log is almost all training output; a dense one is the worst case for the tool, since
every line is a candidate for the grammar: a job whose 512 ranks each print their watchdog
line and its status lines, a retry loop printing the same NCCL WARN for an hour. Three logs:

* ``identical``: the same watchdog line, byte for byte, N times;
* ``repeated``: one watchdog line per rank, each with its own timestamp, cycling over 512
  ranks (the messages repeat, the lines do not);
* ``distinct``: every line another collective (SeqNum, rank, timestamp all differ): every
  message is new to the grammar.

Each runs ``--repeat`` times against two baselines in the same run, ``cat FILE`` and
``rg -j1 -c Watchdog FILE`` (ripgrep on one thread), best time counted; the ratios are what
to quote. The default ``--max-candidates`` applies, as a user gets it.

    python bench/bench_dense.py --lines 40000 --repeat 5
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_parse import Run, machine, run_child, tool_command

LINE = (
    "[rank{rank}]:[E1121 10:{m:02d}:{s:02d}.{us:09d} ProcessGroupNCCL.cpp:632] [Rank {rank}] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
    "NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) ran for 600051 milliseconds "
    "before timing out.\n"
)


def write(kind: str, lines: int, out: Path) -> Path:
    path = out / f"dense-{kind}-{lines}.log"
    if path.exists():
        return path
    with path.open("w", encoding="utf-8") as fh:
        for i in range(lines):
            if kind == "identical":
                rank, seq, t = 0, 812, 0
            elif kind == "repeated":
                rank, seq, t = i % 512, 812, i
            else:
                rank, seq, t = i % 512, 812 + i, i
            fh.write(
                LINE.format(rank=rank, seq=seq, m=(t // 60_000) % 60, s=(t // 1000) % 60, us=t)
            )
    return path


def best(argv: list[str], repeat: int, stdout: int = subprocess.DEVNULL) -> Run:
    runs = [run_child(argv, stdout)[0] for _ in range(repeat)]
    return min(runs, key=lambda r: r.seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lines", type=int, default=40_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rg = shutil.which("rg")
    print(machine())
    print("| log | lines | MB | cat | rg -j1 -c | nccl-triage triage | triage / rg | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ("identical", "repeated", "distinct"):
        path = write(kind, args.lines, args.out)
        cat = best(["cat", str(path)], args.repeat)
        grep = (
            best([rg, "-j1", "-c", "Watchdog", str(path)], args.repeat, subprocess.PIPE)
            if rg
            else None
        )
        tool = best([*tool_command(), "triage", str(path)], args.repeat)
        ratio = f"{tool.seconds / grep.seconds:.0f}x" if grep else "-"
        print(
            f"| {kind} | {args.lines:,} | {path.stat().st_size / 1e6:.1f} | {cat.seconds:.3f} s "
            f"| {grep.seconds:.3f} s | {tool.seconds:.2f} s | {ratio} | {tool.max_rss_kb / 1024:.0f} MiB |"
            if grep
            else f"| {kind} | {args.lines:,} | {path.stat().st_size / 1e6:.1f} | {cat.seconds:.3f} s "
            f"| - | {tool.seconds:.2f} s | - | {tool.max_rss_kb / 1024:.0f} MiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
