"""nccl-triage: find the root cause behind a PyTorch NCCL watchdog timeout in torchrun logs."""

__version__ = "0.1.0"
