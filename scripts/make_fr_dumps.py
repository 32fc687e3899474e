"""Make real flight-recorder dumps of hung jobs with PyTorch's gloo backend, for the tests.

Input: a Python with torch installed (NOT the project's venv; e.g.
``python3 -m venv /work/frvenv && /work/frvenv/bin/pip install torch==2.13.0``) and an output
folder. Output: ``<out>/<scenario>/`` with one dump per rank and ``expected.json`` (what the
scenario did: the culprit ranks, the side, the stuck collective, the function it was in), and,
with ``--compare``, ``fr_trace.txt``: what PyTorch's own analyser says about the same dumps.

Each scenario runs four CPU processes on gloo with the flight recorder on
(``TORCH_FR_BUFFER_SIZE``). Gloo does not dump on timeout by itself, so each rank runs a small
watchdog thread, as ProcessGroupNCCL does: when its rank has made no progress for
``--hang-seconds`` it raises the dump signal (a file in the output folder, where NCCL uses the
store), and every rank's watchdog then writes its dump with
``torch._C._distributed_c10d._dump_fr_trace()`` (or ``_dump_fr_trace_json()``) while the stuck
collectives are still in flight, and exits. The process-group timeout is far longer than the
hang, so nothing is aborted before the dump.

    /work/frvenv/bin/python scripts/make_fr_dumps.py tests/data/fr --compare
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

WORLD = 4
BUFFER_ENTRIES = 2000
STEPS = 4


@dataclass(frozen=True)
class Scenario:
    """One hang to reproduce and what the analysis should find in its dumps."""

    name: str
    file_name: str  # per-rank dump name, ``{rank}`` filled in
    json: bool
    culprit_ranks: tuple[int, ...]
    side: str
    kind: str
    stuck_pg: str
    stuck_op: str
    stuck_seq: int
    frame_function: str | None
    story: str


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            name="skip_collective",
            file_name="nccl_trace_rank_{rank}",
            json=False,
            culprit_ranks=(2,),
            side="cpu",
            kind="missing",
            stuck_pg="0",
            stuck_op="all_reduce",
            stuck_seq=STEPS + 1,
            frame_function="train_step",
            story="rank 2's data shard is one batch short: it leaves the training loop and "
            "evaluates while the others wait in the next gradient all_reduce",
        ),
        Scenario(
            name="op_mismatch",
            file_name="_dump_{rank}",
            json=False,
            culprit_ranks=(1,),
            side="cpu",
            kind="mismatch",
            stuck_pg="0",
            stuck_op="all_reduce",
            stuck_seq=STEPS,
            frame_function="sync_metrics",
            story="on the last step rank 1 takes another code path and broadcasts its metrics "
            "where the others all_reduce them",
        ),
        Scenario(
            name="size_mismatch",
            file_name="fr_dump_{rank}.json",
            json=True,
            culprit_ranks=(3,),
            side="cpu",
            kind="mismatch",
            stuck_pg="0",
            stuck_op="all_reduce",
            stuck_seq=STEPS,
            frame_function=None,  # JSON dumps carry no stack frames
            story="rank 3 pads its embedding gradient differently and all_reduces 12 elements "
            "where the others send 8 (JSON dumps)",
        ),
        Scenario(
            name="python_stall",
            file_name="rank{rank}.pkl",
            json=False,
            culprit_ranks=(0,),
            side="cpu",
            kind="missing",
            stuck_pg="0",
            stuck_op="all_reduce",
            stuck_seq=2 * STEPS + 1,
            frame_function="save_checkpoint",
            story="rank 0 agrees the checkpoint step with a broadcast, then writes the "
            "checkpoint for a long time (time.sleep) while the others go on to train",
        ),
        Scenario(
            name="two_groups",
            file_name="trace_{rank}",
            json=False,
            culprit_ranks=(3,),
            side="cpu",
            kind="missing",
            stuck_pg="2",
            stuck_op="all_reduce",
            stuck_seq=STEPS + 1,
            frame_function="train_step",
            story="two tensor-parallel groups [0,1] and [2,3] under the world group: rank 3 "
            "stalls loading its batch; rank 2 waits for it in their group, and ranks 0 and 1 "
            "wait for 2 and 3 in the world all_reduce",
        ),
    )
}


class Watchdog:
    """Dump this rank's flight recorder when the job stops making progress, then exit."""

    def __init__(self, rank: int, scenario: Scenario, out: Path, hang_seconds: float) -> None:
        self.rank = rank
        self.scenario = scenario
        self.out = out
        self.hang_seconds = hang_seconds
        self.signal = out / ".dump_signal"
        self.last_beat = time.monotonic()

    def beat(self) -> None:
        """Record that this rank made progress."""
        self.last_beat = time.monotonic()

    def start(self) -> None:
        """Start the watchdog thread (a daemon: it never keeps the process alive)."""
        threading.Thread(target=self._run, name="fr-watchdog", daemon=True).start()

    def _run(self) -> None:
        import torch

        while True:
            time.sleep(0.05)
            if time.monotonic() - self.last_beat > self.hang_seconds:
                self.signal.touch()
            if self.signal.exists():
                break
        c10d = torch._C._distributed_c10d
        data = c10d._dump_fr_trace_json() if self.scenario.json else c10d._dump_fr_trace()
        path = self.out / self.scenario.file_name.format(rank=self.rank)
        path.write_bytes(data)
        print(f"rank {self.rank}: wrote {path} ({len(data)} bytes)", flush=True)
        # Stay alive until every rank has dumped: a rank that exits closes its gloo
        # connections, and the others' in-flight collectives would then fail before their dump.
        (self.out / f".dumped_{self.rank}").touch()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(list(self.out.glob(".dumped_*"))) < WORLD:
            time.sleep(0.05)
        os._exit(0)


def train_step(step: int, watchdog: Watchdog) -> None:
    """One training step: compute, then all_reduce the gradients."""
    import torch
    import torch.distributed as dist

    grads = torch.full((8,), float(step))
    dist.all_reduce(grads)
    watchdog.beat()


def evaluate(watchdog: Watchdog) -> None:
    """Evaluate on this rank's data alone (CPU work, no collective)."""
    time.sleep(3600)


def run_skip_collective(rank: int, watchdog: Watchdog) -> None:
    """Rank 2 has one batch fewer; it goes to evaluation while the others keep training."""
    batches = STEPS if rank == 2 else STEPS + 1
    for step in range(batches):
        train_step(step, watchdog)
    evaluate(watchdog)


def sync_metrics(step: int, rank: int, watchdog: Watchdog) -> None:
    """Share the step's metrics; rank 1 takes a different code path on the last step."""
    import torch
    import torch.distributed as dist

    metrics = torch.tensor([float(step), 1.0, 2.0, 3.0])
    if rank == 1 and step == STEPS - 1:
        dist.broadcast(metrics, src=0)
    else:
        dist.all_reduce(metrics)
    watchdog.beat()


def run_op_mismatch(rank: int, watchdog: Watchdog) -> None:
    """Every step syncs metrics; on the last one rank 1 broadcasts instead of all-reducing."""
    for step in range(STEPS):
        sync_metrics(step, rank, watchdog)
    time.sleep(3600)


def reduce_embedding_grad(step: int, rank: int, watchdog: Watchdog) -> None:
    """All-reduce the embedding gradient; rank 3 pads its vocabulary differently at the end."""
    import torch
    import torch.distributed as dist

    size = 12 if rank == 3 and step == STEPS - 1 else 8
    dist.all_reduce(torch.ones(size))
    watchdog.beat()


def run_size_mismatch(rank: int, watchdog: Watchdog) -> None:
    """Every step reduces the embedding gradient; rank 3 sends another size on the last one."""
    for step in range(STEPS):
        reduce_embedding_grad(step, rank, watchdog)
    time.sleep(3600)


def save_checkpoint(step: int, rank: int, watchdog: Watchdog) -> None:
    """Agree on the checkpoint step, then rank 0 writes the checkpoint (slowly)."""
    import torch
    import torch.distributed as dist

    agreed = torch.tensor([step])
    dist.broadcast(agreed, src=0)
    watchdog.beat()
    if rank == 0 and step == STEPS - 1:
        time.sleep(3600)  # writing a huge checkpoint to a slow file system


def run_python_stall(rank: int, watchdog: Watchdog) -> None:
    """Train and checkpoint every step; rank 0's last checkpoint write never ends."""
    for step in range(STEPS + 1):
        train_step(step, watchdog)
        save_checkpoint(step, rank, watchdog)


def load_batch(step: int, rank: int) -> None:
    """Load the next batch; rank 3's loader stalls on the last step."""
    if rank == 3 and step == STEPS:
        time.sleep(3600)


def tensor_parallel_step(step: int, group: object, watchdog: Watchdog) -> None:
    """All-reduce the partial activations inside the tensor-parallel group."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4), group=group)
    watchdog.beat()


def run_two_groups(rank: int, watchdog: Watchdog) -> None:
    """Tensor-parallel groups [0,1] and [2,3], data-parallel all_reduce over the world."""
    import torch.distributed as dist

    tp01 = dist.new_group([0, 1], group_desc="tp_0_1")
    tp23 = dist.new_group([2, 3], group_desc="tp_2_3")
    tp = tp01 if rank < 2 else tp23
    for step in range(STEPS + 1):
        load_batch(step, rank)
        tensor_parallel_step(step, tp, watchdog)
        train_step(step, watchdog)


RUNNERS: dict[str, Callable[[int, Watchdog], None]] = {
    "skip_collective": run_skip_collective,
    "op_mismatch": run_op_mismatch,
    "size_mismatch": run_size_mismatch,
    "python_stall": run_python_stall,
    "two_groups": run_two_groups,
}


def worker(rank: int, name: str, out: str, port: int, hang_seconds: float) -> None:
    """One rank of a scenario: join the gloo group, start the watchdog, run the workload."""
    import torch.distributed as dist

    scenario = SCENARIOS[name]
    watchdog = Watchdog(rank, scenario, Path(out), hang_seconds)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=600),
    )
    watchdog.start()
    try:
        RUNNERS[name](rank, watchdog)
    except RuntimeError as exc:  # gloo may notice a mismatch itself; the dump still comes
        print(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        time.sleep(3600)


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_scenario(scenario: Scenario, root: Path, hang_seconds: float) -> Path:
    """Run one scenario's ranks to their dumps; return the folder holding them."""
    out = root / scenario.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(rank, scenario.name, str(out), port, hang_seconds))
        for rank in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        if proc.is_alive():
            proc.kill()
    for marker in out.glob(".d*"):
        marker.unlink()
    expected = asdict(scenario)
    expected["culprit_ranks"] = list(scenario.culprit_ranks)
    (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n", encoding="utf-8")
    return out


def run_fr_trace(folder: Path, label: str, extra: list[str]) -> str:
    """Run PyTorch's analyser on a folder of dumps; return what it printed, paths shortened."""
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    text = (proc.stdout + proc.stderr).replace(str(folder), label)
    noise = ("Failed to initialize NumPy", "_conversion_method_template", "tabulate is not")
    lines = [ln for ln in text.splitlines() if not any(n in ln for n in noise)]
    shown = " ".join(["fr_trace", label, *extra])
    return f"$ {shown}\n(exit {proc.returncode})\n" + "\n".join(lines) + "\n"


def normalized_copy(folder: Path, scenario: Scenario, target: Path) -> None:
    """Copy the dumps the way fr_trace needs them: pickles named ``rank_N``, with pg_config.

    Gloo records no process-group members, and fr_trace looks every group up in pg_config;
    the copy gets the members the scenario really used (what ProcessGroupNCCL would record).
    """
    import pickle

    target.mkdir(parents=True)
    for rank in range(WORLD):
        path = folder / scenario.file_name.format(rank=rank)
        if not path.exists():
            continue
        raw = path.read_bytes()
        dump = json.loads(raw) if scenario.json else pickle.loads(raw)
        groups = {"0": ("default_pg", list(range(WORLD)))}
        if scenario.name == "two_groups":
            groups |= {"1": ("tp_0_1", [0, 1]), "2": ("tp_2_3", [2, 3])}
        dump["pg_config"] = {
            name: {"name": name, "desc": desc, "ranks": str(ranks)}
            for name, (desc, ranks) in groups.items()
            if rank in ranks
        }
        for entry in dump.get("entries", []):
            entry["process_group"] = tuple(entry["process_group"])
        (target / f"rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))


def compare_with_fr_trace(folder: Path, scenario: Scenario) -> None:
    """Keep what PyTorch's analyser says, on the dumps as made and on a copy it can read."""
    report = run_fr_trace(folder, "<dumps>", ["--allow-incomplete-ranks"])
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "normalized"
        normalized_copy(folder, scenario, copy)
        report += "\n" + run_fr_trace(
            copy, "<normalized>", ["--allow-incomplete-ranks", "--prefix", "rank_"]
        )
    (folder / "fr_trace.txt").write_text(report, encoding="utf-8")


def main() -> None:
    """Parse the options, run the scenarios, optionally compare with fr_trace."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for <scenario>/ dumps (tests/data/fr)")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--hang-seconds", type=float, default=3.0)
    parser.add_argument("--compare", action="store_true", help="also run PyTorch's fr_trace")
    args = parser.parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(BUFFER_ENTRIES)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in args.only or list(SCENARIOS):
        folder = run_scenario(SCENARIOS[name], args.out, args.hang_seconds)
        dumps = sorted(p.name for p in folder.iterdir() if p.name not in ("expected.json",))
        print(f"{name}: {', '.join(dumps)}")
        if args.compare:
            compare_with_fr_trace(folder, SCENARIOS[name])


if __name__ == "__main__":
    main()
