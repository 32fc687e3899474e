"""Batch triage of archived job logs: many files in, one table, a summary and an HTML page out.

The stages, in order: :mod:`~nccl_triage.batch.inputs` (discovery and grouping into jobs),
:mod:`~nccl_triage.batch.cache` (results of unchanged jobs), :mod:`~nccl_triage.batch.engines`
(this process, worker processes or Dask), :mod:`~nccl_triage.batch.job` (one job through the
pipeline), :mod:`~nccl_triage.batch.run` (the whole run) and :mod:`~nccl_triage.batch.table`
(the table and the summary). The HTML page is rendered by :mod:`nccl_triage.render.html`.
"""

from nccl_triage.batch.cache import default_db
from nccl_triage.batch.inputs import (
    DEFAULT_FR_PATTERNS,
    DEFAULT_INCLUDE,
    InputFile,
    Job,
    attach_dumps,
    discover,
    group_jobs,
    is_dump_name,
)
from nccl_triage.batch.run import BatchOptions, BatchResult, BatchStats, Outcome, run_batch
from nccl_triage.batch.table import COLUMNS, format_summary, format_table, write_table

__all__ = [
    "COLUMNS",
    "DEFAULT_FR_PATTERNS",
    "DEFAULT_INCLUDE",
    "BatchOptions",
    "BatchResult",
    "BatchStats",
    "InputFile",
    "Job",
    "Outcome",
    "attach_dumps",
    "default_db",
    "discover",
    "format_summary",
    "format_table",
    "group_jobs",
    "is_dump_name",
    "run_batch",
    "write_table",
]
