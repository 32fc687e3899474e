#!/usr/bin/env python3
"""Time ``nccl-triage parse`` against ``grep -c -F -f KEYWORDS`` on the same big log.

KEYWORDS is written from ``nccl_triage.ingest.scan.ANCHORS``: grep looks for exactly the phrases
that the tool's candidate scan looks for, so grep's time is the floor of a line-oriented search
with the same keyword list. For each log both commands run ``--repeat`` times (interleaved); the
best time counts. Peak RSS is each child's own ``ru_maxrss`` (``os.wait4``).

Logs are generated with ``bench/gen_torchrun_log.py`` into ``bench/out/`` (gitignored), or given
as paths. Example (the README's table):

    /work/venv/bin/python bench/bench_parse.py --sizes 300M,1.2G --repeat 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gen_torchrun_log import main as generate_main
from gen_torchrun_log import parse_size


@dataclass
class Run:
    seconds: float
    max_rss_kb: int
    returncode: int


@dataclass
class Row:
    path: Path
    size: int
    grep: Run
    grep_matches: int
    tool: Run
    tool_peak_kb: int  # the largest peak over all runs
    events: int


def run_child(argv: list[str], stdout: int = subprocess.DEVNULL) -> tuple[Run, bytes]:
    """Run one command, its output to ``stdout``; time and peak RSS, and the output if piped.

    grep must not write to /dev/null: GNU grep notices and stops at the first match.
    """
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=stdout, stderr=errors)
        output = proc.stdout.read() if proc.stdout else b""  # small (grep -c)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        if proc.stdout:
            proc.stdout.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    if proc.returncode not in (0, 1):  # grep: 1 = no match; nccl-triage: 1 = failure found
        raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode}: {err.strip()}")
    return Run(elapsed, usage.ru_maxrss, proc.returncode), output


def tool_command() -> list[str]:
    exe = Path(sys.executable).with_name("nccl-triage")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nccl_triage"]


def write_keywords(path: Path) -> None:
    from nccl_triage.ingest.anchors import ANCHORS

    path.write_text("".join(a + "\n" for a in ANCHORS), encoding="utf-8")


def ensure_log(size_text: str, seed: int, out_dir: Path) -> Path:
    path = out_dir / f"torchrun-{size_text}-seed{seed}.log"
    if not path.exists():
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        generate_main(["--size", size_text, "--seed", str(seed), "--out", str(tmp)])
        tmp.rename(path)
        print(
            f"  {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
        )
    return path


def measure(path: Path, keywords: Path, repeat: int) -> Row:
    grep = ["grep", "-c", "-F", "-f", str(keywords), str(path)]
    tool = [*tool_command(), "parse", "--format", "jsonl", str(path)]
    # page cache warm-up: both commands read the file from memory afterwards
    with open(path, "rb") as fh:
        while fh.read(16 << 20):
            pass
    greps: list[Run] = []
    tools: list[Run] = []
    matches = 0
    for _ in range(repeat):
        run, output = run_child(grep, subprocess.PIPE)
        greps.append(run)
        matches = int(output or b"0")
        tools.append(run_child(tool)[0])
        print(
            f"  {path.name}: grep {greps[-1].seconds:.2f} s, tool {tools[-1].seconds:.2f} s "
            f"({tools[-1].max_rss_kb / 1024:.0f} MiB)",
            file=sys.stderr,
            flush=True,
        )
    # one more run of the tool for its output: the events (JSON Lines)
    with tempfile.TemporaryFile() as fh:
        counted, _ = run_child(tool, stdout=fh.fileno())
        fh.seek(0)
        events = sum(1 for _ in fh)
    return Row(
        path=path,
        size=path.stat().st_size,
        grep=min(greps, key=lambda r: r.seconds),
        grep_matches=matches,
        tool=min(tools, key=lambda r: r.seconds),
        tool_peak_kb=max(r.max_rss_kb for r in [*tools, counted]),
        events=events,
    )


def breakdown(path: Path) -> str:
    """Where the tool's time goes, measured in this process (scan alone, parse, grammar build)."""
    from nccl_triage.ingest.reader import iter_chunks, open_binary
    from nccl_triage.ingest.scan import scan
    from nccl_triage.parse import core as parse_mod

    start = time.perf_counter()
    parse_mod.parser.cache_clear()
    parse_mod.parser()
    build = time.perf_counter() - start
    start = time.perf_counter()
    candidates = 0
    with open_binary(str(path)) as fh:
        for _ in scan(iter_chunks(fh)):
            candidates += 1
    scan_s = time.perf_counter() - start
    start = time.perf_counter()
    result = parse_mod.parse_path(str(path))
    total = time.perf_counter() - start
    return (
        f"in-process breakdown for {path.name}: candidate scan alone {scan_s:.2f} s "
        f"({candidates} candidates, {path.stat().st_size / 1e6 / scan_s:.0f} MB/s); "
        f"parse_path {total:.2f} s ({len(result.events)} events); "
        f"Lark parser build {build:.2f} s"
    )


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    grep_version = subprocess.run(
        ["grep", "--version"], capture_output=True, text=True, check=False
    ).stdout
    return (
        f"{os.cpu_count()} cores ({cpu or platform.processor()}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, {grep_version.splitlines()[0]}, "
        f"LC_ALL={os.environ.get('LC_ALL', '')!r} LANG={os.environ.get('LANG', '')!r}"
    )


def table(rows: list[Row], repeat: int) -> str:
    head = (
        "| log | size | lines matched by grep | grep -c -F -f | nccl-triage parse | tool / grep "
        "| tool throughput | tool peak RSS | events |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| `{r.path.name}` | {r.size / 1e6:,.0f} MB | {r.grep_matches:,} | {r.grep.seconds:.2f} s "
        f"| {r.tool.seconds:.2f} s | {r.tool.seconds / r.grep.seconds:.2f}x "
        f"| {r.size / 1e6 / r.tool.seconds:,.0f} MB/s | {r.tool_peak_kb / 1024:.0f} MiB "
        f"| {r.events} |\n"
        for r in rows
    )
    return head + body + f"\nBest of {repeat} runs each; peak RSS is the largest over all runs.\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", type=Path, help="existing logs to measure")
    ap.add_argument(
        "--sizes", default="", help="generate logs of these sizes (comma-separated, e.g. 300M,1.2G)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per command (best counts)")
    ap.add_argument(
        "--out-dir",
        type=Path,
        default=HERE / "out",
        help="where generated logs and the keyword file go (default bench/out)",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the scan and the parse in-process on the largest log",
    )
    args = ap.parse_args(argv)
    if shutil.which("grep") is None:
        raise SystemExit("grep not found")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    logs = list(args.logs)
    for size_text in filter(None, (s.strip() for s in args.sizes.split(","))):
        parse_size(size_text)  # fail early on a typo
        logs.append(ensure_log(size_text, args.seed, args.out_dir))
    if not logs:
        ap.error("give LOG paths or --sizes")
    keywords = args.out_dir / "keywords.txt"
    write_keywords(keywords)
    load_before = os.getloadavg()
    rows = [measure(p, keywords, args.repeat) for p in logs]
    load_after = os.getloadavg()
    print("Machine:", machine())
    print(f"Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}")
    print("Commands:")
    print("  " + shlex.join(["grep", "-c", "-F", "-f", str(keywords), "LOG"]))
    print(
        "  " + shlex.join([*tool_command(), "parse", "--format", "jsonl", "LOG"]) + " > /dev/null"
    )
    print()
    print(table(rows, args.repeat))
    if args.breakdown:
        print(breakdown(max(logs, key=lambda p: p.stat().st_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
