"""YAML rule and signal files in, validated :class:`Rule` and :class:`Signal` objects out.

Input: directories of ``*.yaml`` rules and ``signals/*.yaml`` signal families (the built-ins,
``--rules DIR`` and ``NCCL_TRIAGE_RULES``). Output: a :class:`Ruleset`, or a
:class:`RuleError` listing every problem of every file as ``file:line: message``.

Files come from other teams: YAML is read with the safe loader (no tags that build objects),
duplicate keys are rejected, unknown keys are errors that name the allowed ones, and every
pattern is compiled by RE2, whose matching time is linear in the input whatever the pattern.
Only this module imports yaml.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2
import yaml

from nccl_triage.errors import RuleError
from nccl_triage.model import (
    Clause,
    Condition,
    Example,
    Kind,
    Location,
    Pattern,
    Rule,
    Severity,
    Signal,
)

# spec/causes.md: the only values a diagnosis's cause may take.
CAUSES = (
    "slow_checkpoint_save",
    "oom_hidden",
    "generate_zero3",
    "network_interface_misconfig",
    "network_fabric_failure",
    "rank_desync_or_mismatched_collective",
    "straggler_or_slow_rank",
    "hardware_gpu_fault",
    "version_or_driver_incompatibility",
    "timeout_too_short",
    "unknown",
)
RULE_KEYS = (
    "id",
    "title",
    "cause",
    "severity",
    "confidence",
    "description",
    "owner",
    "match",
    "context",
    "facts",
    "advice",
    "references",
    "examples",
)
REQUIRED_RULE_KEYS = (
    "id",
    "title",
    "cause",
    "severity",
    "match",
    "advice",
    "references",
    "examples",
)
CLAUSE_KEYS = ("event", "where", "within", "direction", "present", "same_rank", "other_rank")
MATCH_KEYS = ("event", "where")
WITHIN_KEYS = ("lines", "seconds")
DIRECTIONS = ("before", "after", "around")
EXAMPLE_KEYS = ("name", "expect", "log", "file")
EXPECTS = ("match", "no-match")
SIGNAL_KEYS = ("id", "description", "ignore_case", "patterns")
PATTERN_KEYS = ("name", "regex", "anchors")
OPERATORS = ("eq", "ne", "in", "gt", "ge", "lt", "le", "matches", "exists")
EVENT_KINDS = (*(k.value for k in Kind if k != Kind.WATCHDOG_STATUS), "failure")


class _Map(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class _Seq(list[Any]):
    line: int = 0


class _Loader(yaml.SafeLoader):
    """Safe loader that records line numbers and refuses duplicate keys."""

    problems: list[tuple[int, str]]


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Map:
    out = _Map()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if key in out:
            loader.problems.append((key_node.start_mark.line + 1, f"duplicate key '{key}'"))
            continue
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(path: Path) -> tuple[Any, list[str]]:
    """Read one YAML file safely; return the data and its problems as ``file:line: msg``."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {exc}"]
    loader = _Loader(text)
    loader.problems = []
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        return None, [f"{path}:{line}: invalid YAML: {exc.problem or exc}"]
    except yaml.YAMLError as exc:
        return None, [f"{path}: invalid YAML: {exc}"]
    finally:
        loader.dispose()
    return data, [f"{path}:{line}: {msg}" for line, msg in loader.problems]


@dataclass
class Ruleset:
    """Validated rules and signals, and where their templates live."""

    rules: list[Rule] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)
    template_dirs: list[Path] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # e.g. a team rule replacing a built-in

    def rule(self, rule_id: str) -> Rule | None:
        """Return the rule with this id, if any."""
        return next((r for r in self.rules if r.id == rule_id), None)

    @property
    def version(self) -> str:
        """A digest of every rule, signal and template: results cached under it stay valid."""
        import hashlib

        h = hashlib.sha256()
        for loc in sorted(
            {str(r.source.source) for r in self.rules} | {s.source.source for s in self.signals}
        ):
            h.update(Path(loc).read_bytes() if Path(loc).is_file() else loc.encode())
        for d in self.template_dirs:
            for p in sorted(d.glob("*.j2")):
                h.update(p.read_bytes())
        return h.hexdigest()[:16]


def builtin_dirs() -> tuple[Path, Path]:
    """Return the built-in rules and templates directories (source tree or installed wheel)."""
    here = Path(__file__).resolve().parent
    data = here / "_data"
    if (data / "rules").is_dir():
        return data / "rules", data / "templates"
    root = here.parent.parent
    return root / "rules", root / "templates"


def load_ruleset(
    extra_dirs: Iterable[str | Path] = (),
    builtin: bool = True,
    only: Iterable[str] = (),
    disable: Iterable[str] = (),
) -> Ruleset:
    """Load the built-in rules, then each team directory (a team rule replaces a built-in).

    ``NCCL_TRIAGE_RULES`` (a path list, ``os.pathsep``-separated) adds directories too.

    Raises:
        RuleError: any file is invalid; the message lists every problem of every file.
    """
    dirs: list[Path] = []
    if builtin:
        dirs.append(builtin_dirs()[0])
    env = os.environ.get("NCCL_TRIAGE_RULES", "")
    dirs.extend(Path(p) for p in env.split(os.pathsep) if p)
    dirs.extend(Path(d) for d in extra_dirs)
    problems: list[str] = []
    ruleset = Ruleset()
    if builtin:
        ruleset.template_dirs.append(builtin_dirs()[1])
    by_id: dict[str, int] = {}
    signal_ids: dict[str, int] = {}
    for d in dirs:
        if not d.is_dir():
            problems.append(f"{d}: not a directory of rules")
            continue
        for tdir in (d / "templates", d):
            if tdir.is_dir() and any(tdir.glob("*.j2")) and tdir not in ruleset.template_dirs:
                ruleset.template_dirs.insert(0, tdir)
        sig_dir = d / "signals"
        for path in sorted(sig_dir.glob("*.yaml")) if sig_dir.is_dir() else []:
            sig, errs = _load_signal(path)
            problems.extend(errs)
            if sig is None:
                continue
            if sig.id in signal_ids:
                ruleset.notices.append(f"{path}: signal '{sig.id}' replaces the one loaded before")
                ruleset.signals[signal_ids[sig.id]] = sig
            else:
                signal_ids[sig.id] = len(ruleset.signals)
                ruleset.signals.append(sig)
        for path in sorted(d.glob("*.yaml")):
            rule, errs = _load_rule(path)
            problems.extend(errs)
            if rule is None:
                continue
            if rule.id in by_id:
                ruleset.notices.append(f"{path}: rule '{rule.id}' replaces the one loaded before")
                ruleset.rules[by_id[rule.id]] = rule
            else:
                by_id[rule.id] = len(ruleset.rules)
                ruleset.rules.append(rule)
    known = set(EVENT_KINDS) | set(signal_ids)
    problems.extend(
        f"{rule.source}: unknown event or signal '{clause.event}' "
        f"(expected one of: {', '.join(sorted(known))})"
        for rule in ruleset.rules
        for clause in (rule.match, *rule.context)
        if clause.event not in known
    )
    only_set, disable_set = set(only), set(disable)
    problems.extend(
        f"--only/--disable: no rule '{rid}' (known: {', '.join(sorted(by_id))})"
        for rid in sorted((only_set | disable_set) - set(by_id))
    )
    if problems:
        raise RuleError("", "\n".join(problems))
    if only_set:
        ruleset.rules = [r for r in ruleset.rules if r.id in only_set]
    ruleset.rules = [r for r in ruleset.rules if r.id not in disable_set]
    return ruleset


# ----------------------------------------------------------------------------- checks


class _Checker:
    """Collects problems for one file, each with its line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []

    def add(self, line: int, msg: str) -> None:
        self.problems.append(f"{self.path}:{line}: {msg}")

    def keys(self, obj: _Map, allowed: tuple[str, ...], what: str) -> None:
        for key in obj:
            if key not in allowed:
                self.add(
                    obj.key_lines.get(key, obj.line),
                    f"{what}unknown key '{key}' (expected: {', '.join(allowed)})",
                )

    def line_of(self, obj: Any, key: str | None = None) -> int:
        if isinstance(obj, _Map):
            return obj.key_lines.get(key, obj.line) if key else obj.line
        return getattr(obj, "line", 0)

    def string(self, obj: _Map, key: str, what: str = "", required: bool = True) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                self.add(obj.line, f"{what}missing key '{key}'")
            return None
        if not isinstance(value, str) or not value.strip():
            self.add(self.line_of(obj, key), f"{what}'{key}' must be a non-empty string")
            return None
        return value


def _load_signal(path: Path) -> tuple[Signal | None, list[str]]:
    data, errors = load_yaml(path)
    check = _Checker(path)
    check.problems.extend(errors)
    if not isinstance(data, _Map):
        if data is not None or not errors:
            check.add(1, "a signal file must be a mapping with id, description, patterns")
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
            item = _Map(regex=item)
            item.line = raw.line if isinstance(raw, _Seq) else 0
            item.key_lines = {}
        if not isinstance(item, _Map):
            check.add(check.line_of(raw), f"{what}must be a regex string or a mapping")
            continue
        check.keys(item, PATTERN_KEYS, what)
        regex = check.string(item, "regex", what)
        if regex is None:
            continue
        err = compile_error(regex, ignore_case)
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
        patterns.append(Pattern(str(item.get("name") or f"{sid}-{i}"), regex, tuple(anchors)))
    if check.problems or sid is None:
        return None, check.problems
    return Signal(
        sid, description, tuple(patterns), ignore_case, Location(str(path), data.line)
    ), []


def compile_error(regex: str, ignore_case: bool = False) -> str | None:
    """Return why RE2 rejects a pattern, or None when it compiles."""
    options = re2.Options()
    options.case_sensitive = not ignore_case
    try:
        re2.compile(regex, options)
    except re2.error as exc:
        return str(exc) or "invalid pattern"
    except Exception as exc:  # noqa: BLE001 - the binding raises plain errors for some inputs
        return str(exc) or type(exc).__name__
    return None


def _load_rule(path: Path) -> tuple[Rule | None, list[str]]:
    data, errors = load_yaml(path)
    check = _Checker(path)
    check.problems.extend(errors)
    if not isinstance(data, _Map):
        if data is not None or not errors:
            check.add(1, "a rule file must be a mapping (id, title, cause, match, ...)")
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
            f"cause '{cause}' is not in spec/causes.md (expected one of: {', '.join(CAUSES)})",
        )
    sev_raw = data.get("severity", "medium")
    try:
        severity = Severity(sev_raw)
    except ValueError:
        check.add(
            check.line_of(data, "severity"),
            f"severity '{sev_raw}' (expected one of: {', '.join(s.value for s in Severity)})",
        )
        severity = Severity.MEDIUM
    confidence = data.get("confidence", 0.5)
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
    facts = _conditions(check, data.get("facts"), "facts: ", check.line_of(data, "facts"))
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
    if not isinstance(obj, _Map):
        check.add(line, f"{what}must be a mapping with an 'event' key")
        return None
    check.keys(obj, allowed, what)
    event = check.string(obj, "event", what)
    where = _conditions(check, obj.get("where"), f"{what}where: ", check.line_of(obj, "where"))
    lines = seconds = None
    within = obj.get("within")
    if within is not None:
        if not isinstance(within, _Map):
            check.add(
                check.line_of(obj, "within"), f"{what}'within' must be a mapping (lines, seconds)"
            )
        else:
            check.keys(within, WITHIN_KEYS, f"{what}within: ")
            lines = _number(check, within, "lines", what, int)
            seconds = _number(check, within, "seconds", what, float)
    direction = obj.get("direction", "before")
    if direction not in DIRECTIONS:
        check.add(
            check.line_of(obj, "direction"),
            f"{what}direction '{direction}' (expected one of: {', '.join(DIRECTIONS)})",
        )
    flags = {}
    for key in ("present", "same_rank", "other_rank"):
        value = obj.get(key, key == "present")
        if not isinstance(value, bool):
            check.add(check.line_of(obj, key), f"{what}'{key}' must be true or false")
            value = key == "present"
        flags[key] = value
    if event is None:
        return None
    return Clause(
        event,
        tuple(where),
        lines,
        seconds,
        str(direction),
        flags["present"],
        flags["same_rank"],
        flags["other_rank"],
    )


def _number(check: _Checker, obj: _Map, key: str, what: str, kind: type) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        check.add(check.line_of(obj, key), f"{what}within.{key} must be a non-negative number")
        return None
    return kind(value)


def _conditions(check: _Checker, obj: Any, what: str, line: int) -> list[Condition]:
    if obj is None:
        return []
    if not isinstance(obj, _Map):
        check.add(line, f"{what}must be a mapping of field: value")
        return []
    out: list[Condition] = []
    for fname, spec in obj.items():
        fline = check.line_of(obj, fname)
        if isinstance(spec, _Map):
            for op, value in spec.items():
                if op not in OPERATORS:
                    check.add(
                        spec.key_lines.get(op, fline),
                        f"{what}{fname}: unknown operator '{op}' (expected: {', '.join(OPERATORS)})",
                    )
                    continue
                if op == "matches":
                    if not isinstance(value, str):
                        check.add(fline, f"{what}{fname}: 'matches' takes a regex string")
                        continue
                    err = compile_error(value)
                    if err:
                        check.add(fline, f"{what}{fname}: regex does not compile under RE2: {err}")
                        continue
                if op in ("gt", "ge", "lt", "le") and (
                    isinstance(value, bool) or not isinstance(value, int | float)
                ):
                    check.add(fline, f"{what}{fname}: '{op}' takes a number")
                    continue
                out.append(Condition(str(fname), str(op), _plain(value)))
        elif isinstance(spec, list):
            out.append(Condition(str(fname), "in", tuple(_plain(v) for v in spec)))
        else:
            out.append(Condition(str(fname), "eq", _plain(spec)))
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
        if not isinstance(item, _Map):
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
        if (log is None) == (file is None):
            check.add(item.line, f"{what}give exactly one of 'log' or 'file'")
            continue
        if file is not None:
            resolved = _resolve_example(path, str(file))
            if resolved is None:
                check.add(check.line_of(item, "file"), f"{what}file '{file}' not found")
                continue
            file = str(resolved)
        out.append(
            Example(
                name,
                str(expect),
                log if log is None else str(log),
                file,
                Location(str(path), item.line),
            )
        )
    matches = [e for e in out if e.expect == "match"]
    if not any(e.expect == "no-match" for e in out) or not matches:
        check.add(line, "examples need at least one 'match' and one 'no-match' example")
    return out


def _resolve_example(rule_path: Path, file: str) -> Path | None:
    """Find an example file: relative to the rule, its parents, or the bundled examples."""
    candidates = [rule_path.parent / file, rule_path.parent.parent / file]
    data = Path(__file__).resolve().parent / "_data"
    candidates.append(data / "examples" / Path(file).name)
    for c in candidates:
        if c.is_file():
            return c
    return None
