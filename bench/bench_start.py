#!/usr/bin/env python3
"""Measure how fast ``nccl-triage`` starts and answers on a small log.

Times, each in a fresh process, interleaved, ``--repeat`` rounds (the best counts, the median
beside it):

* ``python -c pass``: the interpreter alone, the baseline;
* ``python -c "import click, jinja2, lark"``: the libraries a triage cannot do without;
* ``nccl-triage --help``;
* ``nccl-triage triage LOG`` on each bundled example log (``fixtures/logs``).

Caches as a user has them from the second run on (one unmeasured run first); ``--cold`` gives
every run an empty cache directory instead, the first start after an install. The bytecode is
compiled first, as ``pip install`` leaves it. Prints a Markdown table for the README.

    python bench/bench_start.py --repeat 10
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tool() -> list[str]:
    """The installed command, as a user runs it (else the module)."""
    script = Path(sys.executable).with_name("nccl-triage")
    return [str(script)] if script.exists() else [sys.executable, "-m", "nccl_triage"]


def once(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--cold", action="store_true", help="an empty cache directory every run")
    args = ap.parse_args()

    import nccl_triage

    compileall.compile_dir(Path(nccl_triage.__file__).parent, quiet=1)
    logs = sorted((ROOT / "fixtures" / "logs").glob("*.log"))
    runs: list[tuple[str, list[str]]] = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("import click, jinja2, lark", [sys.executable, "-c", "import click, jinja2, lark"]),
        ("nccl-triage --help", [*tool(), "--help"]),
    ]
    runs += [(f"triage {log.name}", [*tool(), "triage", str(log)]) for log in logs]
    times: dict[str, list[float]] = {label: [] for label, _ in runs}
    scratch = Path(tempfile.mkdtemp(prefix="bench-start-"))
    env = {**os.environ, "XDG_CACHE_HOME": str(scratch / "cache")}
    try:
        for _, cmd in runs:
            once(cmd, env)  # caches filled, files in the page cache
        for _ in range(args.repeat):
            for label, cmd in runs:
                if args.cold:
                    shutil.rmtree(scratch / "cache", ignore_errors=True)
                times[label].append(once(cmd, env))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    base = min(times["python -c pass"])
    print(
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {'empty' if args.cold else 'warm'} cache, "
        f"best of {args.repeat} (median), load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| command | best | median | best - python -c pass |")
    print("|---|---:|---:|---:|")
    for label, _ in runs:
        best = min(times[label])
        print(
            f"| {label} | {best:.3f} s | {statistics.median(times[label]):.3f} s "
            f"| {best - base:+.3f} s |"
        )


if __name__ == "__main__":
    main()
