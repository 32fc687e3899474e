"""Advice: a finding's Jinja template rendered in a bounded sandbox.

Input: a :class:`~nccl_triage.model.Finding`, the job facts and the template directories.
Output: the advice as Markdown. Templates come from other teams: they render in the bounded
sandbox of :mod:`nccl_triage.render.sandbox` with ``StrictUndefined`` (a misspelt variable is an
error, not an empty string), and see only ``rule``, ``finding``, ``trigger``, ``evidence`` and
``facts``. A template that fails costs only its own advice (:func:`advice_or_failure`).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from nccl_triage.errors import TemplateError
from nccl_triage.model import Event, Finding, JobFacts
from nccl_triage.model.fields import KIND_FIELDS, fields_of
from nccl_triage.model.ranks import format_ranks
from nccl_triage.render.sandbox import BoundedSandbox, environment, render_bounded, start_budget


def human_ms(value: Any) -> str:
    """``1800000`` -> ``30 min``; ``600061`` -> ``10.0 min``; ``5743`` -> ``5.7 s``."""
    if value is None:
        return "?"
    ms = float(value)
    if ms >= 3_600_000:
        hours = ms / 3_600_000
        return f"{hours:.0f} h" if hours == int(hours) else f"{hours:.1f} h"
    if ms >= 60_000:
        minutes = ms / 60_000
        return f"{minutes:.0f} min" if minutes == int(minutes) else f"{minutes:.1f} min"
    return f"{ms / 1000:.1f} s"


def human_seconds(value: Any) -> str:
    """Seconds as a duration (``2100`` -> ``35 min``)."""
    return "?" if value is None else human_ms(float(value) * 1000)


def human_bytes(value: Any) -> str:
    """``2147483648`` -> ``2.0 GiB``."""
    if value is None:
        return "?"
    n = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def round_up(value: Any, step: int = 600) -> int:
    """Round a number of seconds up to a multiple of ``step`` (ten minutes by default)."""
    n = int(float(value))
    return max(step, -(-n // step) * step)


def human_number(value: Any) -> str:
    """``1245708288`` -> ``1,245,708,288``."""
    return "?" if value is None else f"{int(value):,}"


_FILTERS = (
    ("ms", human_ms),
    ("seconds", human_seconds),
    ("bytes", human_bytes),
    ("num", human_number),
    ("round_up", round_up),
    ("ranks", format_ranks),
)


def _environment(dirs: tuple[Path, ...]) -> BoundedSandbox:
    return environment(dirs, _FILTERS)


def event_view(ev: Event) -> dict[str, Any]:
    """Return an event as templates see it.

    Detail is flattened, and every core field is present (None when the line does not show
    it), so a template tests ``is not none`` instead of failing.
    """
    view: dict[str, Any] = dict.fromkeys(fields_of(ev.kind, ev.detail if _is_signal(ev) else None))
    view.update({name: getattr(ev, name) for name in _CORE_FIELDS})
    view.update(ev.to_dict())
    return view


def _is_signal(ev: Event) -> bool:
    """Tell whether an event is a context signal (its kind is a signal id, not a grammar kind)."""
    return ev.kind not in KIND_FIELDS and ev.kind != "watchdog_status"


_CORE_FIELDS = tuple(
    f for f in Event.__dataclass_fields__ if f not in ("detail", "occurrences", "source", "ts")
)


class EvidenceList(list[dict[str, Any]]):
    """The evidence of a finding, in clause order, also by clause name (``evidence.save``)."""

    def __init__(self, items: list[dict[str, Any]], names: dict[str, int]) -> None:
        super().__init__(items)
        self.names = names

    def __getattr__(self, name: str) -> dict[str, Any]:
        if name in self.names:
            return self[self.names[name]]
        raise AttributeError(name)


def template_context(finding: Finding, facts: JobFacts) -> dict[str, Any]:
    """The variables a rule's advice template is given, and no others."""
    trigger = finding.trigger
    evidence = []
    for ev in finding.evidence:
        view = event_view(ev)
        view["gap_lines"] = trigger.line - ev.line
        view["gap_s"] = (
            round(trigger.ts - ev.ts) if trigger.ts is not None and ev.ts is not None else None
        )
        evidence.append(view)
    rule = finding.rule
    return {
        "rule": {
            "id": rule.id,
            "title": rule.title,
            "cause": rule.cause,
            "severity": rule.severity.value,
            "references": list(rule.references),
        },
        "finding": {"confidence": finding.confidence},
        "trigger": event_view(trigger),
        "evidence": EvidenceList(evidence, finding.names),
        "facts": facts.to_dict(),
    }


def render_advice(finding: Finding, facts: JobFacts, template_dirs: Sequence[Path]) -> str:
    """Render a finding's advice from its rule's template.

    Raises:
        TemplateError: the template is missing, broken, uses an unknown variable, tries to
            reach outside the sandbox or breaks one of its bounds; its location is the
            template's ``file:line`` where that is known.
    """
    env = _environment(tuple(template_dirs))
    name = finding.rule.advice
    template: jinja2.Template | None = None
    try:
        start_budget()
        template = env.get_template(name)
        text = render_bounded(template, template_context(finding, facts))
    except jinja2.TemplateNotFound:
        raise TemplateError(
            str(finding.rule.source), f"advice template '{name}' not found"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{exc.filename or name}:{exc.lineno}", f"template error: {exc.message}"
        ) from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(_where(template, name, exc), f"refused by the sandbox: {exc}") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            _where(template, name, exc), f"template uses an undefined value: {exc.message}"
        ) from None
    except RecursionError:
        raise TemplateError(name, "template recursion too deep") from None
    except Exception as exc:  # noqa: BLE001 - a contributed template may fail in any way
        raise TemplateError(
            _where(template, name, exc), f"template failed: {type(exc).__name__}: {exc}"
        ) from None
    return text.strip() + "\n"


def _where(template: jinja2.Template | None, name: str, exc: BaseException) -> str:
    """``file:line`` of the template line a render failed on (Jinja maps its frames back)."""
    if template is None or not template.filename:
        return name
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == template.filename:
            line = lineno
    return f"{template.filename}:{line}" if line else template.filename


def advice_or_failure(finding: Finding, facts: JobFacts, template_dirs: Sequence[Path]) -> str:
    """The advice, or, when its template fails, why and what the template may use.

    A contributed template that fails costs only its own advice: the diagnosis, its evidence
    and the other findings still print.
    """
    try:
        return render_advice(finding, facts, template_dirs)
    except TemplateError as exc:
        return f"Advice not rendered: {exc}\nThe template may use: {available_fields(finding, facts)}\n"


def available_fields(finding: Finding, facts: JobFacts) -> str:
    """The variables a finding's template is given, as one line."""
    ctx = template_context(finding, facts)

    def names(d: dict[str, Any]) -> str:
        return "{" + ", ".join(sorted(d)) + "}"

    parts = [
        "rule." + names(ctx["rule"]),
        "finding." + names(ctx["finding"]),
        "trigger." + names(ctx["trigger"]),
    ]
    evidence = ctx["evidence"]
    if evidence.names:
        parts.append("evidence." + names(dict.fromkeys(evidence.names)))
    if evidence:
        parts.append("evidence[i]." + names(evidence[0]))
    parts.append("facts." + names(ctx["facts"]))
    return "; ".join(parts)
