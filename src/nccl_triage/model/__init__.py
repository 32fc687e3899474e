"""Plain data only: events, rules and findings, and reports (no I/O, no third-party imports)."""

from nccl_triage.model.events import Event, Kind, Line, Occurrence, Prefix
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
    "SCHEMA",
    "Clause",
    "Condition",
    "Correlation",
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
    "Report",
    "Rule",
    "Severity",
    "Signal",
    "Unparsed",
]
