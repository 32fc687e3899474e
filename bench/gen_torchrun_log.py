#!/usr/bin/env python3
"""Write a realistic synthetic torchrun log of a requested size, for benchmarks.

The log is what ``torchrun --nproc-per-node 8 --tee 3 train.py`` prints to a terminal or a
job's log file with ``NCCL_DEBUG=INFO``: the agent banner, every worker line behind its
``[defaultN]:`` tee prefix, per-rank Python warnings, libnccl INFO init blocks (bootstrap,
``Channel 00/24`` topology spam, ``Init COMPLETE``), a long training phase (tqdm bars redrawn
with carriage returns, HF-style loss dicts and logger lines, per-rank step metrics, now and
then a warning or a new communicator), a checkpoint save, and at the end a real failure: rank 3
hangs, the other 7 ranks' watchdogs time out (each rank in another PyTorch era's wording),
status lines, dump signals, tear-down, C++ stack frames, ``terminate called`` and the agent's
``ChildFailedError`` block.

Almost all of a large file is ordinary training output; NCCL lines are a small fraction, as in
a real run. The output is fully determined by ``--seed`` and ``--size``.

    python bench/gen_torchrun_log.py --size 1.2G --out bench/out/torchrun-1.2G.log
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

RANKS = 8
HUNG_RANK = 3  # the rank that never reaches the collective: the other 7 time out
HOST = "gpu-node-17"
PIDS = [48211 + 7 * r for r in range(RANKS)]
AGENT_PID = 48190
TIMEOUT_MS = 600000
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Read ``1.2G``, ``300M``, ``64K`` or a plain byte count (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    number = t[: len(t) - len(unit)] if unit else t
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value * _UNITS[unit])


class Clock:
    """Simulated wall clock; formats the timestamps of each logger family."""

    def __init__(self, start: float) -> None:
        self.t = start  # seconds since 2024-10-22 00:00:00 (a Tuesday)

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def _hms(self) -> tuple[int, int, int, int]:
        whole = int(self.t)
        frac_ns = int((self.t - whole) * 1e9)
        return (whole // 3600) % 24, (whole // 60) % 60, whole % 60, frac_ns

    def day(self) -> int:
        return 22 + int(self.t) // 86400

    def c10(self, level: str, jitter_ns: int = 0) -> str:
        """c10 MessageLogger header, 2.4+: ``E1022 10:11:12.123456789``."""
        h, m, s, ns = self._hms()
        return f"{level}10{self.day():02d} {h:02d}:{m:02d}:{s:02d}.{(ns + jitter_ns) % 10**9:09d}"

    def glog(self, level: str) -> str:
        """Python torch logging, 2.3+: ``W1022 10:11:12.123000``."""
        h, m, s, ns = self._hms()
        return f"{level}10{self.day():02d} {h:02d}:{m:02d}:{s:02d}.{ns // 1000:06d}"

    def py(self) -> str:
        """Python logging asctime: ``2024-10-22 10:11:12,123``."""
        h, m, s, ns = self._hms()
        return f"2024-10-{self.day():02d} {h:02d}:{m:02d}:{s:02d},{ns // 10**6:03d}"

    def tqdm(self, seconds: float) -> str:
        seconds = int(seconds)
        h, rem = divmod(seconds, 3600)
        m, s = divmod(rem, 60)
        return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def tee(rank: int) -> str:
    return f"[default{rank}]:"


def nccl(rank: int, tid: int, msg: str) -> str:
    return f"{tee(rank)}{HOST}:{PIDS[rank]}:{tid} [{rank}] NCCL INFO {msg}"


# ----------------------------------------------------------------------------- start-up


def agent_banner(clock: Clock) -> list[str]:
    w = clock.glog("W")
    head = f"{w} {AGENT_PID} site-packages/torch/distributed/run.py:793] "
    stars = "*" * 73
    return [
        f"{head}",
        f"{head}{stars}",
        (
            f"{head}Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
            "to avoid your system being overloaded, please further tune the variable for optimal "
            "performance in your application as needed. "
        ),
        f"{head}{stars}",
    ]


def worker_startup(rng: random.Random, clock: Clock) -> list[str]:
    lines: list[str] = []
    for r in range(RANKS):
        lines.append(
            f"{tee(r)}/opt/conda/lib/python3.11/site-packages/transformers/utils/hub.py:128: "
            "FutureWarning: Using `TRANSFORMERS_CACHE` is deprecated and will be removed in v5 "
            "of Transformers. Use `HF_HOME` instead."
        )
        lines.append(f"{tee(r)}  warnings.warn(")
    lines.extend(
        f"{tee(r)}[rank{r}]:[W Utils.hpp:164] Warning: Environment variable "
        "NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING "
        "instead (function operator())"
        for r in range(RANKS)
    )
    lines.append(
        f"{tee(0)}[INFO|configuration_utils.py:733] {clock.py()} >> loading configuration file "
        "/data/models/llama-3-8b/config.json"
    )
    lines.append(
        f"{tee(0)}[INFO|modeling_utils.py:3553] {clock.py()} >> loading weights file "
        "/data/models/llama-3-8b/model.safetensors.index.json"
    )
    lines.extend(
        f"{tee(r)}Loading checkpoint shards: 100%|██████████| 4/4 [00:0{rng.randint(3, 9)}"
        f"<00:00,  1.{rng.randint(10, 99)}s/it]"
        for r in rng.sample(range(RANKS), RANKS)
    )
    return lines


def nccl_init_block(
    rng: random.Random, comm_no: int, channels: int = 24, nranks: int = RANKS
) -> list[list[str]]:
    """libnccl's INFO lines for one communicator, per rank (to be interleaved by the caller)."""
    out: list[list[str]] = []
    comm_id = rng.getrandbits(64)
    for r in range(RANKS):
        pid = PIDS[r]
        tid = pid + 200 + comm_no * 3
        comm = 0x55D0C8000000 + rng.getrandbits(24) * 16
        ip = f"10.42.7.{17}"
        rl: list[str] = []
        if comm_no == 0:
            rl.append(nccl(r, pid, f"Bootstrap : Using bond0:{ip}<0>"))
            rl.append(nccl(r, pid, "NCCL_SOCKET_IFNAME set by environment to bond0"))
            rl.append(nccl(r, pid, "NET/Plugin: No plugin found (libnccl-net.so)"))
            rl.append(nccl(r, pid, "NET/Plugin: Using internal network plugin."))
            rl.append(nccl(r, pid, "cudaDriverVersion 12040"))
            if r == 0:
                rl.append(nccl(r, pid, "NCCL version 2.21.5+cuda12.4"))
            rl.append(nccl(r, tid, "NCCL_IB_HCA set by environment to mlx5_0,mlx5_1,mlx5_2,mlx5_3"))
            rl.append(
                nccl(
                    r,
                    tid,
                    "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB "
                    f"[RO]; OOB bond0:{ip}<0>",
                )
            )
        rl.append(nccl(r, tid, "Using non-device net plugin version 0"))
        rl.append(nccl(r, tid, "Using network IB"))
        rl.append(
            nccl(
                r,
                tid,
                f"ncclCommInitRank comm {comm:#x} rank {r} nranks {nranks} cudaDev {r} nvmlDev {r} "
                f"busId {0x18000 + 0x11000 * r:x} commId {comm_id:#x} - Init START",
            )
        )
        rl.append(nccl(r, tid, f"Setting affinity for GPU {r} to ffffffff,00000000,ffffffff"))
        rl.append(nccl(r, tid, f"NVLS multicast support is not available on dev {r}"))
        rl.append(
            nccl(
                r,
                tid,
                f"comm {comm:#x} rank {r} nRanks {nranks} nNodes 1 localRanks {nranks} "
                f"localRank {r} MNNVL 0",
            )
        )
        rl.append(nccl(r, tid, "NCCL_MIN_NCHANNELS set by environment to 16"))
        ring = "".join(f"{(i + r) % nranks:4d}" for i in range(nranks))
        if r == 0:
            rl.extend(nccl(r, tid, f"Channel {c:02d}/{channels} :{ring}") for c in range(channels))
        trees = " ".join(
            f"[{c}] {(r + 1) % nranks}/-1/-1->{r}->{(r - 1) % nranks}" for c in range(channels)
        )
        rl.append(nccl(r, tid, f"Trees {trees}"))
        rl.append(nccl(r, tid, "P2P Chunksize set to 524288"))
        nxt, prv = (r + 1) % nranks, (r - 1) % nranks
        rl.extend(
            nccl(r, tid, f"Channel {c:02d}/0 : {r}[{r}] -> {nxt}[{nxt}] via P2P/IPC/read")
            for c in range(channels)
        )
        rl.append(nccl(r, tid, "Connected all rings"))
        rl.extend(
            nccl(r, tid, f"Channel {c:02d}/0 : {r}[{r}] -> {prv}[{prv}] via P2P/IPC/read")
            for c in range(channels)
        )
        rl.append(nccl(r, tid, "Connected all trees"))
        rl.append(nccl(r, tid, "threadThresholds 8/8/64 | 64/8/64 | 512 | 512"))
        rl.append(
            nccl(
                r,
                tid,
                f"{channels} coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, "
                "32 p2p channels per peer",
            )
        )
        rl.append(
            nccl(
                r,
                tid,
                "TUNER/Plugin: Plugin load returned 11 : libnccl-tuner.so: cannot "
                "open shared object file: No such file or directory.",
            )
        )
        rl.append(
            nccl(
                r,
                tid,
                f"ncclCommInitRank comm {comm:#x} rank {r} nranks {nranks} cudaDev {r} nvmlDev {r} "
                f"busId {0x18000 + 0x11000 * r:x} commId {comm_id:#x} - Init COMPLETE",
            )
        )
        rl.append(
            nccl(
                r,
                tid,
                f"Init timings: rank {r} nranks {nranks} total {rng.uniform(0.3, 1.9):.2f} "
                f"(kernels 0.{rng.randint(10, 99)}, alloc 0.00, bootstrap 0.0{rng.randint(1, 9)}, "
                "allgathers 0.00, topo 0.03, graphs 0.00, connections 0.09, rest 0.00)",
            )
        )
        out.append(rl)
    return out


def interleave(rng: random.Random, per_rank: list[list[str]]) -> list[str]:
    """Merge per-rank line lists the way a tee'd console does: random order, each in sequence."""
    pos = [0] * len(per_rank)
    live = [i for i, lines in enumerate(per_rank) if lines]
    out: list[str] = []
    while live:
        i = rng.choice(live)
        burst = rng.randint(1, 6)
        lines = per_rank[i]
        out.extend(lines[pos[i] : pos[i] + burst])
        pos[i] += burst
        if pos[i] >= len(lines):
            live.remove(i)
    return out


# ----------------------------------------------------------------------------- training


class Training:
    """Emits the training phase step by step (state: step, clock, tqdm bar of rank 0)."""

    LOG_EVERY = 10
    EVAL_EVERY = 2000
    SAVE_AT = 5000

    def __init__(self, rng: random.Random, clock: Clock, total_steps: int) -> None:
        self.rng = rng
        self.clock = clock
        self.total = total_steps
        self.step = 0
        self.started = clock.t
        self.comms = 1  # communicators created so far (the default PG)
        self.seq = 0  # collectives enqueued on the default PG (allreduce per step)
        self.bar: list[str] = []

    def loss(self) -> float:
        s = self.step
        return 1.7 + 2.3 * math.exp(-s / 9000) + self.rng.gauss(0, 0.04)

    def tqdm(self) -> str:
        n, total = self.step, self.total
        frac = n / total
        filled = int(frac * 10)
        part = " ▏▎▍▌▋▊▉"[int((frac * 10 - filled) * 8)]
        bar = "█" * filled + (part if filled < 10 else "") + " " * max(0, 9 - filled)
        elapsed = self.clock.t - self.started
        rate = elapsed / n if n else 0.0
        remaining = rate * (total - n)
        return (
            f"{int(frac * 100):3d}%|{bar}| {n}/{total} [{self.clock.tqdm(elapsed)}<"
            f"{self.clock.tqdm(remaining)}, {rate:5.2f}s/it]"
        )

    def one_step(self) -> list[str]:
        rng = self.rng
        self.step += 1
        self.seq += 3  # grad allreduce buckets
        dt = rng.uniform(0.95, 1.15)
        self.clock.advance(dt)
        lines: list[str] = []
        loss = self.loss()
        py = self.clock.py()
        order = list(range(RANKS))
        rng.shuffle(order)
        for r in order:
            local = loss + rng.gauss(0, 0.02)
            lines.append(
                f"{tee(r)}[{py}][train.py:412][INFO] rank={r} step={self.step} "
                f"micro_batches=8 loss={local:.4f} tokens={rng.randint(31000, 32768)} "
                f"tok/s/gpu={rng.randint(2900, 3300)} tflops={rng.uniform(180, 205):.1f} "
                f"mem_alloc={rng.uniform(58, 63):.2f}GB mem_reserved=71.50GB"
            )
            if rng.random() < 0.004:
                lines.append(
                    f"{tee(r)}/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:1399: "
                    "FutureWarning: `torch.cpu.amp.autocast(args...)` is deprecated. Please use "
                    "`torch.amp.autocast('cpu', args...)` instead."
                )
                lines.append(
                    f"{tee(r)}  with device_autocast_ctx, torch.cpu.amp.autocast(**cpu_autocast_kwargs), "
                    "recompute_context:  # type: ignore[attr-defined]"
                )
        self.bar.append(self.tqdm())
        if self.step % self.LOG_EVERY == 0:
            lr = (
                3e-4
                * min(1.0, self.step / 2000)
                * (0.5 + 0.5 * math.cos(self.step / self.total * math.pi))
            )
            entry = (
                f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.2, 1.6):.16f}, "
                f"'learning_rate': {lr:.16e}, 'epoch': {self.step / 12000:.2f}}}"
            )
            lines.append(tee(0) + "".join("\r" + b for b in self.bar) + "\r" + entry)
            self.bar = []
        if rng.random() < 0.0015:
            r = rng.randrange(RANKS)
            lines.append(
                f"{tee(r)}[rank{r}]:{self.clock.c10('W')} "
                f"{'CUDAGuardImpl.h:119' if rng.random() < 0.5 else 'reducer.cpp:1400'}] Warning: "
                "Grad strides do not match bucket view strides. This may indicate grad was not "
                "created according to the gradient layout contract, or that the param's strides "
                "changed since DDP was constructed.  This is not an error, but may impair "
                "performance. (function operator())"
            )
        if self.step % self.EVAL_EVERY == 0:
            lines.extend(self.evaluate())
        if self.step == self.SAVE_AT:
            lines.extend(self.checkpoint())
        return lines

    def evaluate(self) -> list[str]:
        rng = self.rng
        lines = [tee(0) + "".join("\r" + b for b in self.bar)]
        self.bar = []
        lines.append(
            f"{tee(0)}[INFO|trainer.py:3819] {self.clock.py()} >> ***** Running Evaluation *****"
        )
        lines.append(f"{tee(0)}[INFO|trainer.py:3821] {self.clock.py()} >>   Num examples = 4096")
        lines.append(f"{tee(0)}[INFO|trainer.py:3824] {self.clock.py()} >>   Batch size = 8")
        if self.comms < 8 and rng.random() < 0.5:
            # the eval sub-group is created lazily: libnccl prints a fresh init block
            lines.extend(interleave(rng, nccl_init_block(rng, self.comms, channels=16)))
            self.comms += 1
        steps = 64
        bars = [
            f"{int(i / steps * 100):3d}%|{'█' * (i * 10 // steps):<10}| {i}/{steps} "
            f"[00:{i // 3:02d}<00:{(steps - i) // 3:02d},  3.1{rng.randint(0, 9)}it/s]"
            for i in range(steps + 1)
        ]
        lines.append(tee(0) + "".join("\r" + b for b in bars))
        self.clock.advance(22.0)
        lines.append(
            f"{tee(0)}{{'eval_loss': {self.loss() + 0.05:.4f}, 'eval_runtime': 21.{rng.randint(100, 999)}, "
            f"'eval_samples_per_second': 190.{rng.randint(10, 99)}, 'eval_steps_per_second': "
            f"2.9{rng.randint(0, 9)}, 'epoch': {self.step / 12000:.2f}}}"
        )
        return lines

    def checkpoint(self) -> list[str]:
        path = f"/scratch/runs/llama3-8b-sft/checkpoint-{self.step}"
        py = self.clock.py()
        lines = [
            f"{tee(0)}[INFO|trainer.py:3503] {py} >> Saving model checkpoint to {path}",
            f"{tee(0)}[INFO|configuration_utils.py:472] {py} >> Configuration saved in {path}/config.json",
            (
                f"{tee(0)}[INFO|configuration_utils.py:807] {py} >> Configuration saved in "
                f"{path}/generation_config.json"
            ),
        ]
        lines.extend(
            f"{tee(r)}[rank{r}]:{self.clock.c10('W', 1311 * r)} _state_dict_utils.py:827] "
            "Warning: ShardedTensor is deprecated for FSDP state dicts; use DTensor "
            "(function _get_state_dict)"
            for r in range(RANKS)
        )
        self.clock.advance(41.7)
        lines.append(
            f"{tee(0)}[INFO|modeling_utils.py:2698] {self.clock.py()} >> The model is bigger than "
            "the maximum size per checkpoint (5GB) and is going to be split in 4 checkpoint "
            f"shards. You can find where each parameters has been saved in the index located at "
            f"{path}/model.safetensors.index.json."
        )
        lines.append(
            f"{tee(0)}[INFO|tokenization_utils_base.py:2646] {self.clock.py()} >> tokenizer config "
            f"file saved in {path}/tokenizer_config.json"
        )
        lines.append(
            f"{tee(0)}[INFO|tokenization_utils_base.py:2655] {self.clock.py()} >> Special tokens "
            f"file saved in {path}/special_tokens_map.json"
        )
        return lines


# ----------------------------------------------------------------------------- the failure


_FRAMES_INNER = (
    (
        "c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, "
        "std::allocator<char> >) + 0x96 (0x7f3b9a2c3446 in {lib}/libc10.so)"
    ),
    (
        "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        "std::ratio<1l, 1000l> > >) + 0x282 (0x7f3b4ea4e772 in {lib}/libtorch_cuda.so)"
    ),
    "c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f3b4ea551b3 in {lib}/libtorch_cuda.so)",
    "c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7f3b4ea56b9d in {lib}/libtorch_cuda.so)",
    "<unknown function> + 0xdbbf4 (0x7f3b99a9fbf4 in /opt/conda/lib/libstdc++.so.6)",
    "<unknown function> + 0x94ac3 (0x7f3b9b694ac3 in /lib/x86_64-linux-gnu/libc.so.6)",
    "clone + 0x44 (0x7f3b9b725a04 in /lib/x86_64-linux-gnu/libc.so.6)",
)
_FRAMES_OUTER = (
    (
        "c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, "
        "std::allocator<char> >) + 0x96 (0x7f3b9a2c3446 in {lib}/libc10.so)"
    ),
    "<unknown function> + 0xe5aa84 (0x7f3b4e6d0a84 in {lib}/libtorch_cuda.so)",
    "<unknown function> + 0xdbbf4 (0x7f3b99a9fbf4 in /opt/conda/lib/libstdc++.so.6)",
    "<unknown function> + 0x94ac3 (0x7f3b9b694ac3 in /lib/x86_64-linux-gnu/libc.so.6)",
    "clone + 0x44 (0x7f3b9b725a04 in /lib/x86_64-linux-gnu/libc.so.6)",
)
_LIB = "/opt/conda/lib/python3.11/site-packages/torch/lib"
_OP = "ALLREDUCE"
_NUMEL = 262668288


def _work(seq: int) -> str:
    return (
        f"WorkNCCL(SeqNum={seq}, OpType={_OP}, NumelIn={_NUMEL}, NumelOut={_NUMEL}, "
        f"Timeout(ms)={TIMEOUT_MS})"
    )


def failing_rank(r: int, seq: int, clock: Clock, rng: random.Random) -> list[str]:
    """Everything one timed-out rank prints, in the wording of one PyTorch era (by rank)."""
    p = tee(r)
    ran = TIMEOUT_MS + rng.randint(5, 95)
    caught = f"[Rank {r}] Watchdog caught collective operation timeout: {_work(seq)} ran for {ran} milliseconds before timing out."
    era = ["2.1", "2.2", "2.3", None, "2.4", "2.5", "2.6", "2.8-blocking"][r]
    ts = clock.c10("E", rng.randint(0, 10**6))
    lines: list[str] = []
    if era == "2.1":
        lines += [
            f"{p}[E ProcessGroupNCCL.cpp:475] {caught}",
            (
                f"{p}[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to the "
                "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[E ProcessGroupNCCL.cpp:916] [Rank {r}] NCCL watchdog thread terminated with exception: {caught}",
        ]
        pg = f"[Rank {r}]"
        thread = f"{pg} NCCL watchdog thread terminated with exception: {caught}"
    elif era == "2.2":
        lines += [
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:523] {caught}",
            (
                f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to "
                "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:1182] [Rank {r}] NCCL watchdog thread terminated with exception: {caught}",
        ]
        thread = f"[Rank {r}] NCCL watchdog thread terminated with exception: {caught}"
    elif era == "2.3":
        pg = f"[PG 0 Rank {r}]"
        lines += [
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:563] {caught}",
            (
                f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:1537] {pg} Timeout at NCCL work: {seq}, last enqueued "
                f"NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}."
            ),
            (
                f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:577] [Rank {r}] Some NCCL operations have failed or timed out. "
                "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:583] [Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[rank{r}]:[E ProcessGroupNCCL.cpp:1414] {pg} Process group watchdog thread terminated with exception: {caught}",
        ]
        thread = f"{pg} Process group watchdog thread terminated with exception: {caught}"
    elif era == "2.4":
        pg = f"[PG 0 (default_pg) Rank {r}]"
        lines += [
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:607] {caught}",
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1664] {pg} Exception (either an error or timeout) detected "
                f"by watchdog at work: {seq}, last enqueued NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}."
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1709] {pg} Timeout at NCCL work: {seq}, last enqueued "
                f"NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}."
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:621] [Rank {r}] Some NCCL operations have failed or timed out. "
                "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:627] [Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1515] {pg} Process group watchdog thread terminated with exception: {caught}",
        ]
        thread = f"{pg} Process group watchdog thread terminated with exception: {caught}"
    elif era == "2.5":
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        lines += [
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:616] {caught}",
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1785] {pg} Exception (either an error or timeout) detected "
                f"by watchdog at work: {seq}, last enqueued NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}."
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1834] {pg} Timeout at NCCL work: {seq}, last enqueued "
                f"NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}."
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1599] {pg} Received a dump signal due to a collective "
                f"timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL "
                f"work: {seq + 2}, last completed NCCL work: {seq - 1}.This is most likely caused by incorrect usages "
                "of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all "
                "ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by "
                "GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. "
                "NCCL), etc. "
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1533] {pg} ProcessGroupNCCL preparing to dump debug info. "
                "Include stack trace: 1"
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:630] [Rank {r}] Some NCCL operations have failed or timed out. "
                "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:636] [Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1595] {pg} Process group watchdog thread terminated with exception: {caught}",
        ]
        thread = f"{pg} Process group watchdog thread terminated with exception: {caught}"
    elif era == "2.6":
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        lines += [
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:629] {caught}",
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:2168] {pg}  failure detected by watchdog at work sequence "
                f"id: {seq} PG status: last enqueued work: {seq + 2}, last completed work: {seq - 1}"
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:667] Stack trace of the failed collective not found, "
                "potentially because FlightRecorder is disabled. You can enable it by setting "
                "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."
            ),
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:684] [Rank {r}] Some NCCL operations have failed or timed out. "
                "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."
            ),
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:698] [Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:1899] {pg} Process group watchdog thread terminated with exception: {caught}",
        ]
        thread = f"{pg} Process group watchdog thread terminated with exception: {caught}"
    else:  # 2.8+, TORCH_NCCL_BLOCKING_WAIT=1 on this rank: the main thread raises
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        lines += [
            f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:888] [Rank {r}] Work {_work(seq)} timed out in blocking wait.",
            (
                f"{p}[rank{r}]:[{ts} ProcessGroupNCCL.cpp:2395] {pg}  failure detected by watchdog at work sequence "
                f"id: {seq} PG status: last enqueued work: {seq + 2}, last completed work: {seq - 1}"
            ),
            f"{p}[rank{r}]: Traceback (most recent call last):",
            f'{p}[rank{r}]:   File "/workspace/train.py", line 655, in <module>',
            f"{p}[rank{r}]:     main()",
            f'{p}[rank{r}]:   File "/workspace/train.py", line 431, in train_step',
            f"{p}[rank{r}]:     dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)",
            f"{p}[rank{r}]: torch.distributed.DistBackendError: [Rank {r}] Work {_work(seq)} timed out in blocking wait.",
        ]
        return lines
    frames_inner = [f"{p}frame #{i}: {f.format(lib=_LIB)}" for i, f in enumerate(_FRAMES_INNER)]
    frames_outer = [f"{p}frame #{i}: {f.format(lib=_LIB)}" for i, f in enumerate(_FRAMES_OUTER)]
    lines.append(
        f"{p}Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:618 (most recent call first):"
    )
    lines += frames_inner
    lines.append(p)
    lines.append(f"{p}terminate called after throwing an instance of 'c10::DistBackendError'")
    lines.append(f"{p}  what():  {thread}")
    lines.append(
        f"{p}Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:618 (most recent call first):"
    )
    lines += frames_inner
    lines.append(p)
    lines.append(
        f"{p}Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1601 (most recent call first):"
    )
    lines += frames_outer
    lines.append(p)
    return lines


def failure(rng: random.Random, clock: Clock, seq: int, training: Training) -> list[str]:
    lines: list[str] = []
    # the last steps: rank 3 stops printing (stuck in its data loader), the others block
    lines.append(
        f"{tee(HUNG_RANK)}[{clock.py()}][data.py:88][WARNING] rank={HUNG_RANK} shard "
        "/data/shards/train-00731-of-01024.parquet: read stalled, retrying (attempt 1/5)"
    )
    lines.append(tee(0) + "".join("\r" + b for b in training.bar) + "\r" + training.tqdm())
    clock.advance(TIMEOUT_MS / 1000)
    per_rank = [failing_rank(r, seq, clock, rng) if r != HUNG_RANK else [] for r in range(RANKS)]
    lines.extend(interleave(rng, per_rank))
    # the hung rank is told to dump by the store, then its own heartbeat monitor gives up
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {HUNG_RANK}]"
    h = f"{tee(HUNG_RANK)}[rank{HUNG_RANK}]:"
    lines += [
        (
            f"{h}[{clock.c10('E', 77)} ProcessGroupNCCL.cpp:1599] {pg} Received a dump signal due to a "
            f"collective timeout from  rank 5 and we will try our best to dump the debug info. Last enqueued "
            f"NCCL work: {seq - 1}, last completed NCCL work: {seq - 1}.This is most likely caused by incorrect "
            "usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same "
            "for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be "
            "caused by GIL deadlock or other reasons such as network errors or bugs in the communications "
            "library (e.g. NCCL), etc. "
        ),
        (
            f"{h}[{clock.c10('E', 91)} ProcessGroupNCCL.cpp:1533] {pg} ProcessGroupNCCL preparing to dump "
            "debug info. Include stack trace: 1"
        ),
    ]
    clock.advance(1.4)
    # agent: one worker died of SIGABRT, the others are terminated
    e = clock.glog("E")
    w = clock.glog("W")
    api = f"{AGENT_PID} site-packages/torch/distributed/elastic/multiprocessing/api.py"
    for r in range(RANKS):
        if r != 1:
            lines.append(f"{w} {api}:897] Sending process {PIDS[r]} closing signal SIGTERM")
    lines.append(
        f"{e} {api}:869] failed (exitcode: -6) local_rank: 1 (pid: {PIDS[1]}) of binary: "
        "/opt/conda/bin/python3.11"
    )
    lines += [
        "Traceback (most recent call last):",
        '  File "/opt/conda/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "             ^^^^^^",
        (
            '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/'
            'errors/__init__.py", line 355, in wrapper'
        ),
        "    return f(*args, **kwargs)",
        "           ^^^^^^^^^^^^^^^^^^",
        '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 919, in main',
        "    run(args)",
        '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 910, in run',
        "    elastic_launch(",
        (
            '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 138, '
            "in __call__"
        ),
        "    return launch_agent(self._config, self._entrypoint, list(args))",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        (
            '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 269, '
            "in launch_agent"
        ),
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
    ]
    when = f"2024-10-{clock.day():02d}_{clock.glog('E')[6:14]}"
    others = [r for r in range(RANKS) if r not in (1,)]
    for i, r in enumerate(others, start=1):
        code = -15 if r == HUNG_RANK else -6
        sig = "SIGTERM" if code == -15 else "SIGABRT"
        lines += [
            f"[{i}]:",
            f"  time      : {when}",
            f"  host      : {HOST}.cluster.internal",
            f"  rank      : {r} (local_rank: {r})",
            f"  exitcode  : {code} (pid: {PIDS[r]})",
            "  error_file: <N/A>",
            f"  traceback : Signal {-code} ({sig}) received by PID {PIDS[r]}",
        ]
    lines += [
        "-" * 60,
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {when}",
        f"  host      : {HOST}.cluster.internal",
        "  rank      : 1 (local_rank: 1)",
        f"  exitcode  : -6 (pid: {PIDS[1]})",
        "  error_file: <N/A>",
        f"  traceback : Signal 6 (SIGABRT) received by PID {PIDS[1]}",
        "=" * 60,
    ]
    return lines


# ----------------------------------------------------------------------------- driver


def generate(size: int, seed: int) -> Iterator[str]:
    """Yield blocks of text (whole lines) adding up to about ``size`` bytes."""
    rng = random.Random(seed)
    clock = Clock(10 * 3600 + 7 * 60 + rng.random())
    # about 1.45 KB of output per training step
    steps = max(50, size // 1450)
    head = agent_banner(clock) + worker_startup(rng, clock)
    head += interleave(rng, nccl_init_block(rng, 0))
    head.append(f"{tee(0)}[INFO|trainer.py:2128] {clock.py()} >> ***** Running training *****")
    head.append(f"{tee(0)}[INFO|trainer.py:2129] {clock.py()} >>   Num examples = 1,536,000")
    head.append(
        f"{tee(0)}[INFO|trainer.py:2134] {clock.py()} >>   Total optimization steps = {steps:,}"
    )
    text = "\n".join(head) + "\n"
    written = len(text.encode())
    yield text
    training = Training(rng, clock, steps)
    tail_budget = 64 << 10  # the failure block is ~40 KB
    block: list[str] = []
    block_bytes = 0
    while written + block_bytes < size - tail_budget and training.step < steps - 1:
        for line in training.one_step():
            block.append(line)
            block_bytes += len(line) + 1  # ASCII except bars; fixed up on flush
        if block_bytes >= 1 << 20:
            text = "\n".join(block) + "\n"
            written += len(text.encode())
            yield text
            block, block_bytes = [], 0
    if block:
        text = "\n".join(block) + "\n"
        written += len(text.encode())
        yield text
    yield "\n".join(failure(rng, clock, training.seq + 1, training)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size",
        type=parse_size,
        default=parse_size("64M"),
        help="approximate output size, e.g. 300M, 1.2G (binary units; default 64M)",
    )
    ap.add_argument("--out", default="-", help="output path, - for stdout (default)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)
    if args.out == "-":
        sink = sys.stdout.buffer
        for text in generate(args.size, args.seed):
            sink.write(text.encode())
        sink.flush()
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh:
        for text in generate(args.size, args.seed):
            fh.write(text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
