"""Writing rules: lint, test, scaffold, list and show them; the JSON Schema of their files.

Input: rule directories (the built-ins, team directories, ``NCCL_TRIAGE_RULES``). Output: plain
data and text for ``nccl-triage rules``: problems as ``file:line: message``, example results,
the files of a new rule, the rule reference in Markdown, and the JSON Schema that editors use
to check rule files while people type. The schema is generated from :data:`ruleset.SHAPES`,
the same description the loader checks files against. No click here: the CLI only formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2

from nccl_triage.authoring.examples import ExampleResult, run_example
from nccl_triage.errors import TemplateError, TriageError
from nccl_triage.model import Clause, Condition, Rule, Signal
from nccl_triage.ruleset.core import (
    CAUSES,
    EVENT_KINDS,
    FACT_NAMES,
    OPERATOR_TYPES,
    SHAPES,
    Key,
    Ruleset,
    Shape,
    builtin_dirs,
    collect_ruleset,
    line_of,
    load_yaml,
    source_dirs,
)

SCHEMA_COMMAND = "nccl-triage rules schema > docs/rule-schema.json"
REFERENCE_COMMAND = "nccl-triage rules list --format md > docs/rules.md"
PLACEHOLDER = "TODO"  # what ``rules new`` leaves for the author to fill in; lint finds it
_PLACEHOLDER_RE = re.compile(rf"\b{PLACEHOLDER}\b")
_LOCATED = re.compile(r"^(?P<path>.+?):(?P<line>\d+): ")


# ----------------------------------------------------------------------------- loading


@dataclass
class Selection:
    """The ruleset an author works with, and the part of it under their hands."""

    ruleset: Ruleset
    problems: list[str]
    targets: list[Path]  # the directories being linted or tested
    rules: list[Rule] = field(default_factory=list)  # the valid rules of the targets
    signals: list[Signal] = field(default_factory=list)  # the valid signals of the targets


def select(dirs: Sequence[str | Path] = (), builtin: bool = True) -> Selection:
    """Load the built-ins, ``NCCL_TRIAGE_RULES`` and ``dirs``; pick the rules of ``dirs``.

    Team rules are loaded next to the built-ins so they can name built-in signals. With no
    ``dirs``, every loaded directory is the target.
    """
    ruleset, problems = collect_ruleset(dirs, builtin)
    targets = [Path(d) for d in dirs] or source_dirs((), builtin)
    roots = {t.resolve() for t in targets}
    rules = [r for r in ruleset.rules if Path(r.source.source).resolve().parent in roots]
    signals = [s for s in ruleset.signals if Path(s.source.source).resolve().parent.parent in roots]
    return Selection(ruleset, problems, targets, rules, signals)


# ----------------------------------------------------------------------------- lint


@dataclass
class LintResult:
    """What ``rules lint`` found."""

    problems: list[str]  # ``file:line: message``, in file and line order
    notices: list[str]
    files: int
    rules: int
    signals: int


def lint(dirs: Sequence[str | Path] = (), builtin: bool = True) -> LintResult:
    """Check rule directories: everything the loader checks, and what only examples show.

    Beyond the loader's schema, causes, RE2 patterns, examples of both kinds and reference URLs:
    ids unique across the directories and named as the style asks; advice templates present and
    rendering on every matching example; signal patterns that the candidate scan can reach;
    placeholders left by ``rules new``.
    """
    sel = select(dirs, builtin)
    problems = list(sel.problems)
    files: list[Path] = []
    for target in sel.targets:
        if not target.is_dir():
            continue  # the loader said so
        rule_files = sorted(target.glob("*.yaml"))
        signal_files = sorted((target / "signals").glob("*.yaml"))
        files += rule_files + signal_files
        if not rule_files and not signal_files:
            problems.append(f"{target}: no rule files (*.yaml) or signal files (signals/*.yaml)")
        problems.extend(
            f"{p}:1: not loaded: rule and signal files end in .yaml"
            for p in sorted([*target.glob("*.yml"), *(target / "signals").glob("*.yml")])
        )
    problems += _duplicates(sel.targets)
    problems += _names(files)
    problems += _placeholders(files, sel)
    for rule in sel.rules:
        problems += _lint_rule(rule, sel.ruleset)
    problems += _lint_signals(sel)
    return LintResult(
        _ordered(problems), sel.ruleset.notices, len(files), len(sel.rules), len(sel.signals)
    )


def _ordered(problems: Iterable[str]) -> list[str]:
    def key(p: str) -> tuple[str, int]:
        m = _LOCATED.match(p)
        return (m["path"], int(m["line"])) if m else (p.split(": ", 1)[0], 0)

    return sorted(dict.fromkeys(problems), key=key)


def _duplicates(targets: Sequence[Path]) -> list[str]:
    """Ids defined in two of the linted directories (a built-in's id is a replacement)."""
    out: list[str] = []
    for what, sub in (("rule", ""), ("signal", "signals")):
        first: dict[str, Path] = {}
        for target in targets:
            for path in sorted((target / sub).glob("*.yaml")) if (target / sub).is_dir() else []:
                if path.stem in first:
                    out.append(
                        f"{path}:1: {what} '{path.stem}' is also defined in {first[path.stem]}: "
                        "ids must be unique"
                    )
                else:
                    first[path.stem] = path
    return out


def _names(files: Iterable[Path]) -> list[str]:
    """Ids in the style of the built-ins: kebab-case rules, snake_case signals."""
    out: list[str] = []
    for path in files:
        shape = SHAPES["signal" if path.parent.name == "signals" else "rule"]
        data, _ = load_yaml(path)
        rid = data.get("id") if isinstance(data, dict) else None
        key = shape.key("id")
        if isinstance(rid, str) and rid and not re.match(key.pattern, rid):
            style = "kebab-case" if shape.name == "rule" else "snake_case"
            out.append(f"{path}:{line_of(data, 'id')}: id '{rid}' should be {style} ({key.doc})")
        if shape.name == "signal" and rid in EVENT_KINDS:
            out.append(
                f"{path}:{line_of(data, 'id')}: signal id '{rid}' is an event kind of the "
                "grammar: choose another name"
            )
    return out


def _placeholders(files: Iterable[Path], sel: Selection) -> list[str]:
    templates = {
        path
        for rule in sel.rules
        if (path := _template_path(rule, sel.ruleset)) is not None
        and any(path.resolve().is_relative_to(t.resolve()) for t in sel.targets)
    }
    out: list[str] = []
    for path in [*files, *sorted(templates)]:
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # the loader reports unreadable rule files
        out.extend(
            f"{path}:{n}: placeholder '{PLACEHOLDER}' left to fill in"
            for n, line in enumerate(text.splitlines(), 1)
            if _PLACEHOLDER_RE.search(line) and not line.lstrip().startswith(("#", "{#"))
        )
    return out


def _template_path(rule: Rule, ruleset: Ruleset) -> Path | None:
    return next(
        (d / rule.advice for d in ruleset.template_dirs if (d / rule.advice).is_file()), None
    )


def _lint_rule(rule: Rule, ruleset: Ruleset) -> list[str]:
    path = rule.source.source
    data, _ = load_yaml(Path(path))
    out: list[str] = []
    if _template_path(rule, ruleset) is None:
        dirs = ", ".join(str(d) for d in ruleset.template_dirs)
        out.append(
            f"{path}:{line_of(data, 'advice')}: advice template '{rule.advice}' not found "
            f"(looked in: {dirs})"
        )
    names = [e.name for e in rule.examples]
    out.extend(
        f"{e.source}: examples: name '{e.name}' is used twice"
        for i, e in enumerate(rule.examples)
        if e.name in names[:i]
    )
    if out:
        return out
    for i, example in enumerate(rule.examples):
        if example.expect != "match":
            continue
        try:
            run_example(rule, example, ruleset)
        except TemplateError as exc:
            out.append(
                f"{example.source}: examples[{i}] '{example.name}': the advice does not render: "
                f"{exc}"
            )
        except TriageError as exc:
            out.append(f"{example.source}: examples[{i}] '{example.name}': {exc}")
    return out


def _lint_signals(sel: Selection) -> list[str]:
    """Signal patterns must be reachable: the candidate scan only reads lines holding an anchor."""
    from nccl_triage.ingest.scan import compile_anchors
    from nccl_triage.pipeline import scan_patterns

    scan = compile_anchors(scan_patterns(sel.ruleset))
    out: list[str] = []
    lines = _example_lines(sel.rules)
    for sig in sel.signals:
        path = Path(sig.source.source)
        data, _ = load_yaml(path)
        raw = data.get("patterns") if isinstance(data, dict) else None
        items = raw if isinstance(raw, list) else []
        options = re2.Options()
        options.log_errors = False
        options.case_sensitive = not sig.ignore_case
        for i, pat in enumerate(sig.patterns):
            item = items[i] if i < len(items) else None
            where = f"{path}:{line_of(item) or line_of(raw)}: patterns[{i}]"
            regex = re2.compile(pat.regex, options)
            for where_line, text in lines:
                if regex.search(text) and scan.search(text.encode("utf-8", "replace")) is None:
                    out.append(
                        f"{where}: matches {where_line}, but that line holds none of its "
                        "anchors, so the scan never reads it: add an anchor the line holds"
                    )
                    break
    return out


def _example_lines(rules: Iterable[Rule]) -> list[tuple[str, str]]:
    """(where, text) of every line of the rules' example logs."""
    out: list[tuple[str, str]] = []
    for rule in rules:
        for ex in rule.examples:
            if ex.log is not None:
                text = ex.log
            else:
                try:
                    text = Path(ex.file or "").read_text("utf-8", errors="replace")
                except OSError:
                    continue
            name = f"line {{}} of example {rule.id}::{ex.name}"
            out.extend((name.format(n), line) for n, line in enumerate(text.splitlines(), 1))
    return out


# ----------------------------------------------------------------------------- test


@dataclass
class ExampleRun:
    """What ``rules test`` ran."""

    results: list[ExampleResult]
    problems: list[str]  # rule files that do not load: nothing was run
    notices: list[str]
    selection: Selection | None = None

    @property
    def passed(self) -> int:
        """How many examples passed."""
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        """How many examples failed."""
        return len(self.results) - self.passed


def run_tests(
    dirs: Sequence[str | Path] = (),
    only: Iterable[str] = (),
    disable: Iterable[str] = (),
    builtin: bool = True,
) -> ExampleRun:
    """Run every example of the rules of ``dirs`` (all rules when none) with the whole ruleset."""
    sel = select(dirs, builtin)
    if sel.problems:
        return ExampleRun([], sel.problems, sel.ruleset.notices, sel)
    rules, problems = _pick(sel.rules, only, disable)
    if problems:
        return ExampleRun([], problems, sel.ruleset.notices, sel)
    results = [_run(rule, ex, sel.ruleset) for rule in rules for ex in rule.examples]
    return ExampleRun(
        results, [], sel.ruleset.notices, Selection(sel.ruleset, [], sel.targets, rules)
    )


def _pick(
    rules: list[Rule], only: Iterable[str], disable: Iterable[str]
) -> tuple[list[Rule], list[str]]:
    only_set, disable_set = set(only), set(disable)
    ids = {r.id for r in rules}
    problems = [
        f"--only/--disable: no rule '{rid}' here (known: {', '.join(sorted(ids))})"
        for rid in sorted((only_set | disable_set) - ids)
    ]
    picked = [r for r in rules if (not only_set or r.id in only_set) and r.id not in disable_set]
    return picked, problems


def _run(rule: Rule, example: Any, ruleset: Ruleset) -> ExampleResult:
    try:
        return run_example(rule, example, ruleset)
    except TriageError as exc:  # a template that does not render, an unreadable example file
        return ExampleResult(rule, example, False, [], str(exc), reason=str(exc))


@dataclass
class CorpusHits:
    """Which logs of a folder each rule fires on (``rules test --corpus``)."""

    logs: list[Path]
    hits: dict[str, list[tuple[Path, int, str]]]  # rule id -> (log, trigger line, top rule)
    errors: list[str]


_NOT_LOGS = {".yaml", ".yml", ".json", ".md", ".py", ".j2", ".toml"}


def corpus_hits(ruleset: Ruleset, rules: Sequence[Rule], corpus: str | Path) -> CorpusHits:
    """Triage every log under ``corpus`` and say where each of ``rules`` fires.

    Every rule of the ruleset is evaluated, as in real use; ``top rule`` is the diagnosis that
    comes first for that log, so an author sees when their rule would be a false positive.
    """
    from nccl_triage.diagnose.engine import correlate
    from nccl_triage.pipeline import triage_path

    root = Path(corpus)
    if not root.is_dir():
        raise TriageError(str(root), "not a directory")
    logs = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix not in _NOT_LOGS
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    wanted = {r.id: r for r in rules}
    hits: dict[str, list[tuple[Path, int, str]]] = {rid: [] for rid in wanted}
    errors: list[str] = []
    for log in logs:
        try:
            report = triage_path(str(log), ruleset)
        except TriageError as exc:
            errors.append(str(exc))
            continue
        if report.correlation is None:
            continue
        top = report.findings[0].rule.id if report.findings else ""
        lines = {f.rule.id: f.trigger.line for f in report.correlation.findings}
        for exp in report.correlation.explanations:
            if not exp.fired or exp.rule.id not in wanted:
                continue
            line = lines.get(exp.rule.id)
            if line is None:  # dropped from the findings (unknown when others fire)
                everything = sorted([*report.events, *report.signals], key=lambda e: e.line)
                found = correlate(everything, report.facts, [exp.rule]).findings
                line = found[0].trigger.line if found else 0
            hits[exp.rule.id].append((log, line, top))
    return CorpusHits(logs, hits, errors)


# ----------------------------------------------------------------------------- new


@dataclass
class Scaffold:
    """The files ``rules new`` wrote."""

    rule: Path
    signal: Path
    template: Path
    notices: list[str]

    @property
    def paths(self) -> list[Path]:
        """Every file written."""
        return [self.rule, self.signal, self.template]


_TIMEOUT_LINE = (
    "[rank0]:[E502 10:30:02.433063423 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600088 milliseconds before timing out."
)
_STUB_LINE = f"{PLACEHOLDER}: replace with the log line that shows the failure"


def scaffold(
    rule_id: str,
    cause: str,
    directory: str | Path = ".",
    severity: str = "high",
    force: bool = False,
) -> Scaffold:
    """Write a new rule, its signal and its advice template, with examples that pass at once.

    Raises:
        TriageError: a bad id or cause, or a file that exists (without ``force``).
    """
    rule_shape, signal_shape = SHAPES["rule"], SHAPES["signal"]
    if not re.match(rule_shape.key("id").pattern, rule_id):
        raise TriageError(
            "rules new", f"id '{rule_id}' must be kebab-case: lowercase words joined by '-'"
        )
    if cause not in CAUSES:
        raise TriageError(
            "rules new", f"cause '{cause}' is not in spec/causes.md ({', '.join(CAUSES)})"
        )
    severities = rule_shape.key("severity").values
    if severity not in severities:
        raise TriageError(
            "rules new", f"severity '{severity}' (expected one of: {', '.join(severities)})"
        )
    signal_id = rule_id.replace("-", "_")
    if not re.match(signal_shape.key("id").pattern, signal_id):  # pragma: no cover - same charset
        raise TriageError("rules new", f"cannot name a signal after '{rule_id}'")
    root = Path(directory)
    builtin_rules, builtin_templates = builtin_dirs()
    is_builtin = root.resolve() == builtin_rules.resolve()
    rule_path = root / f"{rule_id}.yaml"
    signal_path = root / "signals" / f"{signal_id}.yaml"
    template_dir = builtin_templates if is_builtin else root / "templates"
    template_path = template_dir / f"{rule_id}.md.j2"
    notices: list[str] = []
    builtin_ruleset, _ = collect_ruleset((), builtin=True)
    if not is_builtin:
        if builtin_ruleset.rule(rule_id) is not None:
            notices.append(f"rule '{rule_id}' will replace the built-in rule of that id")
        if any(s.id == signal_id for s in builtin_ruleset.signals) or signal_id in EVENT_KINDS:
            raise TriageError(
                "rules new",
                f"'{signal_id}' is already a built-in signal or event: choose another id",
            )
    existing = [p for p in (rule_path, signal_path, template_path) if p.exists()]
    if existing and not force:
        raise TriageError(
            "rules new", f"{', '.join(map(str, existing))} exists already (--force overwrites)"
        )
    signal_path.parent.mkdir(parents=True, exist_ok=True)
    template_path.parent.mkdir(parents=True, exist_ok=True)
    rule_path.write_text(_rule_stub(rule_id, cause, severity, signal_id), encoding="utf-8")
    signal_path.write_text(_signal_stub(signal_id), encoding="utf-8")
    template_path.write_text(_template_stub(), encoding="utf-8")
    return Scaffold(rule_path, signal_path, template_path, notices)


def _rule_stub(rule_id: str, cause: str, severity: str, signal_id: str) -> str:
    return f"""\
# A rule for nccl-triage: CONTRIBUTING.md ("Writing a rule") explains every key.
# Fill in each {PLACEHOLDER}, then: nccl-triage rules lint DIR && nccl-triage rules test DIR
id: {rule_id}
title: "{PLACEHOLDER}: one line saying what went wrong"
cause: {cause}
severity: {severity}
confidence: 0.7
owner: "{PLACEHOLDER}: your team"
description: >
  {PLACEHOLDER}: what happens, why the other ranks time out, and how the log shows it.
match:
  event: watchdog_timeout
context:
  - event: {signal_id}  # signals/{signal_id}.yaml
    within: {{lines: 5000, seconds: 3600}}
    direction: before
advice: {rule_id}.md.j2
references:
  - "https://example.org/{PLACEHOLDER}-your-runbook"
examples:
  - name: failure-then-timeout
    expect: match
    log: |
      {_STUB_LINE}
      {_TIMEOUT_LINE}
  - name: timeout-alone
    expect: no-match
    log: |
      {_TIMEOUT_LINE}
"""


def _signal_stub(signal_id: str) -> str:
    return f"""\
# Lines that show the failure. Patterns are RE2 (no backreferences, no lookarounds); only lines
# holding one of a pattern's anchors (literal phrases every match contains) are tried.
id: {signal_id}
description: "{PLACEHOLDER}: what these lines mean"
patterns:
  - name: {signal_id.replace("_", "-")}
    regex: '{PLACEHOLDER}: replace with the log line'
    anchors: ["{PLACEHOLDER}: replace with"]
"""


def _template_stub() -> str:
    return f"""\
{{# Advice in Markdown. Variables: rule, finding, trigger, evidence (one per context clause
   that must be present, in order), facts. Filters: ms, seconds, bytes, num. #}}
{{% set hit = evidence[0] %}}
{{% include "_timeout.md.j2" %}}

{PLACEHOLDER}: say what happened. The log shows it on {{% if hit.rank is not none %}}rank {{{{ hit.rank }}}}{{% else %}}one rank{{% endif %}} at line {{{{ hit.line }}}} (`{{{{ hit.text[:120] }}}}`), {{{{ hit.gap_lines }}}} lines before the timeout.

What to do:
- {PLACEHOLDER}: the first thing to try.
"""


# ----------------------------------------------------------------------------- list and show


def display_path(path: str | Path) -> str:
    """A rule file's path for people: ``rules/...`` for built-ins, else relative to here."""
    p = Path(path).resolve()
    for base, name in zip(builtin_dirs(), ("rules", "templates"), strict=True):
        if p.is_relative_to(base.resolve()):
            return f"{name}/{p.relative_to(base.resolve()).as_posix()}"
    try:
        return p.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def rule_rows(rules: Iterable[Rule]) -> list[tuple[str, str, str, str, str]]:
    """(id, cause, severity, title, source) of each rule."""
    return [
        (r.id, r.cause, r.severity.value, r.title, display_path(r.source.source)) for r in rules
    ]


_OPS = {"eq": "=", "ne": "!=", "in": "in", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def describe_condition(cond: Condition) -> str:
    """``op_type in (ALLGATHER, ...)``, ``timeout_ms < 60000``, ``text matches 'x'``."""
    value = cond.value
    if cond.op == "exists":
        return f"`{cond.field}` {'is set' if value else 'is not set'}"
    if cond.op == "in" and isinstance(value, tuple):
        shown = ", ".join(str(v) for v in value)
        return f"`{cond.field}` in ({shown})"
    if cond.op == "matches":
        return f"`{cond.field}` matches `{value}`"
    return f"`{cond.field}` {_OPS.get(cond.op, cond.op)} {value}"


def describe_clause(clause: Clause) -> str:
    """A context clause in words."""
    window = []
    if clause.lines is not None:
        window.append(f"{clause.lines} lines")
    if clause.seconds is not None:
        window.append(f"{clause.seconds:g} s")
    place = {"before": "before it", "after": "after it", "around": "around it"}[clause.direction]
    text = f"{'with' if clause.present else 'without'} `{clause.event}` {place}"
    if window:
        text += ", within " + " / ".join(window)
    if clause.same_rank:
        text += ", on the same rank"
    if clause.other_rank:
        text += ", on another rank"
    if clause.where:
        text += ", where " + " and ".join(describe_condition(c) for c in clause.where)
    return text


def rules_markdown(ruleset: Ruleset) -> str:
    """The rule reference (docs/rules.md): every rule and signal, from their own files."""
    out = [
        f"<!-- Generated by `{REFERENCE_COMMAND}`: do not edit by hand. -->",
        "",
        "# Rule reference",
        "",
        (
            f"{len(ruleset.rules)} rules and {len(ruleset.signals)} signal families. Each rule names "
            "one cause of `spec/causes.md`; how to write one is in "
            '[CONTRIBUTING.md](../CONTRIBUTING.md#writing-a-rule) ("Writing a rule").'
        ),
        "",
        "| rule | cause | severity | title |",
        "|---|---|---|---|",
    ]
    out += [
        f"| [`{r.id}`](#{r.id}) | `{r.cause}` | {r.severity.value} | {r.title} |"
        for r in ruleset.rules
    ]
    for r in ruleset.rules:
        src = display_path(r.source.source)
        meta = [
            f"cause `{r.cause}`",
            f"severity {r.severity.value}",
            f"confidence {r.confidence:g}",
        ]
        if r.owner:
            meta.append(f"owner {r.owner}")
        meta.append(f"[`{src}`](../{src})" if src.startswith("rules/") else f"`{src}`")
        out += ["", f"## {r.id}", "", f"**{r.title}**", "", " · ".join(meta), ""]
        if r.description:
            out += [r.description, ""]
        trigger = f"`{r.match.event}`"
        if r.match.where:
            trigger += " where " + " and ".join(describe_condition(c) for c in r.match.where)
        out.append(f"Fires on a {trigger} event")
        out += [f"- {describe_clause(c)}" for c in r.context]
        out += [f"- when the job facts hold: {describe_condition(c)}" for c in r.facts]
        out.append("")
        examples = ", ".join(
            f"`{e.name}` ({'fires' if e.expect == 'match' else 'silent'})" for e in r.examples
        )
        out += [f"Advice: `{r.advice}`. Examples: {examples}.", "", "References:"]
        out += [f"- <{ref}>" for ref in r.references]
    out += [
        "",
        "## Signals",
        "",
        "Context lines that rules name in `event`: a family of RE2 patterns each.",
        "",
        "| signal | what the lines mean | patterns |",
        "|---|---|---|",
    ]
    for s in ruleset.signals:
        desc = " ".join(s.description.split())
        pats = ", ".join(f"`{p.name}`" for p in s.patterns)
        out.append(f"| `{s.id}` | {desc} | {pats} |")
    kinds = ", ".join(f"`{k}`" for k in EVENT_KINDS)
    out += [
        "",
        "## Event kinds",
        "",
        (
            f"Events of the grammar that `match` and `context` can name: {kinds} "
            "(`failure` is any failure)."
        ),
        "",
        *file_format_markdown(),
    ]
    return "\n".join(out)


_TYPE_WORDS = {
    "text": "text",
    "probability": "number from 0 to 1",
    "count": "number >= 0",
    "flag": "true or false",
    "event": "event kind or signal id",
    "regex": "RE2 regex",
    "strings": "text or list of texts",
    "urls": "URL or list of URLs",
    "conditions": "mapping of field: test",
    "facts": "mapping of fact: test",
    "patterns": "list of regexes or pattern mappings",
}


def _type_words(key: Key) -> str:
    kind, _, target = key.type.partition(":")
    if kind == "choice":
        return "one of " + ", ".join(f"`{v}`" for v in key.values)
    if kind == "object":
        return f"mapping ({target})"
    if kind == "list":
        return f"list of mappings ({target})"
    return _TYPE_WORDS[kind]


def file_format_markdown() -> list[str]:
    """The keys of rule and signal files, from :data:`ruleset.SHAPES` (as the loader sees them)."""
    out = [
        "## File format",
        "",
        (
            "Generated from the loader's own definitions, like `docs/rule-schema.json`; unknown keys "
            "are errors."
        ),
    ]
    for shape in SHAPES.values():
        out += ["", f"### {shape.name}", "", shape.doc, ""]
        if shape.one_of:
            out += ["Give exactly one of " + " or ".join(f"`{k}`" for k in shape.one_of) + ".", ""]
        out += ["| key | value | required | default | meaning |", "|---|---|---|---|---|"]
        out += [
            f"| `{k.name}` | {_type_words(k)} | {'yes' if k.required else ''} | "
            f"{'' if k.default is None else f'`{json.dumps(k.default)}`'} | {k.doc} |"
            for k in shape.keys
        ]
    ops = ", ".join(f"`{op}` ({kind})" for op, kind in OPERATOR_TYPES.items())
    facts = ", ".join(f"`{f}`" for f in FACT_NAMES)
    out += [
        "",
        "### conditions",
        "",
        (
            "`where:` tests fields of an event (a signal's named groups are fields too), `facts:` "
            "the job facts. `field: value` tests equality, `field: [a, b]` membership, "
            f"`field: {{operator: value}}` one of: {ops}."
        ),
        "",
        f"Job facts: {facts}.",
        "",
    ]
    return out


@dataclass
class Shown:
    """``rules show``: the rule file, and its advice rendered on its first matching example."""

    rule: Rule
    text: str
    example: str | None
    advice: str | None
    note: str


def show(ruleset: Ruleset, rule_id: str) -> Shown:
    """The rule's file and its advice on its first matching example.

    Raises:
        TriageError: no rule has this id.
    """
    rule = ruleset.rule(rule_id)
    if rule is None:
        known = ", ".join(sorted(r.id for r in ruleset.rules))
        raise TriageError("rules show", f"no rule '{rule_id}' (known: {known})")
    text = Path(rule.source.source).read_text("utf-8")
    example = next((e for e in rule.examples if e.expect == "match"), None)
    if example is None:
        return Shown(rule, text, None, None, "the rule has no matching example to render on")
    try:
        result = run_example(rule, example, ruleset)
    except TriageError as exc:
        return Shown(rule, text, example.name, None, f"the advice does not render: {exc}")
    if result.advice is None:
        note = f"the rule does not fire on it ({result.reason})"
        return Shown(rule, text, example.name, None, note)
    return Shown(rule, text, example.name, result.advice, "")


# ----------------------------------------------------------------------------- schema


def rule_schema() -> dict[str, Any]:
    """The JSON Schema of rule and signal files, generated from :data:`ruleset.SHAPES`.

    A file with ``patterns`` is a signal family, any other a rule. Draft-07, which editors'
    YAML plugins understand.
    """
    definitions: dict[str, Any] = {name: _shape_schema(s) for name, s in SHAPES.items()}
    definitions["conditions"] = {
        "type": "object",
        "description": "field: value (equal), field: [a, b] (one of), or field: {operator: value}"
        f" with the operators {', '.join(OPERATOR_TYPES)}",
        "additionalProperties": {"$ref": "#/definitions/condition"},
    }
    definitions["facts"] = {
        "type": "object",
        "description": "conditions on the job facts",
        "propertyNames": {"enum": list(FACT_NAMES)},
        "additionalProperties": {"$ref": "#/definitions/condition"},
    }
    definitions["condition"] = {
        "anyOf": [
            {"type": ["string", "number", "boolean", "null"]},
            {"type": "array"},
            {
                "type": "object",
                "minProperties": 1,
                "properties": {op: _operand(kind) for op, kind in OPERATOR_TYPES.items()},
                "additionalProperties": False,
            },
        ]
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "nccl-triage rule or signal file",
        "description": f"Generated by `{SCHEMA_COMMAND}` from the loader's own definitions "
        "(nccl_triage.ruleset.SHAPES): do not edit by hand.",
        "type": "object",
        "if": {"required": ["patterns"]},
        "then": {"$ref": "#/definitions/signal"},
        "else": {"$ref": "#/definitions/rule"},
        "definitions": definitions,
    }


def schema_json() -> str:
    """The schema as the text of docs/rule-schema.json."""
    return json.dumps(rule_schema(), indent=2, ensure_ascii=False) + "\n"


def _shape_schema(shape: Shape) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "description": shape.doc,
        "properties": {k.name: _key_schema(k) for k in shape.keys},
        "additionalProperties": False,
    }
    if shape.required:
        out["required"] = list(shape.required)
    if shape.one_of:
        out["oneOf"] = [{"required": [k]} for k in shape.one_of]
    return out


def _key_schema(key: Key) -> dict[str, Any]:
    kind, _, target = key.type.partition(":")
    ref = {"$ref": f"#/definitions/{target or kind}"}
    text: dict[str, Any] = {"type": "string", "minLength": 1, "pattern": key.pattern or r"\S"}
    base: dict[str, Any]
    if kind == "text":
        base = text
    elif kind == "choice":
        base = {"type": "string", "enum": list(key.values)}
    elif kind == "probability":
        base = {"type": "number", "minimum": 0, "maximum": 1}
    elif kind == "count":
        base = {"type": "number", "minimum": 0}
    elif kind == "flag":
        base = {"type": "boolean"}
    elif kind == "event":
        base = {"type": "string", "minLength": 1, "examples": list(EVENT_KINDS)}
    elif kind == "regex":
        base = {"type": "string", "minLength": 1}
    elif kind == "strings":
        base = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": text}]}
    elif kind == "urls":
        url = {"type": "string", "pattern": "^https?://"}
        base = {"anyOf": [url, {"type": "array", "items": {"type": "string"}, "contains": url}]}
    elif kind in ("conditions", "facts", "object"):
        base = {"allOf": [ref]}
    elif kind == "list":
        base = {"type": "array", "items": ref}
        item = SHAPES[target]
        if "expect" in item.names:  # the loader wants an example of every kind
            base["allOf"] = [
                {"contains": {"type": "object", "properties": {"expect": {"const": v}}}}
                for v in item.key("expect").values
            ]
    elif kind == "patterns":
        base = {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [{"type": "string", "minLength": 1}, {"$ref": "#/definitions/pattern"}]
            },
        }
    else:  # pragma: no cover - a new type in SHAPES needs a line here
        raise ValueError(f"no JSON Schema for key type {key.type!r}")
    out = {"description": key.doc, **base}
    if key.default is not None:
        out["default"] = key.default
    return out


def _operand(kind: str) -> dict[str, Any]:
    operands: dict[str, dict[str, Any]] = {
        "any": {},
        "list": {"type": "array"},
        "number": {"type": "number"},
        "regex": {"type": "string", "minLength": 1},
        "flag": {"type": "boolean"},
    }
    return operands[kind]
