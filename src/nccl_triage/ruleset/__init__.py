"""YAML rule and signal files in, a validated :class:`Ruleset` out.

Files come from other teams: YAML is read with the safe loader (no tags that build objects),
duplicate keys and aliases are rejected, unknown keys are errors that name the allowed ones,
and every pattern is compiled by RE2, whose matching time is linear in the input whatever the
pattern. :mod:`~nccl_triage.ruleset.shapes` declares the format once;
:mod:`~nccl_triage.ruleset.safeyaml` reads the YAML; :mod:`~nccl_triage.ruleset.files` checks
and builds one file; :mod:`~nccl_triage.ruleset.loader` loads directories.
"""

from nccl_triage.model.causes import CAUSES
from nccl_triage.ruleset.loader import (
    Ruleset,
    builtin_dirs,
    collect_ruleset,
    load_ruleset,
    source_dirs,
)
from nccl_triage.ruleset.shapes import SHAPES

__all__ = [
    "CAUSES",
    "SHAPES",
    "Ruleset",
    "builtin_dirs",
    "collect_ruleset",
    "load_ruleset",
    "source_dirs",
]
