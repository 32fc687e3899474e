"""Rule directories in, a validated :class:`Ruleset` out.

Input: directories of ``*.yaml`` rules and ``signals/*.yaml`` signal families (the built-ins,
``--rules DIR`` and ``NCCL_TRIAGE_RULES``). Output: a :class:`Ruleset`, or a
:class:`~nccl_triage.errors.RuleError` listing every problem of every file as
``file:line: message``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nccl_triage.errors import RuleError
from nccl_triage.model import Clause, Rule, Signal
from nccl_triage.model.fields import fields_of
from nccl_triage.ruleset import doccache
from nccl_triage.ruleset.files import load_rule, load_signal
from nccl_triage.ruleset.shapes import EVENT_KINDS


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
            sig, errs = load_signal(path)
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
            rule, errs = load_rule(path)
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
    signals = {s.id: s for s in ruleset.signals}
    for rule in ruleset.rules:
        for clause in (rule.match, *rule.context):
            if clause.event not in known:
                problems.append(
                    f"{rule.source}: unknown event or signal '{clause.event}' "
                    f"(expected one of: {', '.join(sorted(known))})"
                )
                continue
            problems.extend(_unknown_fields(rule, clause, signals.get(clause.event)))
    doccache.save()  # (the files parsed now are read back at the next start)
    return ruleset, problems


_GROUP = re.compile(r"\(\?P<(\w+)>")


def signal_groups(signal: Signal) -> list[str]:
    """The named groups of a signal's patterns: fields its events carry."""
    return sorted({g for p in signal.patterns for g in _GROUP.findall(p.regex)})


def _unknown_fields(rule: Rule, clause: Clause, signal: Signal | None) -> list[str]:
    """A problem for each ``where:`` field that events of the clause's kind never carry."""
    have = fields_of(clause.event, signal_groups(signal) if signal is not None else None)
    return [
        f"{rule.source.source}:{cond.line or rule.source.line}: where: '{cond.field}' is not a "
        f"field of {clause.event} events (they have: {', '.join(sorted(have))})"
        for cond in clause.where
        if cond.field not in have
    ]


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
