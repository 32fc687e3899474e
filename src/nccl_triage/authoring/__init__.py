"""Writing rules: lint, test, scaffold, list and show them; the JSON Schema of their files.

Input: rule directories (the built-ins, team directories, ``NCCL_TRIAGE_RULES``). Output: plain
data and text for ``nccl-triage rules``: problems as ``file:line: message``, example results,
the files of a new rule, the rule reference in Markdown, and the JSON Schema that editors use
to check rule files while people type. No click here: the CLI only formats.
"""

from nccl_triage.authoring.docs import display_path, rule_rows, rules_markdown, show
from nccl_triage.authoring.lint import REFERENCE_COMMAND, SCHEMA_COMMAND, LintResult, lint
from nccl_triage.authoring.runner import corpus_hits, run_tests
from nccl_triage.authoring.scaffold import scaffold
from nccl_triage.authoring.schema import rule_schema, schema_json

__all__ = [
    "REFERENCE_COMMAND",
    "SCHEMA_COMMAND",
    "LintResult",
    "corpus_hits",
    "display_path",
    "lint",
    "rule_rows",
    "rule_schema",
    "rules_markdown",
    "run_tests",
    "scaffold",
    "schema_json",
    "show",
]
