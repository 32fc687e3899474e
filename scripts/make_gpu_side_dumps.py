"""Write synthetic flight-recorder dumps of a GPU-side hang, for rule examples and tests.

Input: an output folder. Output: ``<out>/nccl_trace_rank_{0..3}``: four pickles shaped as
ProcessGroupNCCL's ``_dump_nccl_trace`` writes them (version 2.10, ``pg_config``,
``pg_status``, ``entries`` with stack frames). What they show: every rank enqueued
``all_reduce`` #7 of the default group; ranks 0-2 finished it (their CUDA events completed),
rank 3's device never did; all four then enqueued #8, which nobody finished.

These are synthetic. ``scripts/make_fr_dumps.py`` makes real dumps with PyTorch's gloo
flight recorder, but gloo cannot show this case: a gloo collective finishes on every member
or on none, while NCCL's kernels finish on the healthy ranks and the faulty device's
completion event never fires (as in the GPU-fault dumps of nvidia-resiliency-ext). The
records follow the layout of the real gloo dumps of ``tests/data/fr``, with NCCL's names.

    python scripts/make_gpu_side_dumps.py fixtures/fr/gpu_incomplete
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

WORLD = 4
STUCK = 3  # the rank whose device never finishes all_reduce #STUCK_SEQ
STUCK_SEQ = 7
LAST_SEQ = 8
NUMEL = 25_165_824  # a 48 MiB bf16 gradient bucket
TORCH = "/usr/local/lib/python3.11/dist-packages/torch/distributed"


def frames() -> list[dict[str, Any]]:
    """The stack of a gradient all-reduce, innermost first, as the recorder captures it."""
    stack = [
        ("all_reduce", f"{TORCH}/distributed_c10d.py", 2806),
        ("wrapper", f"{TORCH}/c10d_logger.py", 83),
        ("reduce_gradients", "/workspace/train.py", 142),
        ("train_step", "/workspace/train.py", 171),
        ("main", "/workspace/train.py", 230),
        ("<module>", "/workspace/train.py", 241),
    ]
    return [{"name": n, "filename": f, "line": line} for n, f, line in stack]


def entry(rank: int, seq: int, stack: list[dict[str, Any]]) -> dict[str, Any]:
    """One all_reduce record of ``rank``; finished unless the stuck rank's device held it."""
    created = 1_795_461_141_000_000_000 + seq * 350_000_000 + rank * 1_000
    done = seq < STUCK_SEQ or (seq == STUCK_SEQ and rank != STUCK)
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": created,
        "input_sizes": [[NUMEL]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[NUMEL]],
        "output_dtypes": ["BFloat16"],
        "state": "completed" if done else "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": created + 90_000_000 if done else None,
        "retired": done,
        "timeout_ms": 600_000,
        "is_p2p": False,
        "frames": stack,
        "thread_id": "140038476557184",
        "thread_name": "python",
    }


def dump(rank: int) -> dict[str, Any]:
    """The whole dump of one rank."""
    stack = frames()
    completed = STUCK_SEQ - 1 if rank == STUCK else STUCK_SEQ
    return {
        "version": "2.10",
        "nccl_version": "2.27.5",
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(WORLD)))},
        },
        "pg_status": {
            "0": {
                "last_enqueued_collective": LAST_SEQ,
                "last_started_collective": -1,
                "last_completed_collective": completed,
            }
        },
        "entries": [entry(rank, seq, stack) for seq in range(1, LAST_SEQ + 1)],
        "rank": rank,
    }


def main() -> None:
    """Write the four dumps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        (args.out / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump(rank), protocol=2))
    print(f"{args.out}: {WORLD} dumps; rank {STUCK}'s device never finished #{STUCK_SEQ}")


if __name__ == "__main__":
    main()
