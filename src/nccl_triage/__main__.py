"""``python -m nccl_triage``: the same command line as ``nccl-triage``."""

from nccl_triage.cli import main

if __name__ == "__main__":
    main(prog_name="nccl-triage")
