"""The log-format reference: real lines of each era and family, and what the tool reads from them.

Input: nothing (this module does no I/O; :mod:`nccl_triage.ruleset.formats` builds these from
the package's ``_data/log_formats.yaml``). Output: frozen dataclasses for the document's parts,
eras, message families and example lines. ``docs/log-formats.md`` is made from them, and the
tests parse every line and compare what the pipeline reads with :attr:`FormatLine.reads`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A field's value as an event carries it (docs/json-output.md).
Value = str | int | bool | None


@dataclass(frozen=True, slots=True)
class FormatLine:
    """One real line, where it was posted, and what nccl-triage reads from it alone."""

    line: str  # verbatim, as the user posted it
    source: str  # the public thread it comes from
    reads: Mapping[str, Value] | None  # kind, form, failure, then fields; None: no event
    meaning: str = ""  # near-misses: why the line is harmless
    at: int = 0  # its line in the data file, for messages

    @property
    def kind(self) -> str | None:
        """The event kind the line gives, or None when it gives no event."""
        return None if self.reads is None else str(self.reads["kind"])

    @property
    def failure(self) -> bool:
        """Whether the line alone is a failure of the job."""
        return bool(self.reads and self.reads.get("failure"))


@dataclass(frozen=True, slots=True)
class LineFamily:
    """One message family of an era: what its lines mean, and real examples."""

    id: str
    title: str
    meaning: str  # an error, a notice, information: what a user makes of the lines
    examples: tuple[FormatLine, ...]


@dataclass(frozen=True, slots=True)
class FormatEra:
    """A release range of NCCL or PyTorch, or one framework, and the lines it prints."""

    id: str
    part: str  # the id of the part it belongs to
    title: str
    summary: str  # what tells this era's lines apart
    families: tuple[LineFamily, ...]
    near_misses: tuple[FormatLine, ...] = ()  # lines that look like failures and are not


@dataclass(frozen=True, slots=True)
class FormatPart:
    """A section of the reference: NCCL's lines, PyTorch's, other frameworks'."""

    id: str
    title: str
    intro: str


@dataclass(frozen=True, slots=True)
class LogFormats:
    """The whole reference, in the order of its file."""

    parts: tuple[FormatPart, ...]
    eras: tuple[FormatEra, ...]
    source: str  # the data file, for messages

    def lines(self) -> list[FormatLine]:
        """Every example and near-miss line, in document order."""
        out: list[FormatLine] = []
        for era in self.eras:
            for family in era.families:
                out.extend(family.examples)
            out.extend(era.near_misses)
        return out
