"""Plain data only: events, rules and findings, and reports (no I/O, no third-party imports)."""

from nccl_triage.model.events import (
    FAILURE_KINDS,
    Detail,
    Event,
    Kind,
    Line,
    Occurrence,
    Prefix,
    PrefixKind,
)
from nccl_triage.model.report import (
    SCHEMA,
    Correlation,
    Explanation,
    JobFacts,
    Report,
    Unparsed,
)
from nccl_triage.model.rules import (
    Clause,
    Condition,
    Example,
    Finding,
    Location,
    Pattern,
    Rule,
    Severity,
    Signal,
)

__all__ = [
    "FAILURE_KINDS",
    "SCHEMA",
    "Clause",
    "Condition",
    "Correlation",
    "Detail",
    "Event",
    "Example",
    "Explanation",
    "Finding",
    "JobFacts",
    "Kind",
    "Line",
    "Location",
    "Occurrence",
    "Pattern",
    "Prefix",
    "PrefixKind",
    "Report",
    "Rule",
    "Severity",
    "Signal",
    "Unparsed",
]
