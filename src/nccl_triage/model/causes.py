"""The root causes a diagnosis can name: a stable contract (``docs/causes.md`` is made from it).

Input: nothing. Output: :data:`CAUSES` in the order reports and tables use, each with what it
means, the lines that show it and what to do. Rules name one of them; JSON reports, batch
tables and dashboards group by them, so a name never changes once released.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cause:
    """One root cause: its name in reports and what it stands for."""

    name: str
    summary: str  # one line
    mechanism: str  # what happened, and why the NCCL failure is its symptom
    evidence: str  # the lines of a log that show it
    remedy: str  # what a user does about it


CAUSE_LIST = (
    Cause(
        "slow_checkpoint_save",
        "a rank was still writing a checkpoint when the others needed it",
        "Saving is done by one rank (or gathers a sharded model onto one rank). The other ranks "
        "go on to the next collective and wait there; when the save takes longer than the "
        "process group's timeout, their watchdogs fire. The save may also be the collective "
        "that times out, when gathering the state dict is itself slow.",
        "A save announced before the timeout (`Saving model checkpoint to`, `save_pretrained`, "
        "DeepSpeed's and Lightning's save lines) with no end of it, on a rank that did not time "
        "out; a large `_ALLGATHER_BASE` at save time; a save in the stack of the collective; "
        "with flight-recorder dumps, the rank they blame saving, or last seen in a save.",
        "Raise the timeout above the save's duration, save from one rank and put a barrier "
        "after it, use sharded or asynchronous checkpoints, write to fast local storage.",
    ),
    Cause(
        "oom_hidden",
        "a rank ran out of memory, and the others timed out waiting for it",
        "One rank's allocation failed (GPU memory, or host memory and the kernel's OOM killer). "
        "That rank died or stopped calling collectives; the survivors' timeouts are what a user "
        "sees first, often far from the OOM line.",
        "`CUDA out of memory`, `torch.OutOfMemoryError`, NCCL failing to allocate, `Killed`, "
        "exit code -9 or 137 from torchrun for one rank, the OOM killer in the system log.",
        "Find the rank that died first and reduce its memory: smaller micro-batch, gradient "
        "accumulation or checkpointing, sharding; for host memory, fewer loader workers.",
    ),
    Cause(
        "rank_crashed",
        "a rank died of its own error, not NCCL's, and the others timed out waiting",
        "An exception or a fatal signal outside NCCL (a bug, a bad sample, a failed assertion, "
        "a segmentation fault in an extension, a scheduler's kill) ended one rank. It never "
        "reached the next collective; the others waited in theirs until the watchdog fired.",
        "A traceback's last line or a fatal signal on one rank before the others' timeouts; "
        "torchrun's first failure naming that rank and its exit code.",
        "Fix the error on that rank (the traceback's last frame); make every rank fail together "
        "(`@record`, abort the process group on an exception) so a crash does not look like a hang.",
    ),
    Cause(
        "generate_zero3",
        "generation under ZeRO-3 or FSDP let the ranks fall out of step",
        "With parameters sharded, every forward step all-gathers them. `generate()` runs a "
        "data-dependent number of steps on each rank, so ranks issue different numbers of "
        "all-gathers and wait for each other forever, or the gathers are simply too slow.",
        "`generate(` in a traceback or log line, ZeRO stage 3 or FSDP in the configuration, "
        "`_ALLGATHER_BASE` timeouts during evaluation or inference.",
        "`synced_gpus=True`, gather the full model once for inference, use an inference engine, "
        "or tensor parallelism instead of ZeRO-3 for generation.",
    ),
    Cause(
        "network_interface_misconfig",
        "the ranks could not reach each other at the addresses they were given",
        "NCCL's bootstrap, the c10d store or the rendezvous was bound to, or pointed at, an "
        "address the peers cannot reach: a missing or wrong interface (loopback, a docker "
        "bridge), a wrong MASTER_ADDR or port, a port already taken, a firewall.",
        "`no socket interface found`, `NCCL_SOCKET_IFNAME`, `ncclInvalidUsage` with a bootstrap "
        "error, connections refused or timing out at start-up, `failed to connect to any "
        "network address`, `Address already in use` for the store.",
        "List the interfaces (`ip addr`), set `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME` to the "
        "one the nodes share, check MASTER_ADDR/MASTER_PORT from every node, free the port.",
    ),
    Cause(
        "network_fabric_failure",
        "a transport failed while the job ran",
        "A link NCCL was using broke or misbehaved: InfiniBand/RoCE completion errors, sockets "
        "reset mid-run, a proxy thread failing, shared-memory segments that cannot be created "
        "(a container's /dev/shm too small), P2P/IPC failures between GPUs of one node.",
        "`NET/IB` errors, `Got completion with error`, `ncclRemoteError`, `Connection reset by "
        "peer` from NCCL, `Error while creating shared memory segment`, a bus error inside NCCL.",
        "Run nccl-tests between the nodes, bisect with `NCCL_IB_DISABLE=1`, `NCCL_P2P_DISABLE=1`, "
        "`NCCL_SHM_DISABLE=1`, check the links; give containers `--shm-size` or `--ipc=host`.",
    ),
    Cause(
        "rank_desync_or_mismatched_collective",
        "the ranks did not run the same collectives in the same order",
        "One rank skipped a collective, ran an extra one, or ran a different one (another "
        "operation, another size) at the same point: conditional code, uneven data, an early "
        "exit, a model that differs across ranks.",
        "Different OpType or sizes at the same SeqNum across ranks, different last-enqueued "
        "work numbers, PyTorch's collective fingerprint check, DDP's check of the model, NCCL's "
        "own mismatch warnings, a flight-recorder analysis naming the odd rank, dumps whose "
        "records differ at one collective number.",
        "`TORCH_DISTRIBUTED_DEBUG=DETAIL`, the flight recorder, `Join` for uneven inputs; make "
        "every rank call the same collectives in the same order.",
    ),
    Cause(
        "straggler_or_slow_rank",
        "one rank was busy with work the others did not wait for long enough",
        "A rank did work alone (preprocessing or tokenizing the data set, evaluation, a slow "
        "data loader, a busy loop) while the others waited in a barrier or a collective; the "
        "wait outlasted the timeout although nothing was broken.",
        "`main_process_first`, `Map:`/`Tokenizing` progress bars on one rank, evaluation lines, "
        "one rank far behind in SeqNum or still printing progress when the others timed out; "
        "flight-recorder dumps in which a rank never enqueued the collective the others wait "
        "in while its device had nothing left to run (the CPU side: its Python was elsewhere).",
        "Do one-rank work before the process group starts, or raise the timeout for that phase; "
        "preprocess offline; spread evaluation over the ranks.",
    ),
    Cause(
        "hardware_gpu_fault",
        "a GPU or its node failed",
        "The device stopped working or reported corrupted state: an Xid, ECC errors, a GPU that "
        "fell off the bus, device-level CUDA errors on one rank only.",
        "`Xid`, `ECC error`, `GPU has fallen off the bus`, `CUDA error: an illegal memory access` "
        "or `unknown error` on one rank, NCCL's `Cuda failure 999 'unknown error'`; "
        "flight-recorder dumps in which one rank's device never finished a collective its "
        "peers finished (the GPU side: the dumps alone cannot tell the device from its link).",
        "Drain the node, run `nvidia-smi -q` and DCGM diagnostics, resume from the last "
        "checkpoint on other hardware.",
    ),
    Cause(
        "version_or_driver_incompatibility",
        "the software versions do not fit each other",
        "Different NCCL, CUDA, driver, PyTorch or DeepSpeed versions across ranks or nodes, or a "
        "library too new for the driver: NCCL fails at start-up or behaves differently per rank.",
        "Different NCCL versions in the INIT lines, `CUDA driver version is insufficient`, "
        "`undefined symbol: nccl...`, NCCL that cannot be loaded, version warnings.",
        "Pin the versions the project documents, the same on every node; match the driver to "
        "the CUDA runtime.",
    ),
    Cause(
        "timeout_too_short",
        "the work was slower than a timeout set too short, and nothing else was wrong",
        "A healthy but long step (the first collectives, compilation, a large all-gather) "
        "outlasted a process-group timeout set far below PyTorch's default.",
        "A timeout of a minute or less and no other evidence.",
        "Raise the timeout, for that phase only if need be.",
    ),
    Cause(
        "unknown",
        "a collective failed, and the log holds no line that says why",
        "The failure is in the log, but nothing around it points to a cause.",
        "Only the failure itself.",
        "Run again with the flight recorder (`TORCH_NCCL_TRACE_BUFFER_SIZE`, its dumps read "
        "by `nccl-triage triage LOG --fr DIR`), `TORCH_NCCL_DESYNC_DEBUG=1` and "
        "`NCCL_DEBUG=INFO`, and keep every rank's output.",
    ),
)

CAUSES = tuple(c.name for c in CAUSE_LIST)
BY_NAME = {c.name: c for c in CAUSE_LIST}
