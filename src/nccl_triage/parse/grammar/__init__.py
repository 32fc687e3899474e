"""The Lark grammar of NCCL / process-group / torchrun messages (``nccl.lark``)."""
