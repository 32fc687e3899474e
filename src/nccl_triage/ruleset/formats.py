"""The log-format reference's data file: read safely, checked, built into :class:`LogFormats`.

Input: ``_data/log_formats.yaml`` in the package (or another file of the same format). Output:
a :class:`~nccl_triage.model.formats.LogFormats`, or every problem of the file at once as
``file:line: message``: unknown or missing keys, an era naming no part, a family without one to
three examples, and ``reads`` that name an unknown event kind or a field its kind does not have
(:mod:`nccl_triage.model.fields`), so the document never promises a field no event carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nccl_triage.errors import RuleError
from nccl_triage.model.events import Kind
from nccl_triage.model.fields import fields_of
from nccl_triage.model.formats import (
    FormatEra,
    FormatLine,
    FormatPart,
    LineFamily,
    LogFormats,
    Value,
)
from nccl_triage.ruleset.safeyaml import YamlMap, YamlSeq, line_of, load_yaml

TOP_KEYS = ("parts", "eras")
PART_KEYS = ("id", "title", "intro")
ERA_KEYS = ("id", "part", "title", "summary", "families", "near_misses")
FAMILY_KEYS = ("id", "title", "meaning", "examples")
LINE_KEYS = ("line", "source", "meaning", "reads")
# What every ``reads`` says besides the event's fields: its kind, its form (null when the kind
# has one form), and whether the line alone is a failure of the job.
READS_KEYS = ("kind", "form", "failure")
MAX_EXAMPLES = 3


def formats_path() -> Path:
    """The data file of the reference, in the source tree or the installed package."""
    return Path(__file__).resolve().parent.parent / "_data" / "log_formats.yaml"


class _Problems:
    """The problems of one file, each as ``file:line: message``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.all: list[str] = []

    def add(self, line: int, msg: str) -> None:
        self.all.append(f"{self.path}:{line}: {msg}")

    def mapping(
        self, obj: Any, keys: tuple[str, ...], required: tuple[str, ...], what: str
    ) -> bool:
        """Check ``obj`` is a mapping with only ``keys`` and every ``required`` one."""
        if not isinstance(obj, YamlMap):
            self.add(line_of(obj), f"{what}: a mapping expected")
            return False
        for key in obj:
            if key not in keys:
                self.add(
                    line_of(obj, key), f"{what}: unknown key '{key}' (expected: {', '.join(keys)})"
                )
        for key in required:
            if key not in obj:
                self.add(obj.line, f"{what}: missing key '{key}'")
        return True

    def text(self, obj: YamlMap, key: str, what: str, verbatim: bool = False) -> str:
        """A string value; prose has its folding whitespace collapsed, a log line is kept."""
        value = obj.get(key)
        if key in obj and (not isinstance(value, str) or not value.strip()):
            self.add(line_of(obj, key), f"{what}: '{key}' must be a non-empty string")
            return ""
        text = value if isinstance(value, str) else ""
        return text if verbatim else " ".join(text.split())

    def sequence(self, obj: YamlMap, key: str, what: str) -> list[Any]:
        value = obj.get(key)
        if value is None:
            return []
        if not isinstance(value, YamlSeq):
            self.add(line_of(obj, key), f"{what}: '{key}' must be a list")
            return []
        return list(value)


def load_log_formats(path: Path | None = None) -> LogFormats:
    """Read and check the reference's data file.

    Raises:
        RuleError: the file is invalid; the message lists every problem.
    """
    path = path or formats_path()
    data, errors = load_yaml(path)
    check = _Problems(path)
    check.all.extend(errors)
    parts: list[FormatPart] = []
    eras: list[FormatEra] = []
    if data is not None and check.mapping(data, TOP_KEYS, TOP_KEYS, "the file"):
        parts = [
            FormatPart(*(check.text(raw, k, "part") for k in PART_KEYS))
            for raw in check.sequence(data, "parts", "parts")
            if check.mapping(raw, PART_KEYS, PART_KEYS, "part")
        ]
        part_ids = [p.id for p in parts]
        ids: dict[str, int] = {}  # era and family ids, each with its line
        for raw in check.sequence(data, "eras", "eras"):
            era = _era(check, raw, part_ids, ids)
            if era is not None:
                eras.append(era)
    if check.all:
        raise RuleError("", "\n".join(check.all))
    return LogFormats(tuple(parts), tuple(eras), str(path))


def _unique(check: _Problems, raw: YamlMap, ident: str, ids: dict[str, int], what: str) -> None:
    """Note ``ident``'s line, or a problem when an era or family already has that id."""
    at = line_of(raw, "id")
    if ident in ids:
        check.add(at, f"{what} id '{ident}' is used twice (first at line {ids[ident]})")
    else:
        ids[ident] = at


def _era(check: _Problems, raw: Any, part_ids: list[str], ids: dict[str, int]) -> FormatEra | None:
    required = ("id", "part", "title", "summary", "families")
    if not check.mapping(raw, ERA_KEYS, required, "era"):
        return None
    era_id = check.text(raw, "id", "era")
    _unique(check, raw, era_id, ids, "era")
    what = f"era '{era_id}'"
    part = check.text(raw, "part", what)
    if part and part not in part_ids:
        check.add(
            line_of(raw, "part"), f"{what}: unknown part '{part}' (expected: {', '.join(part_ids)})"
        )
    families = [
        fam
        for r in check.sequence(raw, "families", what)
        if (fam := _family(check, r, what, ids)) is not None
    ]
    if not families:
        check.add(raw.line, f"{what}: at least one family is needed")
    near = [
        line
        for r in check.sequence(raw, "near_misses", what)
        if (line := _line(check, r, f"{what}: near-miss", near_miss=True)) is not None
    ]
    return FormatEra(
        era_id,
        part,
        check.text(raw, "title", what),
        check.text(raw, "summary", what),
        tuple(families),
        tuple(near),
    )


def _family(check: _Problems, raw: Any, era: str, ids: dict[str, int]) -> LineFamily | None:
    if not check.mapping(raw, FAMILY_KEYS, FAMILY_KEYS, f"{era}: family"):
        return None
    family_id = check.text(raw, "id", era)
    _unique(check, raw, family_id, ids, "family")
    what = f"family '{family_id}'"
    examples = [
        line
        for r in check.sequence(raw, "examples", what)
        if (line := _line(check, r, f"{what}: example")) is not None
    ]
    if not 1 <= len(examples) <= MAX_EXAMPLES:
        check.add(raw.line, f"{what}: one to {MAX_EXAMPLES} examples are needed")
    return LineFamily(
        family_id,
        check.text(raw, "title", what),
        check.text(raw, "meaning", what),
        tuple(examples),
    )


def _line(check: _Problems, raw: Any, what: str, near_miss: bool = False) -> FormatLine | None:
    required = ("line", "source", "reads", "meaning") if near_miss else ("line", "source", "reads")
    if not check.mapping(raw, LINE_KEYS, required, what):
        return None
    if "meaning" in raw and not near_miss:
        check.add(line_of(raw, "meaning"), f"{what}: 'meaning' belongs to the family")
    source = check.text(raw, "source", what)
    if source and not source.startswith("https://"):
        check.add(line_of(raw, "source"), f"{what}: 'source' must be the thread's https:// URL")
    reads = _reads(check, raw, what)
    if near_miss and reads is not None and reads.get("failure"):
        check.add(line_of(raw, "reads"), f"{what}: a near-miss cannot read as a failure")
    return FormatLine(
        line=check.text(raw, "line", what, verbatim=True),
        source=source,
        reads=reads,
        meaning=check.text(raw, "meaning", what) if near_miss else "",
        at=raw.line,
    )


def _reads(check: _Problems, raw: YamlMap, what: str) -> dict[str, Value] | None:
    value = raw.get("reads")
    at = line_of(raw, "reads")
    if value == "none":
        return None
    if not isinstance(value, YamlMap):
        check.add(at, f"{what}: reads: a mapping of the event's fields, or none, expected")
        return None
    for key in READS_KEYS:
        if key not in value:
            check.add(at, f"{what}: reads: missing key '{key}'")
    kind = value.get("kind")
    if kind not in tuple(Kind):
        check.add(at, f"{what}: reads: unknown event kind {kind!r}")
        return None
    if not isinstance(value.get("failure"), bool):
        check.add(at, f"{what}: reads: 'failure' must be true or false")
    have = fields_of(str(kind))
    out: dict[str, Value] = {}
    for key, field in value.items():
        if key not in READS_KEYS and key not in have:
            check.add(at, f"{what}: reads: '{key}' is not a field of {kind} events")
        elif field is not None and not isinstance(field, str | int | bool):
            check.add(at, f"{what}: reads: '{key}' must be a plain value")
        else:
            out[key] = field
    return out
