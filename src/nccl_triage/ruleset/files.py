"""One rule or signal file: its keys checked against :data:`SHAPES`, its objects built.

Input: a parsed YAML file. Output: a :class:`~nccl_triage.model.Rule` or
:class:`~nccl_triage.model.Signal`, or every problem of the file as ``file:line: message``:
unknown keys (naming the allowed ones), wrong types, unknown events and fields, regexes that
RE2 rejects (whose matching time is linear in the input whatever the pattern).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nccl_triage.ingest.regex import compile_error
from nccl_triage.model import (
    Clause,
    Condition,
    Direction,
    Example,
    LineExample,
    Location,
    Operator,
    Pattern,
    Rule,
    Severity,
    Signal,
)
from nccl_triage.model.causes import CAUSES
from nccl_triage.ruleset.safeyaml import YamlMap, YamlSeq, load_yaml
from nccl_triage.ruleset.shapes import (
    CLAUSE_KEYS,
    DIRECTIONS,
    EXAMPLE_KEYS,
    EXPECTS,
    FACT_NAMES,
    LINE_EXAMPLE_KEYS,
    MATCH_KEYS,
    OPERATOR_TYPES,
    OPERATORS,
    PATTERN_KEYS,
    REQUIRED_RULE_KEYS,
    RULE_KEYS,
    SHAPES,
    SIGNAL_KEYS,
    WITHIN_KEYS,
)

# ----------------------------------------------------------------------------- checks


class _Checker:
    """Collects problems for one file, each with its line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []

    def add(self, line: int, msg: str) -> None:
        self.problems.append(f"{self.path}:{line}: {msg}")

    def keys(self, obj: YamlMap, allowed: tuple[str, ...], what: str) -> None:
        for key in obj:
            if key not in allowed:
                self.add(
                    obj.key_lines.get(key, obj.line),
                    f"{what}unknown key '{key}' (expected: {', '.join(allowed)})",
                )

    def line_of(self, obj: Any, key: str | None = None) -> int:
        if isinstance(obj, YamlMap):
            return obj.key_lines.get(key, obj.line) if key else obj.line
        return getattr(obj, "line", 0)

    def string(self, obj: YamlMap, key: str, what: str = "", required: bool = True) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                self.add(obj.line, f"{what}missing key '{key}'")
            return None
        if not isinstance(value, str) or not value.strip():
            hint = ""
            if isinstance(value, bool):
                hint = " (YAML reads an unquoted yes/no/on/off/true/false as a boolean: quote it)"
            self.add(self.line_of(obj, key), f"{what}'{key}' must be a non-empty string{hint}")
            return None
        return value


def _open_mapping(path: Path, expected: str) -> tuple[YamlMap | None, _Checker]:
    """Read a rule or signal file; its top level must be a mapping (``expected`` says of what)."""
    data, errors = load_yaml(path)
    check = _Checker(path)
    check.problems.extend(errors)
    if isinstance(data, YamlMap):
        return data, check
    if data is not None or not errors:
        check.add(1, f"a {expected}")
    return None, check


def load_signal(path: Path) -> tuple[Signal | None, list[str]]:
    """Read one signal file: the signal, or None and every problem as ``file:line: message``."""
    data, check = _open_mapping(
        path, "signal file must be a mapping with id, description, patterns"
    )
    if data is None:
        return None, check.problems
    check.keys(data, SIGNAL_KEYS, "")
    sid = check.string(data, "id")
    if sid is not None and sid != path.stem:
        check.add(check.line_of(data, "id"), f"id '{sid}' must equal the file name '{path.stem}'")
    description = check.string(data, "description") or ""
    ignore_case = bool(data.get("ignore_case", False))
    patterns: list[Pattern] = []
    raw = data.get("patterns")
    if not isinstance(raw, list) or not raw:
        check.add(check.line_of(data, "patterns"), "'patterns' must be a non-empty list")
        raw = []
    for i, item in enumerate(raw):
        what = f"patterns[{i}]: "
        if isinstance(item, str):
            item = YamlMap(regex=item)
            item.line = raw.line if isinstance(raw, YamlSeq) else 0
            item.key_lines = {}
        if not isinstance(item, YamlMap):
            check.add(check.line_of(raw), f"{what}must be a regex string or a mapping")
            continue
        check.keys(item, PATTERN_KEYS, what)
        regex = check.string(item, "regex", what)
        if regex is None:
            continue
        err = compile_error(regex, ignore_case, over_bytes=True)  # (as the classifier reads)
        if err:
            check.add(
                check.line_of(item, "regex"), f"{what}regex does not compile under RE2: {err}"
            )
            continue
        anchors = item.get("anchors", ())
        if isinstance(anchors, str):
            anchors = (anchors,)
        if not isinstance(anchors, list | tuple) or not all(
            isinstance(a, str) and a for a in anchors
        ):
            check.add(check.line_of(item, "anchors"), f"{what}'anchors' must be a list of strings")
            anchors = ()
        on = item.get("target", "line")
        if on not in ("line", "message"):
            check.add(check.line_of(item, "target"), f"{what}'target' must be 'line' or 'message'")
        elif on == "message" and not anchors:
            check.add(
                check.line_of(item, "target"),
                f"{what}a pattern on the message needs 'anchors' (the scan reads whole lines)",
            )
        patterns.append(
            Pattern(str(item.get("name") or f"{sid}-{i}"), regex, tuple(anchors), on == "message")
        )
    exclude = data.get("exclude", ())
    if isinstance(exclude, str):
        exclude = (exclude,)
    if not isinstance(exclude, list | tuple) or not all(isinstance(x, str) for x in exclude):
        check.add(check.line_of(data, "exclude"), "'exclude' must be a list of regex strings")
        exclude = ()
    for j, regex in enumerate(exclude):
        err = compile_error(regex, ignore_case)
        if err:
            check.add(
                check.line_of(data, "exclude"),
                f"exclude[{j}]: regex does not compile under RE2: {err}",
            )
    examples = _line_examples(check, data.get("examples"), check.line_of(data, "examples"), path)
    if check.problems or sid is None:
        return None, check.problems
    return Signal(
        sid,
        description,
        tuple(patterns),
        ignore_case,
        Location(str(path), data.line),
        tuple(exclude),
        tuple(examples),
    ), []


def _line_examples(check: _Checker, raw: Any, line: int, path: Path) -> list[LineExample]:
    """A signal's example lines (``examples:``), each checked as the format says."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        check.add(line, "'examples' must be a list of {line, expect} mappings")
        return []
    out: list[LineExample] = []
    for i, item in enumerate(raw):
        what = f"examples[{i}]: "
        if not isinstance(item, YamlMap):
            check.add(check.line_of(raw), f"{what}must be a mapping with 'line' and 'expect'")
            continue
        check.keys(item, LINE_EXAMPLE_KEYS, what)
        text = check.string(item, "line", what)
        expect = item.get("expect")
        if expect not in ("match", "no-match"):
            check.add(check.line_of(item, "expect"), f"{what}'expect' must be match or no-match")
            continue
        origin = item.get("source")
        if text is not None:
            out.append(
                LineExample(
                    text,
                    str(expect),
                    Location(str(path), item.line),
                    str(origin) if origin is not None else None,
                )
            )
    return out


def load_rule(path: Path) -> tuple[Rule | None, list[str]]:
    """Read one rule file: the rule, or None and every problem as ``file:line: message``."""
    data, check = _open_mapping(path, "rule file must be a mapping (id, title, cause, match, ...)")
    if data is None:
        return None, check.problems
    check.keys(data, RULE_KEYS, "")
    for key in REQUIRED_RULE_KEYS:
        if key not in data:
            check.add(data.line, f"missing key '{key}'")
    rid = check.string(data, "id", required=False)
    if rid is not None and rid != path.stem:
        check.add(check.line_of(data, "id"), f"id '{rid}' must equal the file name '{path.stem}'")
    title = check.string(data, "title", required=False) or ""
    cause = check.string(data, "cause", required=False)
    if cause is not None and cause not in CAUSES:
        check.add(
            check.line_of(data, "cause"),
            f"cause '{cause}' is not in docs/causes.md (expected one of: {', '.join(CAUSES)})",
        )
    rule_shape = SHAPES["rule"]
    sev_raw = data.get("severity", Severity.MEDIUM.value)
    try:
        severity = Severity(sev_raw)
    except ValueError:
        check.add(
            check.line_of(data, "severity"),
            f"severity '{sev_raw}' (expected one of: {', '.join(s.value for s in Severity)})",
        )
        severity = Severity.MEDIUM
    confidence = data.get("confidence", rule_shape.key("confidence").default)
    if (
        not isinstance(confidence, int | float)
        or isinstance(confidence, bool)
        or not 0 <= confidence <= 1
    ):
        check.add(check.line_of(data, "confidence"), "confidence must be a number from 0 to 1")
        confidence = 0.5
    description = data.get("description") or ""
    match = _clause(check, data.get("match"), "match: ", MATCH_KEYS, check.line_of(data, "match"))
    context: list[Clause] = []
    raw_context = data.get("context") or []
    if not isinstance(raw_context, list):
        check.add(check.line_of(data, "context"), "'context' must be a list of clauses")
        raw_context = []
    for i, item in enumerate(raw_context):
        clause = _clause(check, item, f"context[{i}]: ", CLAUSE_KEYS, check.line_of(raw_context))
        if clause:
            context.append(clause)
    facts = _conditions(
        check, data.get("facts"), "facts: ", check.line_of(data, "facts"), names=FACT_NAMES
    )
    advice = check.string(data, "advice", required=False) or ""
    refs = data.get("references") or []
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        check.add(check.line_of(data, "references"), "'references' must be a list of URLs")
        refs = []
    if "references" in data and not any(str(r).startswith(("https://", "http://")) for r in refs):
        check.add(check.line_of(data, "references"), "'references' needs at least one http(s) URL")
    examples = _examples(check, data.get("examples"), check.line_of(data, "examples"), path)
    owner = data.get("owner")
    if check.problems or rid is None or cause is None or match is None:
        return None, check.problems
    return (
        Rule(
            id=rid,
            title=title,
            cause=cause,
            severity=severity,
            confidence=float(confidence),
            description=str(description).strip(),
            match=match,
            context=tuple(context),
            facts=tuple(facts),
            advice=advice,
            references=tuple(refs),
            examples=tuple(examples),
            source=Location(str(path), data.line),
            owner=str(owner) if owner else None,
        ),
        [],
    )


def _clause(
    check: _Checker, obj: Any, what: str, allowed: tuple[str, ...], line: int
) -> Clause | None:
    if not isinstance(obj, YamlMap):
        check.add(line, f"{what}must be a mapping with an 'event' key")
        return None
    check.keys(obj, allowed, what)
    event = check.string(obj, "event", what)
    where = _conditions(check, obj.get("where"), f"{what}where: ", check.line_of(obj, "where"))
    lines = seconds = None
    within = obj.get("within")
    if within is not None:
        if not isinstance(within, YamlMap):
            check.add(
                check.line_of(obj, "within"), f"{what}'within' must be a mapping (lines, seconds)"
            )
        else:
            check.keys(within, WITHIN_KEYS, f"{what}within: ")
            lines = _number(check, within, "lines", what, int)
            seconds = _number(check, within, "seconds", what, float)
    shape = SHAPES["clause"]
    direction = obj.get("direction", shape.key("direction").default)
    if direction not in DIRECTIONS:
        check.add(
            check.line_of(obj, "direction"),
            f"{what}direction '{direction}' (expected one of: {', '.join(DIRECTIONS)})",
        )
    flags = {}
    for key in (
        "present",
        "same_rank",
        "other_rank",
        "culprit",
        "running",
        "outside_nccl",
        "optional",
        "fr_culprit",
    ):
        default = bool(shape.key(key).default)
        value = obj.get(key, default)
        if not isinstance(value, bool):
            check.add(check.line_of(obj, key), f"{what}'{key}' must be true or false")
            value = default
        flags[key] = value
    name = obj.get("name")
    if name is not None and not (isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9_]*", name)):
        check.add(check.line_of(obj, "name"), f"{what}'name' must be a snake_case word")
        name = None
    if event is None:
        return None
    return Clause(
        event,
        tuple(where),
        lines,
        seconds,
        Direction(str(direction)) if direction in DIRECTIONS else Direction.BEFORE,
        flags["present"],
        flags["same_rank"],
        flags["other_rank"],
        name,
        flags["culprit"],
        flags["running"],
        flags["outside_nccl"],
        flags["optional"],
        flags["fr_culprit"],
    )


def _number(check: _Checker, obj: YamlMap, key: str, what: str, kind: type) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        check.add(check.line_of(obj, key), f"{what}within.{key} must be a non-negative number")
        return None
    return kind(value)


def _conditions(
    check: _Checker, obj: Any, what: str, line: int, names: tuple[str, ...] = ()
) -> list[Condition]:
    if obj is None:
        return []
    if not isinstance(obj, YamlMap):
        check.add(line, f"{what}must be a mapping of field: value")
        return []
    out: list[Condition] = []
    for fname, spec in obj.items():
        fline = check.line_of(obj, fname)
        if names and fname not in names:
            check.add(fline, f"{what}unknown fact '{fname}' (expected: {', '.join(names)})")
            continue
        if isinstance(spec, YamlMap):
            for op, value in spec.items():
                if op not in OPERATORS:
                    check.add(
                        spec.key_lines.get(op, fline),
                        f"{what}{fname}: unknown operator '{op}' (expected: {', '.join(OPERATORS)})",
                    )
                    continue
                if op in ("matches", "not_matches"):
                    if not isinstance(value, str):
                        check.add(fline, f"{what}{fname}: '{op}' takes a regex string")
                        continue
                    err = compile_error(value)
                    if err:
                        check.add(fline, f"{what}{fname}: regex does not compile under RE2: {err}")
                        continue
                kind = OPERATOR_TYPES[op]
                if kind == "number" and (
                    isinstance(value, bool) or not isinstance(value, int | float)
                ):
                    check.add(fline, f"{what}{fname}: '{op}' takes a number")
                    continue
                if kind == "list" and not isinstance(value, list):
                    check.add(fline, f"{what}{fname}: '{op}' takes a list")
                    continue
                if kind == "flag" and not isinstance(value, bool):
                    check.add(fline, f"{what}{fname}: '{op}' takes true or false")
                    continue
                out.append(Condition(str(fname), Operator(str(op)), _plain(value), fline))
        elif isinstance(spec, list):
            out.append(Condition(str(fname), Operator.IN, tuple(_plain(v) for v in spec), fline))
        else:
            out.append(Condition(str(fname), Operator.EQ, _plain(spec), fline))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _examples(check: _Checker, obj: Any, line: int, path: Path) -> list[Example]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        check.add(line, "'examples' must be a list")
        return []
    out: list[Example] = []
    for i, item in enumerate(obj):
        what = f"examples[{i}]: "
        if not isinstance(item, YamlMap):
            check.add(line, f"{what}must be a mapping (name, expect, log or file)")
            continue
        check.keys(item, EXAMPLE_KEYS, what)
        name = check.string(item, "name", what) or f"example-{i}"
        expect = item.get("expect")
        if expect not in EXPECTS:
            check.add(
                check.line_of(item, "expect"),
                f"{what}expect '{expect}' (expected one of: {', '.join(EXPECTS)})",
            )
            continue
        log, file = item.get("log"), item.get("file")
        if sum(item.get(k) is not None for k in SHAPES["example"].one_of) != 1:
            check.add(item.line, f"{what}give exactly one of 'log' or 'file'")
            continue
        if file is not None:
            resolved = _resolve_example(path, str(file))
            if resolved is None:
                check.add(check.line_of(item, "file"), f"{what}file '{file}' not found")
                continue
            file = str(resolved)
        evidence = _match_texts(check, item, "evidence", what, str(expect))
        advice = _match_texts(check, item, "advice", what, str(expect))
        dumps = _example_dumps(check, item, what, path)
        out.append(
            Example(
                name,
                str(expect),
                log if log is None else str(log),
                file,
                Location(str(path), item.line),
                evidence,
                dumps,
                advice,
            )
        )
    matches = [e for e in out if e.expect == "match"]
    if not any(e.expect == "no-match" for e in out) or not matches:
        check.add(line, "examples need at least one 'match' and one 'no-match' example")
    return out


def _match_texts(
    check: _Checker, item: YamlMap, key: str, what: str, expect: str
) -> tuple[str, ...]:
    """An example's ``evidence`` or ``advice``: texts a matching example's finding must hold."""
    value = item.get(key) or ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(e, str) and e for e in value):
        check.add(check.line_of(item, key), f"{what}'{key}' must be text or a list of it")
        return ()
    if value and expect != "match":
        check.add(check.line_of(item, key), f"{what}'{key}' is for 'match' examples")
    return tuple(value)


def _resolve_example(rule_path: Path, file: str) -> Path | None:
    """Find an example file: relative to the rule, its parents, or the bundled examples."""
    candidates = [rule_path.parent / file, rule_path.parent.parent / file]
    data = Path(__file__).resolve().parent.parent / "_data"
    candidates.append(data / "examples" / Path(file).name)
    for c in candidates:
        if c.is_file():
            return c
    return None


def _example_dumps(check: _Checker, item: YamlMap, what: str, path: Path) -> tuple[str, ...]:
    """An example's ``dumps``: each a directory or a file, found as :func:`_resolve_dumps` says."""
    raw = item.get("dumps")
    if raw is None:
        return ()
    line = check.line_of(item, "dumps")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(d, str) and d for d in items):
        check.add(line, f"{what}'dumps' must be a path or a list of paths")
        return ()
    out: list[str] = []
    for d in items:
        found = _resolve_dumps(path, d)
        if found is None:
            check.add(line, f"{what}dumps '{d}' not found (a directory or a file)")
        else:
            out.append(str(found))
    return tuple(out)


def _resolve_dumps(rule_path: Path, name: str) -> Path | None:
    """Find an example's dumps: relative to the rule, its parent, or the bundled dumps.

    Built-in rules name ``fixtures/fr/<scenario>``, shipped as ``_data/fr/<scenario>``.
    """
    data = Path(__file__).resolve().parent.parent / "_data" / "fr"
    for c in (rule_path.parent / name, rule_path.parent.parent / name, data / Path(name).name):
        if c.is_dir() or c.is_file():
            return c
    return None
