"""``rules lint``: every problem of the rule files an author works on, as ``file:line: message``.

Input: rule directories. Output: a :class:`LintResult`: loader problems, duplicate ids,
left-over placeholders, templates that do not render on a matching example, patterns whose
anchors their own example lines lack.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nccl_triage.authoring.examples import run_example
from nccl_triage.errors import TemplateError, TriageError
from nccl_triage.ingest.regex import compile_regex
from nccl_triage.model import Rule, Signal
from nccl_triage.ruleset import Ruleset, collect_ruleset, source_dirs
from nccl_triage.ruleset.safeyaml import line_of, load_yaml
from nccl_triage.ruleset.shapes import (
    EVENT_KINDS,
    SHAPES,
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
            result = run_example(rule, example, ruleset)
        except TemplateError as exc:
            out.append(
                f"{example.source}: examples[{i}] '{example.name}': the advice does not render: "
                f"{exc}"
            )
        except TriageError as exc:
            out.append(f"{example.source}: examples[{i}] '{example.name}': {exc}")
            continue
        if not example.evidence:
            quoted = (
                " | ".join(q.strip()[:100] for q in result.quoted) or "nothing (it did not fire)"
            )
            out.append(
                f"{example.source}: examples[{i}] '{example.name}': a 'match' example pins the "
                f"lines that prove the cause: add 'evidence:' with part of each line the finding "
                f"must quote (it quotes: {quoted})"
            )
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
        for i, pat in enumerate(sig.patterns):
            item = items[i] if i < len(items) else None
            where = f"{path}:{line_of(item) or line_of(raw)}: patterns[{i}]"
            regex = compile_regex(pat.regex, sig.ignore_case)
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
