"""Time ``nccl-triage fr`` and ``triage LOG --fr`` on a synthetic 64-rank job with full buffers.

Input: options (ranks, entries per rank, repeats). Output: the dumps in ``bench/out/fr64/``
(pickles as ProcessGroupNCCL writes them: version 2.10, pg_config, pg_status, 2000 entries
per rank with stack frames, ring buffer wrapped), the job's stderr in ``bench/out/fr64.log``
(NCCL's init lines, training progress, then every other rank's watchdog timeout) and a table
on stdout: wall time and peak RSS of ``fr`` (text and JSON), of ``triage LOG`` alone and of
``triage LOG --fr DIR`` (text and JSON), next to ``cat`` of the same files and a plain
``pickle.load`` of them, best of N, each in a fresh process (peak RSS is the child's own, from
``os.wait4``), with each command's time as a multiple of ``cat``'s and of ``fr``'s.

The job: 64 ranks, tensor-parallel groups of 8, data-parallel groups of 8 (every 8th rank)
and the world group. Each step makes a TP all_gather, a TP reduce_scatter and a DP all_reduce;
every tenth step a world all_reduce. Rank 37 stops enqueuing (a CPU-side stall) 5 steps
before the end, so its TP and DP groups hang and, through them, everyone.

    python bench/bench_fr.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out" / "fr64"
TP = 8
CULPRIT = 37

FRAMES = [
    {
        "name": "all_reduce",
        "filename": "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
        "line": 2501,
    },
    {
        "name": "wrapper",
        "filename": "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py",
        "line": 83,
    },
    {"name": "reduce_grads", "filename": "/job/megatron/core/distributed/grads.py", "line": 211},
    {"name": "train_step", "filename": "/job/megatron/training/training.py", "line": 612},
    {"name": "train", "filename": "/job/megatron/training/training.py", "line": 1404},
    {"name": "pretrain", "filename": "/job/megatron/training/training.py", "line": 318},
    {"name": "<module>", "filename": "/job/pretrain_gpt.py", "line": 244},
]


def groups_of(rank: int, world: int) -> dict[str, tuple[str, list[int]]]:
    """The groups a rank belongs to: name -> (desc, global ranks)."""
    tp = rank // TP
    dp = rank % TP
    return {
        "0": ("default_pg", list(range(world))),
        str(1 + tp): ("tp", list(range(tp * TP, tp * TP + TP))),
        str(1 + world // TP + dp): ("dp", list(range(dp, world, TP))),
    }


def schedule(rank: int, world: int, steps: int) -> list[tuple[str, str, str, int]]:
    """Every op the rank enqueues: (group name, desc, op, numel)."""
    groups = groups_of(rank, world)
    (tp_name, _), (dp_name, _) = [(n, g) for n, g in groups.items() if n != "0"]
    ops: list[tuple[str, str, str, int]] = []
    for step in range(steps):
        ops.append((tp_name, "tp", "all_gather_into_tensor", 4096))
        ops.append((tp_name, "tp", "reduce_scatter_tensor", 32768))
        ops.append((dp_name, "dp", "all_reduce", 1 << 20))
        if step % 10 == 9:
            ops.append(("0", "default_pg", "all_reduce", 1))
    return ops


def make_dump(rank: int, world: int, entries: int) -> dict[str, Any]:
    """One rank's dump: the last ``entries`` ops of its schedule, the newest not completed."""
    steps = entries  # far more ops than the buffer holds, so the ring buffer wraps
    ops = schedule(rank, world, steps)
    stop = len(ops) - 5 * 3 - 1  # the culprit stops 5 steps before the others
    if rank == CULPRIT:
        ops = ops[:stop]
    seq: dict[str, int] = {}
    records: list[dict[str, Any]] = []
    hung_from = len(ops) - 4 if rank != CULPRIT else len(ops)
    for record_id, (name, desc, op, numel) in enumerate(ops):
        seq[name] = seq.get(name, 0) + 1
        done = record_id < hung_from
        records.append(
            {
                "record_id": record_id,
                "pg_id": int(name),
                "process_group": (name, desc),
                "collective_seq_id": seq[name],
                "p2p_seq_id": 0,
                "op_id": seq[name],
                "profiling_name": f"nccl:{op}",
                "time_created_ns": 1_700_000_000_000_000_000 + record_id * 1_000_000,
                "input_sizes": [[numel]],
                "input_dtypes": ["BFloat16"],
                "output_sizes": [[numel]],
                "output_dtypes": ["BFloat16"],
                "state": "completed" if done else "scheduled",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": 1_700_000_000_000_000_000 + record_id
                if done
                else None,
                "retired": done,
                "timeout_ms": 600_000,
                "is_p2p": False,
                "frames": FRAMES,
                "thread_id": "140154121218944",
                "thread_name": "pt_main_thread",
            }
        )
    status = {
        str(int(name)): {
            "last_enqueued_collective": count,
            "last_started_collective": -1,
            "last_completed_collective": max(
                (
                    r["collective_seq_id"]
                    for r in records
                    if r["process_group"][0] == name and r["retired"]
                ),
                default=0,
            ),
        }
        for name, count in seq.items()
    }
    config = {
        name: {"name": name, "desc": desc, "ranks": str(ranks)}
        for name, (desc, ranks) in groups_of(rank, world).items()
    }
    return {
        "version": "2.10",
        "pg_config": config,
        "pg_status": status,
        "nccl_version": "2.21.5",
        "entries": records[-entries:],
    }


LOG = OUT.parent / "fr64.log"
_TIMEOUT = (
    "[rank{rank}]:[E1121 10:{m:02d}:{s:02d}.{rank:06d}000 ProcessGroupNCCL.cpp:632] "
    "[PG ID {pg} PG GUID {pg}({desc}) Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
    "NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 600051 milliseconds before "
    "timing out.\n"
)


def write_log(world: int, steps: int) -> Path:
    """The job's stderr: init lines, progress, every rank but the culprit timing out."""
    lines = [
        f"[rank{r}]:host{r // 8}:{4000 + r}:{4100 + r} [{r % 8}] NCCL INFO Init COMPLETE "
        f"comm 0x55d0c2a1{r:04x} rank {r} nranks {world} cudaDev {r % 8} nvmlDev {r % 8} - Init "
        "COMPLETE\n"
        for r in range(world)
    ]
    lines += [
        f"[rank0]: iteration {i:>6}/ 100000 | consumed samples: {i * 512:>9} | lm loss: "
        f"{2.5 - i / 10**5:.6E} | grad norm: 0.812 | elapsed time per iteration (ms): 412.3\n"
        for i in range(1, steps + 1)
    ]
    for r in range(world):
        if r == CULPRIT:
            continue
        # the culprit's tensor-parallel peers wait in its all_gather, the others (through the
        # culprit's data-parallel group) in their data-parallel all_reduce
        groups = groups_of(r, world)
        same_tp = r // TP == CULPRIT // TP
        pg = next(n for n, (d, _) in groups.items() if d == ("tp" if same_tp else "dp"))
        op, numel = ("_ALLGATHER_BASE", 4096) if same_tp else ("ALLREDUCE", 1 << 20)
        lines.append(
            _TIMEOUT.format(
                rank=r, m=21, s=r % 60, pg=pg, desc=groups[pg][0], seq=steps, op=op, numel=numel
            )
        )
    LOG.write_text("".join(lines), encoding="utf-8")
    return LOG


def write_job(world: int, entries: int) -> list[Path]:
    """Write every rank's dump into OUT; return the files."""
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    files = []
    for rank in range(world):
        path = OUT / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(make_dump(rank, world, entries), protocol=2))
        files.append(path)
    return files


def measure(cmd: list[str], repeat: int) -> tuple[float, int, int]:
    """Best wall time (s), peak RSS (KiB, the child's own ru_maxrss) and exit code of a command."""
    best, rss, code = float("inf"), 0, 0
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        best = min(best, time.perf_counter() - started)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        rss = max(rss, usage.ru_maxrss)
    return best, rss, code


def main() -> None:
    """Make the job, time the commands, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = write_job(args.ranks, args.entries)
    log = write_log(args.ranks, args.entries)
    total = sum(p.stat().st_size for p in files)
    print(f"{len(files)} dumps, {args.entries} entries each, {total / 2**20:.1f} MiB in {OUT}")
    print(f"job log: {log.stat().st_size / 2**20:.1f} MiB, {args.entries + 2 * args.ranks} lines")
    tool = [sys.executable, "-m", "nccl_triage"]
    fr = [*tool, "fr", str(OUT)]
    triage = [*tool, "triage", str(log)]
    load = "import pickle, sys; [pickle.load(open(f, 'rb')) for f in sys.argv[1:]]"
    runs = [
        ("cat DUMPS LOG > /dev/null", ["cat", *map(str, files), str(log)]),
        ("python: pickle.load of every dump", [sys.executable, "-c", load, *map(str, files)]),
        ("nccl-triage fr DIR", fr),
        ("nccl-triage fr DIR --format json", [*fr, "--format", "json"]),
        ("nccl-triage triage LOG", triage),
        ("nccl-triage triage LOG --fr DIR", [*triage, "--fr", str(OUT)]),
        ("nccl-triage triage LOG --fr DIR (json)", [*triage, "--fr", str(OUT), "--format", "json"]),
    ]
    print(f"{'command':40} {'best wall':>10} {'x cat':>7} {'x fr':>6} {'peak RSS':>10} {'exit':>5}")
    walls: dict[str, float] = {}
    for label, cmd in runs:
        wall, rss, code = measure(cmd, args.repeat)
        walls[label] = wall
        vs_cat = wall / walls["cat DUMPS LOG > /dev/null"]
        vs_fr = (
            f"{wall / walls['nccl-triage fr DIR']:5.2f}" if "nccl-triage fr DIR" in walls else ""
        )
        print(f"{label:40} {wall:9.2f}s {vs_cat:6.0f}x {vs_fr:>6} {rss / 1024:7.0f} MiB {code:5}")
    started = time.perf_counter()
    result = subprocess.run([*fr, "--format", "json"], capture_output=True, text=True, check=False)
    print(
        f"check: {result.stdout.count(chr(10))} lines of JSON in {time.perf_counter() - started:.2f}s;",
        "culprit 37 named"
        if '"culprit_ranks": [\n    37\n  ]' in result.stdout
        else "CULPRIT NOT NAMED",
    )
    result = subprocess.run(
        [*triage, "--fr", str(OUT)], capture_output=True, text=True, check=False
    )
    head = result.stdout.splitlines()[0] if result.stdout else result.stderr
    print(f"check: triage --fr says: {head}")


if __name__ == "__main__":
    main()
