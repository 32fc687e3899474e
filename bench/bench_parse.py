#!/usr/bin/env python3
"""Time ``nccl-triage parse`` and ``nccl-triage triage`` next to ``rg -j1`` and ``cat``.

On the same big log, in the same run, interleaved, ``--repeat`` times each (the best time
counts; peak RSS is the largest over all runs, each child's own ``ru_maxrss`` through
``os.wait4``):

* ``cat LOG > /dev/null``: reading the file, the floor of any tool;
* ``rg -j1 -c -F -f KEYWORDS LOG``: ripgrep on one thread over the literal phrases the tool's
  scan looks for. Two keyword files: the grammar's anchors (what ``parse`` scans for) and
  every literal anchor of the built-in rules' signals too (what ``triage`` scans for);
* ``nccl-triage parse --format jsonl LOG > /dev/null`` and ``nccl-triage triage LOG``, with the
  scan on Hyperscan (the default) and, with ``--re2``, on RE2 (``NCCL_TRIAGE_SCAN=re2``).

Each figure is printed next to its baseline: parse against rg with the grammar's keywords,
triage against rg with triage's keywords, both against cat. Logs are generated with
``bench/gen_torchrun_log.py`` into ``--out-dir`` (default ``bench/out/``, gitignored) or given
as paths. The table of README.md:

    python bench/bench_parse.py --sizes 1.2G --repeat 3 --re2 --breakdown
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
from dataclasses import dataclass, field
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
class Measured:
    """The runs of one command on one log."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdout: int = subprocess.DEVNULL
    runs: list[Run] = field(default_factory=list)
    output: bytes = b""

    @property
    def best(self) -> float:
        return min(r.seconds for r in self.runs)

    @property
    def peak_mib(self) -> float:
        return max(r.max_rss_kb for r in self.runs) / 1024


def run_child(
    argv: list[str], stdout: int = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> tuple[Run, bytes]:
    """Run one command, its output to ``stdout``; time and peak RSS, and the output if piped.

    grep and rg must not write to /dev/null: GNU grep notices and stops at the first match.
    """
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdout=stdout, stderr=errors, env={**os.environ, **(env or {})}
        )
        output = proc.stdout.read() if proc.stdout else b""  # small (-c)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        if proc.stdout:
            proc.stdout.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    if proc.returncode not in (0, 1):  # rg: 1 = no match; nccl-triage: 1 = failure found
        raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode}: {err.strip()}")
    return Run(elapsed, usage.ru_maxrss, proc.returncode), output


def tool_command() -> list[str]:
    exe = Path(sys.executable).with_name("nccl-triage")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nccl_triage"]


def write_keywords(out_dir: Path) -> tuple[Path, Path]:
    """The grammar's literal anchors, and every literal anchor triage scans for."""
    from nccl_triage.ingest.anchors import ANCHORS
    from nccl_triage.ingest.engines import REGEX_PREFIX
    from nccl_triage.pipeline import scan_patterns
    from nccl_triage.ruleset import load_ruleset

    grammar = out_dir / "keywords-parse.txt"
    grammar.write_text("".join(a + "\n" for a in ANCHORS), encoding="utf-8")
    every = out_dir / "keywords-triage.txt"
    literals = [a for a in scan_patterns(load_ruleset()) if not a.startswith(REGEX_PREFIX)]
    every.write_text("".join(a + "\n" for a in literals), encoding="utf-8")
    return grammar, every


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


def commands(log: Path, keywords: tuple[Path, Path], re2: bool) -> list[Measured]:
    tool = tool_command()
    out = [Measured("cat", ["cat", str(log)])]
    rg = shutil.which("rg")
    if rg:
        for name, kw in zip(("parse", "triage"), keywords, strict=True):
            argv = [rg, "-j1", "-c", "-F", "-f", str(kw), str(log)]
            out.append(Measured(f"rg-{name}", argv, stdout=subprocess.PIPE))
    engines = ["hyperscan", "re2"] if re2 else ["hyperscan"]
    for engine in engines:
        env = {"NCCL_TRIAGE_SCAN": engine}
        out.append(
            Measured(f"parse-{engine}", [*tool, "parse", "--format", "jsonl", str(log)], env)
        )
        out.append(Measured(f"triage-{engine}", [*tool, "triage", str(log)], env))
    return out


def measure(log: Path, keywords: tuple[Path, Path], repeat: int, re2: bool) -> list[Measured]:
    # page cache warm-up: every command reads the file from memory afterwards
    with open(log, "rb") as fh:
        while fh.read(16 << 20):
            pass
    rows = commands(log, keywords, re2)
    for i in range(repeat):
        for m in rows:
            run, output = run_child(m.argv, m.stdout, m.env)
            m.runs.append(run)
            m.output = output
        print(
            f"  {log.name} run {i + 1}: "
            + ", ".join(f"{m.label} {m.runs[-1].seconds:.2f} s" for m in rows),
            file=sys.stderr,
            flush=True,
        )
    return rows


def table(log: Path, rows: list[Measured], repeat: int) -> str:
    by = {m.label: m for m in rows}
    cat = by["cat"].best
    lines = [
        f"`{log.name}`: {log.stat().st_size / 1e6:,.0f} MB, best of {repeat}",
        "",
        "| command | time | baseline | time / baseline | time / cat | throughput | peak RSS |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for m in rows:
        kind = m.label.split("-")[0]
        base = by.get(f"rg-{kind}") if kind in ("parse", "triage") else None
        ratio = f"{m.best / base.best:.2f}x" if base else "-"
        base_text = f"{base.label} {base.best:.2f} s" if base else "-"
        lines.append(
            f"| {m.label} | {m.best:.2f} s | {base_text} | {ratio} | {m.best / cat:.1f}x "
            f"| {log.stat().st_size / 1e6 / m.best:,.0f} MB/s | {m.peak_mib:.0f} MiB |"
        )
    lines.extend(
        f"\n{label}: {int(by[label].output or b'0'):,} lines matched"
        for label in ("rg-parse", "rg-triage")
        if label in by
    )
    return "\n".join(lines) + "\n"


def breakdown(path: Path) -> str:
    """Where the tool's time goes, in this process: the scan per engine, parse, triage."""
    from nccl_triage.ingest.reader import iter_chunks, open_binary
    from nccl_triage.ingest.scan import Scanner
    from nccl_triage.parse.grammar import parser
    from nccl_triage.pipeline import grammar_patterns, parse_path, scan_patterns, triage_path
    from nccl_triage.ruleset import Ruleset, load_ruleset

    out = [f"in-process breakdown for {path.name}:"]
    rules = load_ruleset()
    start = time.perf_counter()
    parser.cache_clear()
    parser()
    out.append(f"  Lark parser build {time.perf_counter() - start:.2f} s")
    grammar = scan_patterns(Ruleset(rules=[], signals=[]))
    # as the pipeline scans: for triage, a line holding only a signal's anchor comes without
    # the lines around it (no grammar reads it)
    for name, anchors, neighbours in (
        ("parse", grammar, None),
        ("triage", scan_patterns(rules), grammar_patterns()),
    ):
        for engine in ("hyperscan", "re2"):
            start = time.perf_counter()
            n = bare = 0
            scanner = Scanner(anchors, history=0, engine=engine, neighbours=neighbours)
            with open_binary(str(path)) as fh:
                for chunk in iter_chunks(fh):
                    for cand in scanner.feed(chunk):
                        n += 1
                        bare += not cand.grammar
            for cand in scanner.close():
                n += 1
                bare += not cand.grammar
            took = time.perf_counter() - start
            out.append(
                f"  scan alone, {name}'s anchors, {engine}: {took:.2f} s "
                f"({path.stat().st_size / 1e6 / took:,.0f} MB/s, {n:,} candidate lines"
                + (f", {bare:,} of them a signal's only)" if neighbours else ")")
            )
    start = time.perf_counter()
    parsed = parse_path(str(path))
    out.append(f"  parse_path {time.perf_counter() - start:.2f} s ({len(parsed.events)} events)")
    start = time.perf_counter()
    report = triage_path(str(path), rules)
    out.append(
        f"  triage_path {time.perf_counter() - start:.2f} s ({len(report.signals):,} signal "
        f"events, verdict {report.verdict})"
    )
    return "\n".join(out)


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rg = shutil.which("rg")
    rg_version = (
        subprocess.run(
            [rg, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0]
        if rg
        else "no rg"
    )
    return (
        f"{os.cpu_count()} cores ({cpu or platform.processor()}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, {rg_version}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", type=Path, help="existing logs to measure")
    ap.add_argument(
        "--sizes", default="", help="generate logs of these sizes (comma-separated, e.g. 300M,1.2G)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per command (best counts)")
    ap.add_argument("--re2", action="store_true", help="also time the tool with the RE2 scan")
    ap.add_argument(
        "--out-dir",
        type=Path,
        default=HERE / "out",
        help="where generated logs and the keyword files go (default bench/out)",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the scan per engine, parse and triage in-process on the largest log",
    )
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    logs = list(args.logs)
    for size_text in filter(None, (s.strip() for s in args.sizes.split(","))):
        parse_size(size_text)  # fail early on a typo
        logs.append(ensure_log(size_text, args.seed, args.out_dir))
    if not logs:
        ap.error("give LOG paths or --sizes")
    keywords = write_keywords(args.out_dir)
    load_before = os.getloadavg()
    results = [(log, measure(log, keywords, args.repeat, args.re2)) for log in logs]
    load_after = os.getloadavg()
    print("Machine:", machine())
    print(f"Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}")
    print("Commands (LOG, KEYWORDS as below):")
    for m in results[0][1]:
        env = " ".join(f"{k}={v}" for k, v in m.env.items())
        print("  " + (env + " " if env else "") + shlex.join(m.argv))
    print()
    for log, rows in results:
        print(table(log, rows, args.repeat))
    if args.breakdown:
        print(breakdown(max(logs, key=lambda p: p.stat().st_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
