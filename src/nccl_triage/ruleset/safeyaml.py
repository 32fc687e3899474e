"""YAML from other teams, read safely: no tags that build objects, no duplicate keys, no aliases.

Input: a YAML file. Output: plain mappings and lists that remember the line of each key (for
``file:line`` messages), or the problems found. Only this package imports yaml, and only when
a file is not in the cache of parsed files (:mod:`~nccl_triage.ruleset.doccache`): a start
that reads the rules it read before imports no YAML parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class YamlMap(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class YamlSeq(list[Any]):
    """A YAML sequence that remembers its line (1-based)."""

    line: int = 0


def line_of(obj: Any, key: str | None = None) -> int:
    """The 1-based line of a mapping or list read by :func:`load_yaml`, or of one of its keys."""
    if isinstance(obj, YamlMap):
        return obj.key_lines.get(key, obj.line) if key else obj.line
    return int(getattr(obj, "line", 0))


def load_yaml(path: Path) -> tuple[Any, list[str]]:
    """Read one YAML file safely; return the data and its problems as ``file:line: msg``."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {exc}"]
    from nccl_triage.ruleset import doccache

    known = doccache.lookup(text)
    if known is not None:
        data, problems = known
    else:
        from nccl_triage.ruleset.yamlparse import parse

        data, problems, errors = parse(text)
        if errors:
            return None, [f"{path}{where}: invalid YAML: {msg}" for where, msg in errors]
        doccache.remember(text, data, problems)
    return data, [f"{path}:{line}: {msg}" for line, msg in problems]
