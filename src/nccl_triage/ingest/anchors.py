"""The literal phrases of the candidate scan: a line holding none of them never reaches the grammar.

Input: nothing. Output: :data:`ANCHORS`, the phrases that start (or survive the hard-wrapping
of) every message family the grammar reads.
"""

from __future__ import annotations

# Literal phrases that start (or survive the hard-wrapping of) every message family of the
# format reference. A line holding none of them never reaches the grammar. Several phrases
# cover one family on purpose: a terminal may wrap a message in the middle of any one of them.
ANCHORS: tuple[str, ...] = (
    # family 1: watchdog timeout, every era; blocking wait
    "Watchdog caught",
    "ollective operation timeout",
    "WorkNCCL(",
    "timed out in blocking wait",
    # family 2: status lines, desync report, flight-recorder traceback
    "Timeout at NCCL work",
    "either an error or timeout",
    "detected by watchdog",
    "watchdog at work",
    "last enqueued",
    "To our best knowledge",
    "joined but didn't finish",
    "didn't join collective",
    "Snapshot of ranks' latest states",
    "] started ",  # "[0, 1, 2, 3] started ALLREDUCE" in the desync snapshot
    "] finished ",
    "started ranks:",
    "finished ranks:",
    "Timeout at collective",
    "DESYNC_DEBUG report",
    "Stack trace of the failed collective",
    "flight recorder dumps to finish",
    "Not all ranks joining collective",
    # family 3: tear-down
    "Some NCCL operations have failed",
    "To avoid data inconsistency",
    "watchdog thread terminated",
    "terminate called after throwing",
    # family 4: heartbeat monitor, dump signals, fatal termination
    "watchdog got stuck",
    "Heartbeat monitor timed out",
    "no heartbeat of its watchdog",
    "monitor thread timeout",
    "dump signal",
    "signal dumping",
    "Received a global",
    "preparing to dump debug info",
    "Terminating the process after",
    "onitor thread is disabled",
    "onitor Thread is disabled",
    "should dump",
    "Could not acquire GIL",
    # fatal signals (parse/fatal.py), NCCL failures when the backtrace after runs through NCCL
    "Caught signal",
    "Process received signal",
    "Fatal Python error",
    "SIGSEGV",
    "SIGBUS",
    "SIGILL",
    "SIGFPE",
    "raised from ncclCommWatchdog",  # the C++ trace of the exception the watchdog died of
    "raised from c10d::ProcessGroupNCCL::",
    "raised from ProcessGroupNCCL::",
    "raised from watchdogHandler",
    # family 5: NCCL errors through PyTorch, libnccl's own lines
    "NCCL error",
    "NCCL timeout in",
    "communicator was aborted",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclInvalidArgument",
    "Unknown NCCL error",
    "Last error:",
    "NCCL WARN",
    "NCCL failure",  # nccl-tests
    "shared memory segment",  # NCCL's SHM errors, also without their prefix
    "Got completion",  # NCCL's IB completion errors, also without their prefix
    "NCCL operation",  # XLA: "NCCL operation ncclCommInitRank(...) failed: ..."
    "NCCL Error",  # vLLM/sglang pynccl
    "Nccl error",  # PaddlePaddle
    "NCCL error(",  # PaddlePaddle
    "async NCCL error",  # XLA: "Aborting communicator ... due to async NCCL error"
    "undefined symbol: nccl",
    "Unable to load NCCL library",
    "Failed to create NCCL communicator",  # XLA
    "Mismatched ",  # Horovod: "Mismatched ALLREDUCE CPU/GPU device selection"
    "tensors were submitted",  # Horovod's stall inspector
    "Stalled ops",
    ".cc:",  # libnccl's error traces "NCCL INFO init.cc:82 -> 3" (its sources are .cc files)
    ".cu:",  # NCCL <= 2.3 sources: "misc/ibvwrap.cu:60 WARN ...", "bootstrap.cu:19 -> 2"
    "Init COMPLETE",
    "NCCL version",
    "NET/Socket : Using",
    "NET/IB : Using",
    "Bootstrap : Using",
    "set by environment to",
    "CUDA error",
    "Cuda failure",
    "Detected mismatch between collectives",
    "CollectiveFingerPrint",
    # family 6: torchrun agent and ChildFailedError
    "failed (exitcode:",
    "closing signal",
    "death signal",
    "got signal:",
    "ChildFailedError",
    "Root Cause",
    "Failures:",
    "Worker group",
    "FAILED with no error file",
    # family 7: stores, rendezvous, sockets
    "waiting for clients",
    "store based barrier",
    "client socket has timed out",
    "client failed to connect",
    "NCCL communicator and retr",
    "Socket Timeout",
    "wait timeout after",
    "Timeout waiting for key",
    "socket has failed to",
    "recvValue failed",
    "ailed to recv, got 0 bytes",
    "RendezvousTimeoutError",
    # a store or its socket failing: raised bare from torch.distributed's set-up (parse/lines.py)
    "Connection reset by peer",
    # nccl-tests' own checks; DDP's check of the model across ranks
    "Test CUDA failure",
    "Test NCCL failure",
    "DDP expects same model",
    "in this process with sizes",
    "Connection refused",
    "Connection timed out",
    "connect() timed out",
    "Broken pipe",
    "waitForInput",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    # family 8: Gloo
    "operation to complete",
    "Connection closed by peer",
    "Read error [",
    "caused pair closure",
    "Unable to find address for",
    # environment variables
    "is deprecated; use TORCH_",
    "has no effect when TORCH_",
)

# Phrases no literal covers, as RE2 patterns: NCCL <= 2.2 warnings from a header or C file
# without the NCCL word ("include/socket.h:311 WARN ..."), and frameworks naming the failed
# NCCL call ("ncclCommInitRank failed: unhandled system error").
REGEX_ANCHORS: tuple[str, ...] = (
    r"\.(?:h|hpp|c|cpp):\d+ +WARN\b",
    r"\.(?:h|hpp|c|cpp):\d+ +-> +\d",  # an error return traced through a header or C file
    r"\bnccl[A-Z]\w+(?:\([^)]*\))? failed:",
)
