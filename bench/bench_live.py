#!/usr/bin/env python3
"""Benchmarks of live triage (`nccl-triage watch`): throughput, report latency, peak memory.

    python bench/bench_live.py                      # all three, on a 1 GiB synthetic log
    python bench/bench_live.py throughput --log bench/out/torchrun-1.2G.log
    python bench/bench_live.py latency --runs 10
    python bench/bench_live.py paced --rate 500       # a job printing 500 MB/s
    python bench/bench_live.py memory

* **throughput**: ``cat LOG | X > pipe`` where X is ``cat`` and then ``nccl-triage watch``, in
  the same run; the time until the reader at the end of the pipe sees end of file (and, for
  watch, until it has exited with its final report), with the SHA-256 of what came out. Also
  how much the analyser had to skip (it never slows the output down).
* **paced**: the same, but the log is written by a job that prints ``--rate`` MB/s (1 MiB at a
  time, as fast as that rate allows): whether the analyser keeps up with it (skips nothing).
* **latency**: a fake job writes the start of a torchrun log, then eight ranks' timeout lines in
  one burst, then either goes quiet (hung) or goes on printing every 10 ms (busy). Measured:
  from the write of the last timeout line to the first live diagnosis on stderr.
* **memory**: peak RSS (VmHWM) of the pump and of the analyser during the throughput run, and
  of the whole analysis (every byte analysed, in-process) over the same stream.

The log defaults to ``bench/out/live-1G.log``, made by ``bench/gen_torchrun_log.py`` when it is
there, else by a simpler generator here (training lines, NCCL INFO blocks, checkpoint saves,
and a real failure at the end).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
FIXTURE = ROOT / "fixtures" / "logs" / "lora-oom-hidden-by-timeout.log"
NCCL_TRIAGE = [sys.executable, "-m", "nccl_triage"]
GIB = 1 << 30


# ----------------------------------------------------------------------------- input


def make_log(path: Path, size: int) -> Path:
    if path.exists() and path.stat().st_size >= size * 0.95:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = ROOT / "bench" / "gen_torchrun_log.py"
    if gen.exists():
        subprocess.run(
            [sys.executable, str(gen), "--size", str(size), "--out", str(path)], check=True
        )
        return path
    tail = FIXTURE.read_bytes()
    block = b"".join(
        (
            (
                b"[default0]:{'loss': 1.3377, 'grad_norm': 0.271, 'learning_rate': 0.0002, "
                b"'epoch': 0.5}\n"
            ),
            (
                b"[default3]: 45%|####5     | 4500/10000 [1:02:11<1:16:02,  1.20it/s]\r"
                b" 45%|####5     | 4501/10000 [1:02:12<1:16:01,  1.20it/s]\n"
            ),
            b"[default1]:gpu-node-17:48218:48218 [1] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7\n",
            b"[default2]:[2025-01-08 14:02:11,501] [INFO] [trainer.py:2012] step 4500 done\n",
        )
        * 50
    )
    save = b"[default0]:Saving model checkpoint to ./out/checkpoint-4500\n"
    with path.open("wb") as fh:
        written = 0
        n = 0
        while written < size - len(tail):
            chunk = block + (save if n % 200 == 0 else b"")
            fh.write(chunk)
            written += len(chunk)
            n += 1
        fh.write(tail)
    return path


# ----------------------------------------------------------------------------- helpers


def vm_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


class PeakRss:
    """Samples VmHWM of a process and its children until stopped (the peak only grows)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in [self.pid, *children(self.pid)]:
                hwm = vm_hwm_kib(pid)
                if hwm is not None:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), hwm)
            time.sleep(0.05)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def drain(fd: int, digest: bool) -> tuple[int, str, float]:
    h = hashlib.sha256()
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if digest:
            h.update(chunk)
    return total, h.hexdigest() if digest else "", time.perf_counter()


def sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- throughput


# A job printing at a steady rate: 1 MiB writes, each when the rate allows it.
PACER = """
import os, sys, time
path, rate = sys.argv[1], float(sys.argv[2]) * 1e6
sent, t0 = 0, time.perf_counter()
with open(path, "rb") as fh:
    while block := fh.read(1 << 20):
        ahead = sent / rate - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)
        view = memoryview(block)
        while view:
            view = view[os.write(1, view):]
        sent += len(block)
"""


def pipeline(
    log: Path,
    middle: list[str],
    digest: bool,
    stderr: int | None = None,
    rate: float | None = None,
) -> dict:
    """``cat LOG | middle`` read to the end here; times and what came out.

    ``rate``: the log is written at this many MB/s (a paced job) instead of by ``cat``.
    """
    t0 = time.perf_counter()
    source = (
        ["cat", str(log)] if rate is None else [sys.executable, "-c", PACER, str(log), str(rate)]
    )
    cat = subprocess.Popen(source, stdout=subprocess.PIPE)
    assert cat.stdout is not None
    mid = subprocess.Popen(middle, stdin=cat.stdout, stdout=subprocess.PIPE, stderr=stderr)
    cat.stdout.close()
    assert mid.stdout is not None
    peak = PeakRss(mid.pid)
    total, sha, t_eof = drain(mid.stdout.fileno(), digest)
    mid.stdout.close()
    mid.wait()
    cat.wait()
    t_exit = time.perf_counter()
    peaks = peak.stop()
    return {
        "bytes": total,
        "sha256": sha,
        "eof_s": t_eof - t0,
        "exit_s": t_exit - t0,
        "status": mid.returncode,
        "peaks_kib": peaks,
        "pid": mid.pid,
    }


def bench_throughput(log: Path, runs: int, digest: bool) -> dict:
    size = log.stat().st_size
    want = sha_file(log) if digest else ""
    print(f"throughput: {log} ({size / GIB:.2f} GiB), best of {runs}", flush=True)
    results: dict[str, list[dict]] = {"cat": [], "watch": []}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        for _ in range(runs):
            results["cat"].append(pipeline(log, ["cat"], digest))
            results["watch"].append(
                pipeline(
                    log,
                    [*NCCL_TRIAGE, "watch", "--report", str(report), "--format", "json"],
                    digest,
                )
            )
            final = json.loads(report.read_text(encoding="utf-8").splitlines()[-1])
            results["watch"][-1]["final"] = final
    out = {}
    for name, rs in results.items():
        best = min(rs, key=lambda r: r["eof_s"])
        ok = all(r["bytes"] == size and (not digest or r["sha256"] == want) for r in rs)
        mbps = size / best["eof_s"] / 1e6
        line = f"  {name:<6} {mbps:8.0f} MB/s to end of output ({best['eof_s']:.2f} s)"
        if name == "watch":
            live = best["final"]["live"]
            line += (
                f", exit after {best['exit_s']:.2f} s (status {best['status']},"
                f" verdict {best['final']['verdict']}), analyser skipped"
                f" {live['dropped_bytes'] / (1 << 20):.0f} MiB"
            )
            pump = best["peaks_kib"].get(best["pid"], 0)
            others = sum(v for k, v in best["peaks_kib"].items() if k != best["pid"])
            line += f"; peak RSS pump {pump / 1024:.0f} MiB, analyser {others / 1024:.0f} MiB"
        line += "  [sha256 equal]" if ok and digest else ("" if ok else "  [OUTPUT DIFFERS]")
        print(line, flush=True)
        out[name] = {"mb_per_s": mbps, **{k: v for k, v in best.items() if k != "final"}}
    out["ratio"] = out["watch"]["mb_per_s"] / out["cat"]["mb_per_s"]
    print(f"  watch/cat: {out['ratio']:.2f}", flush=True)
    return out


def bench_paced(log: Path, runs: int, rate: float) -> dict:
    """A job printing ``rate`` MB/s into ``watch``: does the analyser keep up (skip nothing)?"""
    size = log.stat().st_size
    print(f"paced: {log} ({size / GIB:.2f} GiB) written at {rate:g} MB/s, {runs} runs", flush=True)
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        for _ in range(runs):
            alone = pipeline(log, ["cat"], False, rate=rate)
            r = pipeline(
                log,
                [*NCCL_TRIAGE, "watch", "--report", str(report), "--format", "json"],
                False,
                rate=rate,
            )
            final = json.loads(report.read_text(encoding="utf-8").splitlines()[-1])
            live = final["live"]
            row = {
                "source_mb_per_s": size / alone["eof_s"] / 1e6,
                "watch_mb_per_s": size / r["eof_s"] / 1e6,
                "exit_s": r["exit_s"],
                "after_eof_s": r["exit_s"] - r["eof_s"],
                "skipped_bytes": live["dropped_bytes"],
                "verdict": final["verdict"],
            }
            out.append(row)
            print(
                f"  job alone {row['source_mb_per_s']:.0f} MB/s; under watch "
                f"{row['watch_mb_per_s']:.0f} MB/s to end of output, final report "
                f"{row['after_eof_s']:.2f} s after it; analyser skipped "
                f"{row['skipped_bytes'] / (1 << 20):.0f} MiB; verdict {row['verdict']}",
                flush=True,
            )
    return {"rate_mb_per_s": rate, "runs": out}


# ----------------------------------------------------------------------------- latency


def timeout_line(rank: int) -> bytes:
    return (
        f"[rank{rank}]:[E108 14:47:33.69012{rank}466 ProcessGroupNCCL.cpp:616] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4812, OpType=ALLREDUCE, "
        f"NumelIn=41943040, NumelOut=41943040, Timeout(ms)=600000) ran for 600043 milliseconds "
        f"before timing out.\n"
    ).encode()


def one_latency(busy: bool) -> tuple[float, int]:
    proc = subprocess.Popen(
        [*NCCL_TRIAGE, "watch", "--no-color"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    seen: list[tuple[float, bytes]] = []

    def read_err() -> None:
        assert proc.stderr is not None
        while chunk := os.read(proc.stderr.fileno(), 65536):
            seen.append((time.perf_counter(), chunk))

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    prelude = FIXTURE.read_bytes().split(b"[rank0]:[E108")[0]
    for line in prelude.splitlines(keepends=True):
        proc.stdin.write(line)
        proc.stdin.flush()
        time.sleep(0.02)
    time.sleep(1.5)  # the analyser has long started when a real job fails
    burst = b"".join(timeout_line(r) for r in range(8) if r != 2)
    proc.stdin.write(burst)
    proc.stdin.flush()
    t_done = time.perf_counter()
    first = None
    deadline = t_done + 10
    i = 0
    while first is None and time.perf_counter() < deadline:
        if busy:
            proc.stdin.write(f"[rank2]: still loading shard {i}\n".encode())
            proc.stdin.flush()
            i += 1
        time.sleep(0.01)
        text = b""
        for at, chunk in seen.copy():  # the reader thread appends meanwhile
            text += chunk
            if b"live diagnosis" in text:
                first = at
                break
    time.sleep(1.5)  # would a second live report follow?
    proc.stdin.close()
    proc.wait()
    reader.join()
    reports = b"".join(c for _, c in seen).count(b"nccl-triage: live diagnosis")
    return (first - t_done) if first is not None else float("inf"), reports


def bench_latency(runs: int) -> dict:
    print(f"latency: completing timeout line -> first live diagnosis, {runs} runs each", flush=True)
    out = {}
    for busy in (False, True):
        times, counts = [], []
        for _ in range(runs):
            t, n = one_latency(busy)
            times.append(t)
            counts.append(n)
        name = "busy" if busy else "hung"
        out[name] = {
            "median_s": statistics.median(times),
            "max_s": max(times),
            "reports": counts,
        }
        print(
            f"  {name:<5} median {statistics.median(times) * 1000:.0f} ms,"
            f" max {max(times) * 1000:.0f} ms; live reports per run: {sorted(set(counts))}",
            flush=True,
        )
    return out


# ----------------------------------------------------------------------------- memory


def bench_analysis_memory(log: Path) -> dict:
    """Every byte analysed in-process (no dropping): time and peak RSS of the analysis."""
    code = f"""
import os, resource, sys, time
from nccl_triage.live.triage import LiveTriage
from nccl_triage.ruleset import load_ruleset
rs = load_ruleset()
reports = []
live = LiveTriage("<stdin>", rs, lambda r, s: reports.append(r.verdict))
t0 = time.perf_counter()
with open({str(log)!r}, "rb") as fh:
    while chunk := fh.read(1 << 20):
        live.feed(chunk)
        live.tick()
report = live.finish()
el = time.perf_counter() - t0
print(el, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, report.verdict,
      len(report.signals), len(report.events))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    el, rss, verdict, nsig, nev = res.stdout.split()
    size = log.stat().st_size
    print(
        f"analysis of every byte, in-process: {float(el):.1f} s"
        f" ({size / float(el) / 1e6:.0f} MB/s),"
        f" peak RSS {int(rss) / 1024:.0f} MiB, verdict {verdict},"
        f" {nsig} signal events kept, {nev} events",
        flush=True,
    )
    return {"seconds": float(el), "peak_rss_kib": int(rss), "verdict": verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="*", default=["throughput", "latency", "memory"])
    ap.add_argument("--log", type=Path, default=OUT / "live-1G.log")
    ap.add_argument("--size", type=int, default=GIB, help="bytes of the generated log")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-digest", action="store_true", help="skip the SHA-256 comparison")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--rate", type=float, default=500.0, help="MB/s of the paced job (paced)")
    args = ap.parse_args()
    if not shutil.which("cat"):
        sys.exit("needs cat")
    results: dict[str, object] = {"cpus": os.cpu_count()}
    if {"throughput", "paced", "memory"} & set(args.what):
        log = make_log(args.log, args.size)
    if "paced" in args.what:
        results["paced"] = bench_paced(log, args.runs, args.rate)
    if "throughput" in args.what:
        results["throughput"] = bench_throughput(log, args.runs, not args.no_digest)
    if "latency" in args.what:
        results["latency"] = bench_latency(max(args.runs, 5))
    if "memory" in args.what:
        results["analysis"] = bench_analysis_memory(log)
    results["self_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
