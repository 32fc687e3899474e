"""The rule and signal file format, declared once.

Input: nothing. Output: :data:`SHAPES` (every mapping of a rule or signal file: its keys, their
types, allowed values and defaults), the causes a rule may name and the condition operators.
The loader checks files against it, and ``nccl-triage rules schema`` turns it into the JSON
Schema of rule files, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nccl_triage.model import Direction, JobFacts, Kind, Operator, Severity
from nccl_triage.model.causes import CAUSES
from nccl_triage.model.fields import CONTEXT_KINDS

# docs/causes.md: the only values a diagnosis's cause may take.

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
    Operator.EQ: "any",
    Operator.NE: "any",
    Operator.IN: "list",
    Operator.GT: "number",
    Operator.GE: "number",
    Operator.LT: "number",
    Operator.LE: "number",
    Operator.MATCHES: "regex",
    Operator.NOT_MATCHES: "regex",
    Operator.EXISTS: "flag",
}
EVENT_KINDS = (*(k.value for k in Kind if k != Kind.WATCHDOG_STATUS), *CONTEXT_KINDS, "failure")
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
                Key("cause", "choice", "the root cause (docs/causes.md)", True, CAUSES),
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
                    values=tuple(d.value for d in Direction),
                    default=Direction.BEFORE.value,
                ),
                Key("present", "flag", "false: the event must NOT be there", default=True),
                Key("same_rank", "flag", "the event must be on the trigger's rank", default=False),
                Key("other_rank", "flag", "the event must be on another rank", default=False),
                Key(
                    "name",
                    "text",
                    "what templates call this evidence (evidence.save)",
                    pattern=r"^[a-z][a-z0-9_]*$",
                ),
                Key(
                    "culprit",
                    "flag",
                    "the event must be on a culprit rank: one that did not time out, fell "
                    "behind or failed first (or a line that does not say its rank)",
                    default=False,
                ),
                Key(
                    "running",
                    "flag",
                    "the event must have been going on when the collective was entered and "
                    "not have ended before the watchdog fired (when the log can tell)",
                    default=False,
                ),
                Key(
                    "optional",
                    "flag",
                    "quote and weigh the event when it is there, but fire without it "
                    "(templates test `evidence.NAME is defined`)",
                    default=False,
                ),
                Key(
                    "outside_nccl",
                    "flag",
                    "the event must not be on a line read as NCCL's own error (a fatal "
                    "signal whose backtrace runs through NCCL is NCCL's failure, not a crash)",
                    default=False,
                ),
                Key(
                    "fr_culprit",
                    "flag",
                    "the event must be on a rank the job's flight-recorder dumps blame "
                    "(fact fr_culprit_ranks: it never enqueued the stuck collective, or its "
                    "device never finished it); without dumps the clause never holds",
                    default=False,
                ),
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
                Key(
                    "evidence",
                    "strings",
                    "for a match: part of each line the finding must quote (its trigger or "
                    "its evidence), so the example pins the lines that prove the cause",
                ),
                Key(
                    "advice",
                    "strings",
                    "for a match: parts the rendered advice must hold, so the example pins "
                    "what it says that no log line shows (a rank, a frame of the dumps)",
                ),
                Key(
                    "dumps",
                    "strings",
                    "the job's flight-recorder dumps, read with the log as `triage --fr` "
                    "reads them: a directory of per-rank dumps or a dump file (or a list), "
                    "relative to the rule file or its parent directory",
                ),
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
                Key(
                    "examples",
                    "list:line_example",
                    "real lines the signal must match, and near-misses it must not",
                ),
            ),
        ),
        Shape(
            "line_example",
            "A line a signal must (match) or must not (no-match) recognise.",
            (
                Key("line", "text", "the line, verbatim as a log shows it", required=True),
                Key("expect", "choice", "recognised or not", True, ("match", "no-match")),
                Key("source", "text", "where the line was seen (a thread's URL)"),
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
LINE_EXAMPLE_KEYS = SHAPES["line_example"].names
OPERATORS = tuple(o.value for o in Operator)
