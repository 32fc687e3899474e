#!/usr/bin/env python3
"""Write an archive of synthetic failed (and clean) distributed jobs, for ``batch`` benchmarks.

Every job is one torchrun run of 2 to 8 ranks with a known cause, drawn from a fixed mix
(``MIX``): training output on every rank (loss lines, NCCL INFO init lines naming the host),
then what the cause looks like in a real log (a checkpoint save, an out-of-memory, generate()
under ZeRO-3, a wrong interface, an InfiniBand error, mismatched collectives, a tokenizer on
one rank, an ECC error, a too-short timeout, a lone timeout) and the watchdog timeouts of the
ranks that waited. Jobs are written in three layouts, as archives hold them:

* 60% one file per job (``single/job-NNNNN.log``, a quarter of them gzipped), every rank's
  lines behind torchrun's ``[defaultN]:`` prefix;
* 25% torchrun ``--log-dir`` trees (``torchrun/<run>/attempt_0/<rank>/stderr.log``);
* 15% Slurm per-task files (``slurm/train-<jobid>-<task>.out``).

``manifest.csv`` lists each job as ``batch`` names it (relative to the archive) with its cause
and layout, so a benchmark can check the table. The output is fully determined by ``--seed``.

    python bench/gen_jobs.py --jobs 10000 --out bench/out/jobs
"""

from __future__ import annotations

import argparse
import csv
import gzip
import random
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

Line = tuple[int | None, str]  # (rank, text): None for lines no rank prints in particular

MIX = {  # cause -> share of jobs
    "slow_checkpoint_save": 0.20,
    "oom_hidden": 0.15,
    "unknown": 0.12,
    "none": 0.12,
    "rank_desync_or_mismatched_collective": 0.08,
    "network_interface_misconfig": 0.07,
    "network_fabric_failure": 0.07,
    "generate_zero3": 0.06,
    "straggler_or_slow_rank": 0.05,
    "hardware_gpu_fault": 0.04,
    "timeout_too_short": 0.04,
}
HOSTS = [f"gpu-node-{i:03d}" for i in range(64)]
BAD_HOSTS = {"network_fabric_failure": "gpu-node-017", "hardware_gpu_fault": "gpu-node-042"}
START = datetime(2025, 3, 1)


class Job:
    """What one synthetic job prints, rank by rank."""

    def __init__(self, rng: random.Random, index: int, filler: int, cause: str) -> None:
        self.rng = rng
        self.world = rng.choice([2, 4, 4, 8, 8])
        self.hosts = [rng.choice(HOSTS)]
        if self.world == 8 and rng.random() < 0.5:
            self.hosts.append(rng.choice(HOSTS))
        if cause in BAD_HOSTS:  # the faulty node is the last rank's
            self.hosts[-1] = BAD_HOSTS[cause]
        self.when = START + timedelta(minutes=index * 13 + rng.randrange(10))
        self.seq = rng.randrange(50, 200_000)
        self.filler = filler
        self.lines: list[Line] = []

    def host(self, rank: int) -> str:
        return self.hosts[rank * len(self.hosts) // self.world]

    def clock(self, minutes: float = 0.0) -> str:
        t = self.when + timedelta(minutes=minutes)
        return t.strftime("%m%d %H:%M:%S") + f".{self.rng.randrange(10**9):09d}"

    def start(self) -> None:
        stamp = self.when.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        self.lines.append(
            (
                None,
                (
                    f"[{stamp}] torch.distributed.run: [WARNING] Setting OMP_NUM_THREADS environment "
                    "variable for each process to be 1 in default"
                ),
            )
        )
        for r in range(self.world):
            pid = 4000 + 7 * r
            self.lines.append(
                (r, f"{self.host(r)}:{pid}:{pid} [{r % 8}] NCCL INFO NCCL version 2.21.5+cuda12.4")
            )
            self.lines.append(
                (
                    r,
                    (
                        f"{self.host(r)}:{pid}:{pid + 90} [{r % 8}] NCCL INFO comm 0x55d1c0a2b0 rank {r} "
                        f"nranks {self.world} cudaDev {r % 8} nvmlDev {r % 8} busId 18000 commId 0x9a3c41e7 - Init COMPLETE"
                    ),
                )
            )
        for step in range(self.filler):
            r = step % self.world
            loss = 2.0 * 0.999**step + self.rng.random() * 0.05
            self.lines.append(
                (
                    r,
                    f"{{'loss': {loss:.4f}, 'grad_norm': {self.rng.random():.3f}, 'epoch': {step / 1000:.3f}}}",
                )
            )

    def timeout(
        self,
        rank: int,
        op: str = "ALLREDUCE",
        numel: int = 4194304,
        timeout_ms: int = 600000,
        seq: int | None = None,
    ) -> None:
        s = self.seq if seq is None else seq
        self.lines.append(
            (
                rank,
                (
                    f"[rank{rank}]:[E{self.clock(timeout_ms / 60000)} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
                    f"caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType={op}, NumelIn={numel}, "
                    f"NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {timeout_ms + self.rng.randrange(30, 200)} "
                    "milliseconds before timing out."
                ),
            )
        )

    def others_time_out(self, culprit: int, **kw: object) -> None:
        for r in range(self.world):
            if r != culprit:
                self.timeout(r, **kw)  # type: ignore[arg-type]


def slow_checkpoint_save(j: Job) -> None:
    stamp = j.when.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    j.lines.append(
        (
            0,
            f"[INFO|trainer.py:3478] {stamp} >> Saving model checkpoint to /ckpt/run/checkpoint-{j.seq // 100}",
        )
    )
    j.others_time_out(0, op="_ALLGATHER_BASE", numel=117440512, timeout_ms=1800000)


def oom_hidden(j: Job) -> None:
    r = j.rng.randrange(j.world)
    j.lines.append(
        (
            r,
            (
                f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {r % 8} "
                "has a total capacity of 79.14 GiB of which 2.17 GiB is free."
            ),
        )
    )
    j.others_time_out(r)


def unknown(j: Job) -> None:
    j.timeout(j.rng.randrange(j.world), timeout_ms=1800000)


def none(j: Job) -> None:
    j.lines.append((0, "{'train_runtime': 51234.1, 'train_loss': 0.9321, 'epoch': 3.0}"))


def rank_desync(j: Job) -> None:
    j.timeout(j.world - 1, op="BROADCAST", numel=5056)
    j.timeout(0, op="ALLREDUCE", numel=2106881)


def interface_misconfig(j: Job) -> None:
    r = 0
    j.lines.append(
        (
            r,
            (
                f"[rank{r}]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
                "c10d/ProcessGroupNCCL.cpp:2588, internal error - please report this issue to the NCCL developers, "
                "NCCL version 2.21.5"
            ),
        )
    )
    j.lines.append((r, f"[rank{r}]: ncclInternalError: Internal check failed."))
    j.lines.append((r, f"[rank{r}]: Last error:"))
    j.lines.append((r, f"[rank{r}]: Bootstrap : no socket interface found"))


def fabric_failure(j: Job) -> None:
    r = j.world - 1
    j.lines.append(
        (
            r,
            (
                f"{j.host(r)}:88121:88452 [{r % 8}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
                "from peer 10.10.0.12<43521> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
            ),
        )
    )
    j.timeout(r, numel=16777216)


def generate_zero3(j: Job) -> None:
    j.lines.append((0, '[rank0]:   File "/app/infer.py", line 88, in main'))
    j.lines.append((0, "[rank0]:     outputs = model.generate(**batch, max_new_tokens=512)"))
    j.timeout(j.world - 1, op="_ALLGATHER_BASE", numel=58720256, timeout_ms=43200000)


def straggler(j: Job) -> None:
    j.lines.append(
        (
            0,
            "Running tokenizer on dataset:  47%|████▋     | 3169000/6811963 [30:11<38:27, 1578.58 examples/s]",
        )
    )
    j.lines.append(
        (
            1,
            (
                "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
                "key-value store by key '0', but store->get('0') got error: Socket Timeout"
            ),
        )
    )


def gpu_fault(j: Job) -> None:
    r = j.world - 1
    j.lines.append(
        (
            r,
            (
                f"[rank{r}]:[E{j.clock(3)} ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
                "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered"
            ),
        )
    )


def timeout_too_short(j: Job) -> None:
    j.lines.append(
        (
            0,
            (
                "[E ProcessGroupNCCL.cpp:464] [Rank 0] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=10000) ran for 10917 milliseconds before timing out."
            ),
        )
    )


SCENARIOS: dict[str, Callable[[Job], None]] = {
    "slow_checkpoint_save": slow_checkpoint_save,
    "oom_hidden": oom_hidden,
    "unknown": unknown,
    "none": none,
    "rank_desync_or_mismatched_collective": rank_desync,
    "network_interface_misconfig": interface_misconfig,
    "network_fabric_failure": fabric_failure,
    "generate_zero3": generate_zero3,
    "straggler_or_slow_rank": straggler,
    "hardware_gpu_fault": gpu_fault,
    "timeout_too_short": timeout_too_short,
}


def write_job(root: Path, index: int, job: Job, layout: str, rng: random.Random) -> str:
    """Write a job's files in a layout; return the job's name as ``batch`` gives it."""
    if layout == "single":
        text = "".join(
            (f"[default{r}]:{t}\n" if r is not None else t + "\n") for r, t in job.lines
        ).encode()
        path = root / "single" / f"job-{index:05d}.log"
        if rng.random() < 0.25:
            path = path.with_suffix(".log.gz")
            text = gzip.compress(text, compresslevel=6, mtime=0)
        path.write_bytes(text)
        return path.relative_to(root).as_posix()
    per_rank: dict[int, list[str]] = {r: [] for r in range(job.world)}
    for r, t in job.lines:
        per_rank[0 if r is None else r].append(t + "\n")
    if layout == "torchrun":
        run = root / "torchrun" / f"run{index:05d}_{rng.randrange(16**6):06x}" / "attempt_0"
        for r, lines in per_rank.items():
            (run / str(r)).mkdir(parents=True)
            (run / str(r) / "stderr.log").write_text("".join(lines), encoding="utf-8")
        return run.relative_to(root).as_posix()
    jobid = 3_000_000 + index
    for r, lines in per_rank.items():
        (root / "slurm" / f"train-{jobid}-{r}.out").write_text("".join(lines), encoding="utf-8")
    return f"slurm/train-{jobid}"


def generate(root: Path, jobs: int, seed: int, filler: int) -> dict[str, int]:
    """Write ``jobs`` jobs under ``root`` (replacing it) and their manifest; count the causes."""
    rng = random.Random(seed)
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("single", "torchrun", "slurm"):
        (root / sub).mkdir(parents=True)
    causes = list(MIX)
    weights = [MIX[c] for c in causes]
    counts: dict[str, int] = dict.fromkeys(causes, 0)
    with (root / "manifest.csv").open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["job", "layout", "cause"])
        for i in range(jobs):
            cause = rng.choices(causes, weights)[0]
            job = Job(rng, i, rng.randrange(filler // 2, filler * 3 // 2 + 1), cause)
            job.start()
            SCENARIOS[cause](job)
            layout = rng.choices(["single", "torchrun", "slurm"], [0.60, 0.25, 0.15])[0]
            out.writerow([write_job(root, i, job, layout, rng), layout, cause])
            counts[cause] += 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("bench/out/jobs"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--lines", type=int, default=120, help="training lines per job, on average")
    args = ap.parse_args()
    counts = generate(args.out, args.jobs, args.seed, args.lines)
    files = sum(1 for p in args.out.rglob("*") if p.is_file()) - 1
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.jobs} jobs, {files} files, {size / 2**20:.1f} MiB in {args.out}")
    for cause, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {cause:<38} {n:>6}")


if __name__ == "__main__":
    main()
