"""YAML rule and signal files in, validated :class:`Rule` and :class:`Signal` objects out.

Input: directories of ``*.yaml`` rules and ``signals/*.yaml`` signal families (the built-ins,
``--rules DIR`` and ``NCCL_TRIAGE_RULES``). Output: a :class:`Ruleset`, or a
:class:`RuleError` listing every problem of every file as ``file:line: message``.

Files come from other teams: YAML is read with the safe loader (no tags that build objects),
duplicate keys and aliases are rejected, unknown keys are errors that name the allowed ones, and
every pattern is compiled by RE2, whose matching time is linear in the input whatever the
pattern. The keys, their types, allowed values and defaults are declared once in :data:`SHAPES`,
which the JSON Schema of rule files (``nccl-triage rules schema``) is generated from.
Only this module imports yaml.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import re2
import yaml

from nccl_triage.errors import RuleError
from nccl_triage.model import (
    Clause,
    Condition,
    Example,
    JobFacts,
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
    "rank_crashed",
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

# ----------------------------------------------------------------------------- the file format
# One declarative description of rule and signal files. The loader takes its key sets, required
# keys, allowed values and defaults from here, and ``nccl-triage rules schema`` turns the same
# description into docs/rule-schema.json, so the two can never disagree.


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a rule or signal file.

    ``type`` is one of: ``text`` (a non-empty string), ``choice`` (one of ``values``),
    ``probability`` (a number from 0 to 1), ``count`` (a non-negative number), ``flag``
    (true/false), ``event`` (an event kind or a signal id), ``regex`` (RE2), ``strings`` (a
    string or a list of strings), ``urls`` (a URL or a list of them, at least one http(s)),
    ``conditions`` (field: value tests), ``facts`` (the same over job facts), ``object:NAME``
    and ``list:NAME`` (one or a list of the :data:`SHAPES` entry NAME), ``patterns`` (a list of
    regex strings or pattern mappings).
    """

    name: str
    type: str
    doc: str
    required: bool = False
    values: tuple[str, ...] = ()
    default: Any = None
    pattern: str = ""  # a regex the value should match (checked by ``rules lint``)


@dataclass(frozen=True, slots=True)
class Shape:
    """A mapping of a rule or signal file: its keys, in the order messages list them."""

    name: str
    doc: str
    keys: tuple[Key, ...]
    one_of: tuple[str, ...] = ()  # exactly one of these keys must be given

    @property
    def names(self) -> tuple[str, ...]:
        """The allowed keys."""
        return tuple(k.name for k in self.keys)

    @property
    def required(self) -> tuple[str, ...]:
        """The keys that must be given."""
        return tuple(k.name for k in self.keys if k.required)

    def key(self, name: str) -> Key:
        """The key called ``name``."""
        return next(k for k in self.keys if k.name == name)


# Condition operators and the value each takes (``where:`` and ``facts:``).
OPERATOR_TYPES: dict[str, str] = {
    "eq": "any",
    "ne": "any",
    "in": "list",
    "gt": "number",
    "ge": "number",
    "lt": "number",
    "le": "number",
    "matches": "regex",
    "exists": "flag",
}
EVENT_KINDS = (*(k.value for k in Kind if k != Kind.WATCHDOG_STATUS), "failure")
FACT_NAMES = tuple(f.name for f in fields(JobFacts))

_WINDOW_DOC = "how far from the trigger the event may be; both limits apply when both are given"
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            "rule",
            "A diagnosis rule: rules/<id>.yaml (one rule a file).",
            (
                Key(
                    "id",
                    "text",
                    "kebab-case, stable, never reused, equal to the file name",
                    required=True,
                    pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$",
                ),
                Key("title", "text", "one line: what went wrong", required=True),
                Key("cause", "choice", "the root cause (spec/causes.md)", True, CAUSES),
                Key(
                    "severity",
                    "choice",
                    "how bad it is",
                    True,
                    tuple(s.value for s in Severity),
                ),
                Key(
                    "confidence",
                    "probability",
                    "how sure a firing makes us; orders the diagnoses",
                    default=0.5,
                ),
                Key("description", "text", "the docs of the rule (rules list --format md)"),
                Key("owner", "text", "the team that maintains the rule"),
                Key("match", "object:match", "the trigger: the failure this rule explains", True),
                Key("context", "list:clause", "events that must (or must not) be near the trigger"),
                Key("facts", "facts", "conditions on the job facts (ranks, timeouts, versions)"),
                Key("advice", "text", "the advice template's file name (*.md.j2)", required=True),
                Key("references", "urls", "links to docs or runbooks; at least one URL", True),
                Key(
                    "examples",
                    "list:example",
                    "logs the rule must fire on (match) and stay silent on (no-match)",
                    True,
                ),
            ),
        ),
        Shape(
            "match",
            "The trigger event.",
            (
                Key("event", "event", "an event kind, or 'failure' for any failure", True),
                Key("where", "conditions", "tests on the event's fields"),
            ),
        ),
        Shape(
            "clause",
            "A context clause: an event or signal near the trigger, or its absence.",
            (
                Key("event", "event", "an event kind or a signal id", required=True),
                Key("where", "conditions", "tests on the event's fields"),
                Key("within", "object:within", _WINDOW_DOC),
                Key(
                    "direction",
                    "choice",
                    "where the event may be, relative to the trigger",
                    values=("before", "after", "around"),
                    default="before",
                ),
                Key("present", "flag", "false: the event must NOT be there", default=True),
                Key("same_rank", "flag", "the event must be on the trigger's rank", default=False),
                Key("other_rank", "flag", "the event must be on another rank", default=False),
            ),
        ),
        Shape(
            "within",
            "A window around the trigger.",
            (
                Key("lines", "count", "at most this many lines away"),
                Key("seconds", "count", "at most this many seconds away (lines with times)"),
            ),
        ),
        Shape(
            "example",
            "An example log: inline (log) or a file relative to the rule file (file).",
            (
                Key("name", "text", "descriptive, unique within the rule", required=True),
                Key("expect", "choice", "fire or stay silent", True, ("match", "no-match")),
                Key("log", "text", "the log itself (up to ~20 lines)"),
                Key("file", "text", "a log file, relative to the rule file"),
            ),
            one_of=("log", "file"),
        ),
        Shape(
            "signal",
            "A signal family: rules/signals/<id>.yaml, named RE2 patterns for context lines.",
            (
                Key(
                    "id",
                    "text",
                    "snake_case, equal to the file name; rules name it in 'event'",
                    required=True,
                    pattern=r"^[a-z0-9]+(?:_[a-z0-9]+)*$",
                ),
                Key("description", "text", "what the lines mean", required=True),
                Key(
                    "ignore_case",
                    "flag",
                    "do not use: the candidate scan never tries such patterns; write (?i:...) "
                    "in the regex and list each spelling of the anchors",
                    default=False,
                ),
                Key("patterns", "patterns", "the patterns, each a regex or a mapping", True),
                Key(
                    "exclude",
                    "strings",
                    "RE2 regexes of near-misses: a line matching one is not this signal "
                    "(loading is not saving)",
                ),
            ),
        ),
        Shape(
            "pattern",
            "One pattern of a signal.",
            (
                Key("name", "text", "names the pattern in evidence and --explain"),
                Key("regex", "regex", "RE2 syntax: no backreferences, no lookarounds", True),
                Key(
                    "anchors",
                    "strings",
                    "literal phrases every match contains; only lines holding one are tried",
                ),
                Key(
                    "target",
                    "choice",
                    "what the regex reads: the whole line, or the message after the prefixes "
                    "(ranks, timestamps, launchers) are peeled, so ^ anchors at its start",
                    values=("line", "message"),
                    default="line",
                ),
            ),
        ),
    )
}
RULE_KEYS = SHAPES["rule"].names
REQUIRED_RULE_KEYS = SHAPES["rule"].required
CLAUSE_KEYS = SHAPES["clause"].names
MATCH_KEYS = SHAPES["match"].names
WITHIN_KEYS = SHAPES["within"].names
DIRECTIONS = SHAPES["clause"].key("direction").values
EXAMPLE_KEYS = SHAPES["example"].names
EXPECTS = SHAPES["example"].key("expect").values
SIGNAL_KEYS = SHAPES["signal"].names
PATTERN_KEYS = SHAPES["pattern"].names
OPERATORS = tuple(OPERATOR_TYPES)


class _Map(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class _Seq(list[Any]):
    line: int = 0


class _Loader(yaml.SafeLoader):
    """Safe loader that records line numbers and refuses duplicate keys and aliases."""

    problems: list[tuple[int, str]]

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # Aliases (*name) let a few lines expand into an exponentially large document (the
        # "billion laughs"); rule files never need them.
        if self.check_event(yaml.AliasEvent):
            mark = self.get_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are not allowed in rule files",
                mark,
            )
        return super().compose_node(parent, index)


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


def line_of(obj: Any, key: str | None = None) -> int:
    """The 1-based line of a mapping or list read by :func:`load_yaml`, or of one of its keys."""
    if isinstance(obj, _Map):
        return obj.key_lines.get(key, obj.line) if key else obj.line
    return int(getattr(obj, "line", 0))


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
    except yaml.constructor.ConstructorError as exc:
        # A tag that would build a Python object (!!python/object/apply:os.system, ...): the
        # safe loader has no constructor for it, so nothing was built.
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        tag = (exc.problem or "").rpartition("tag ")[2].strip(" '") or "?"
        tag = tag.replace("tag:yaml.org,2002:", "!!")
        msg = f"tag {tag!r} refused: rule files are plain data, tags that build objects are not allowed"
        return None, [f"{path}:{line}: invalid YAML: {msg}"]
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
    here = Path(__file__).resolve().parent.parent
    data = here / "_data"
    if (data / "rules").is_dir():
        return data / "rules", data / "templates"
    root = here.parent.parent
    return root / "rules", root / "templates"


def source_dirs(extra_dirs: Iterable[str | Path] = (), builtin: bool = True) -> list[Path]:
    """The rule directories in load order: built-ins, ``NCCL_TRIAGE_RULES``, then ``extra_dirs``.

    A directory named twice (``--rules rules/`` next to the built-ins) is loaded once.
    """
    dirs: list[Path] = []
    if builtin:
        dirs.append(builtin_dirs()[0])
    env = os.environ.get("NCCL_TRIAGE_RULES", "")
    dirs.extend(Path(p) for p in env.split(os.pathsep) if p)
    dirs.extend(Path(d) for d in extra_dirs)
    seen: set[Path] = set()
    out: list[Path] = []
    for d in dirs:
        key = d.resolve()
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def collect_ruleset(
    extra_dirs: Iterable[str | Path] = (), builtin: bool = True
) -> tuple[Ruleset, list[str]]:
    """Load what is valid and collect every problem of every file (``rules lint``).

    Returns the ruleset of the valid rules and signals, and the problems as ``file:line: msg``.
    """
    problems: list[str] = []
    ruleset = Ruleset()
    if builtin:
        ruleset.template_dirs.append(builtin_dirs()[1])
    by_id: dict[str, int] = {}
    signal_ids: dict[str, int] = {}
    for d in source_dirs(extra_dirs, builtin):
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
    return ruleset, problems


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
    ruleset, problems = collect_ruleset(extra_dirs, builtin)
    ids = {r.id for r in ruleset.rules}
    only_set, disable_set = set(only), set(disable)
    problems.extend(
        f"--only/--disable: no rule '{rid}' (known: {', '.join(sorted(ids))})"
        for rid in sorted((only_set | disable_set) - ids)
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
            hint = ""
            if isinstance(value, bool):
                hint = " (YAML reads an unquoted yes/no/on/off/true/false as a boolean: quote it)"
            self.add(self.line_of(obj, key), f"{what}'{key}' must be a non-empty string{hint}")
            return None
        return value


def _open_mapping(path: Path, expected: str) -> tuple[_Map | None, _Checker]:
    """Read a rule or signal file; its top level must be a mapping (``expected`` says of what)."""
    data, errors = load_yaml(path)
    check = _Checker(path)
    check.problems.extend(errors)
    if isinstance(data, _Map):
        return data, check
    if data is not None or not errors:
        check.add(1, f"a {expected}")
    return None, check


def _load_signal(path: Path) -> tuple[Signal | None, list[str]]:
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
    if check.problems or sid is None:
        return None, check.problems
    return Signal(
        sid,
        description,
        tuple(patterns),
        ignore_case,
        Location(str(path), data.line),
        tuple(exclude),
    ), []


def compile_error(regex: str, ignore_case: bool = False) -> str | None:
    """Return why RE2 rejects a pattern, or None when it compiles."""
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False  # the reason is returned; RE2 need not print it on stderr too
    try:
        re2.compile(regex, options)
    except Exception as exc:  # noqa: BLE001 - re2.error, and plain errors for some inputs
        arg = exc.args[0] if exc.args else ""
        reason = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
        reason = reason or type(exc).__name__
        if any(op in regex for op in ("(?=", "(?!", "(?<=", "(?<!")) or re2.search(
            r"\\[1-9]", regex
        ):
            reason += (
                " (RE2 has no backreferences or lookarounds; that is what keeps matching linear"
                " in the input, so a pattern cannot hang the tool)"
            )
        return reason
    return None


def _load_rule(path: Path) -> tuple[Rule | None, list[str]]:
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
            f"cause '{cause}' is not in spec/causes.md (expected one of: {', '.join(CAUSES)})",
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
    shape = SHAPES["clause"]
    direction = obj.get("direction", shape.key("direction").default)
    if direction not in DIRECTIONS:
        check.add(
            check.line_of(obj, "direction"),
            f"{what}direction '{direction}' (expected one of: {', '.join(DIRECTIONS)})",
        )
    flags = {}
    for key in ("present", "same_rank", "other_rank"):
        default = bool(shape.key(key).default)
        value = obj.get(key, default)
        if not isinstance(value, bool):
            check.add(check.line_of(obj, key), f"{what}'{key}' must be true or false")
            value = default
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


def _conditions(
    check: _Checker, obj: Any, what: str, line: int, names: tuple[str, ...] = ()
) -> list[Condition]:
    if obj is None:
        return []
    if not isinstance(obj, _Map):
        check.add(line, f"{what}must be a mapping of field: value")
        return []
    out: list[Condition] = []
    for fname, spec in obj.items():
        fline = check.line_of(obj, fname)
        if names and fname not in names:
            check.add(fline, f"{what}unknown fact '{fname}' (expected: {', '.join(names)})")
            continue
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
        if sum(item.get(k) is not None for k in SHAPES["example"].one_of) != 1:
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
    data = Path(__file__).resolve().parent.parent / "_data"
    candidates.append(data / "examples" / Path(file).name)
    for c in candidates:
        if c.is_file():
            return c
    return None
