"""Every line of the log-format reference reads as docs/log-formats.md says, field by field.

The lines, their threads and what they read live in src/nccl_triage/_data/log_formats.yaml. Each
is parsed on its own by the pipeline; its event's kind, form, failure and every listed field are
compared. Near-misses must give no failure, alone or triaged. Every line is a real line of a
corpus log of its thread (the near-misses of logs labelled clean).
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import CORPUS, ROOT
from nccl_triage.errors import RuleError
from nccl_triage.model import Event, is_failure
from nccl_triage.model.formats import FormatLine
from nccl_triage.pipeline import parse_text, triage_text
from nccl_triage.ruleset import load_ruleset
from nccl_triage.ruleset.formats import load_log_formats

FORMATS = load_log_formats()
EXAMPLES = [
    pytest.param(ex, id=f"{fam.id}-{i}")
    for era in FORMATS.eras
    for fam in era.families
    for i, ex in enumerate(fam.examples, 1)
]
NEAR_MISSES = [
    pytest.param(ex, id=f"{era.id}-near-{i}")
    for era in FORMATS.eras
    for i, ex in enumerate(era.near_misses, 1)
]
CORPUS_DIRS = [CORPUS, *sorted(p for p in (ROOT / "tests" / "corpus").iterdir() if p.is_dir())]


def read(ev: Event, reads: dict[str, Any]) -> dict[str, Any]:
    """What the event says for every key the reference lists."""
    got = ev.to_dict()
    out: dict[str, Any] = {"kind": str(ev.kind), "form": ev.form, "failure": is_failure(ev)}
    out.update({key: got.get(key) for key in reads if key not in out})
    return out


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_reads_as_documented(example: FormatLine) -> None:
    result = parse_text(example.line + "\n")
    assert result.unparsed == []
    assert example.reads is not None, (
        "an example gives an event; lines that give none are near-misses"
    )
    assert len(result.events) == 1, [e.to_dict() for e in result.events]
    assert read(result.events[0], dict(example.reads)) == example.reads


@pytest.mark.parametrize("example", NEAR_MISSES)
def test_near_miss_is_no_failure(example: FormatLine) -> None:
    report = triage_text(example.line + "\n", _ruleset())
    assert report.verdict == "clean"
    assert not [e.to_dict() for e in report.events if is_failure(e)]
    if example.reads is None:
        assert report.events == []
    else:
        assert len(report.events) == 1
        assert read(report.events[0], dict(example.reads)) == example.reads


@pytest.mark.parametrize("example", EXAMPLES + NEAR_MISSES)
def test_every_line_is_a_real_line_of_its_thread(example: FormatLine) -> None:
    holders = _corpus_lines().get(example.line, [])
    shown = {source for source, _ in holders}
    if example.source not in shown and not (CORPUS / "manifest.yaml").is_file():
        pytest.skip("the public corpus (where this line comes from) is not here")
    assert holders, "not a line of any corpus log"
    assert example.source in {source for source, _ in holders}
    if example.meaning:  # a near-miss
        verdicts = {verdict for source, verdict in holders if source == example.source}
        assert "clean" in verdicts, "a near-miss comes from a healthy run"


def test_the_reference_covers_every_era_and_framework() -> None:
    eras = {e.id for e in FORMATS.eras}
    assert {"nccl-1", "nccl-2.0-2.3", "nccl-2.21-", "pytorch-1.8", "pytorch-2.5-"} <= eras
    assert {"tensorflow", "horovod", "paddle", "jax", "mxnet", "pynccl", "nccl-tests"} <= eras
    assert {"deepspeed"} <= eras
    assert all(e.part in {p.id for p in FORMATS.parts} for e in FORMATS.eras)
    assert len(FORMATS.lines()) == len(EXAMPLES) + len(NEAR_MISSES)


@functools.cache
def _ruleset() -> Any:
    return load_ruleset()


@functools.cache
def _corpus_lines() -> dict[str, list[tuple[str, str]]]:
    """Each line of every corpus log: the threads and verdicts of the logs that hold it."""
    out: dict[str, list[tuple[str, str]]] = {}
    for folder in CORPUS_DIRS:
        manifest = folder / "manifest.yaml"
        if not manifest.is_file():
            continue
        for entry in yaml.safe_load(manifest.read_text(encoding="utf-8")):
            log = folder / f"{entry['id']}.log"
            if not log.is_file():
                continue
            for line in log.read_text(encoding="utf-8", errors="surrogateescape").split("\n"):
                out.setdefault(line, []).append((entry["source"], entry["expected_verdict"]))
    return out


# ----------------------------------------------------------------------------- the data file

GOOD_LINE = """\
- line: "WARN src/reduce.cu:126 Cuda failure 'invalid resource handle'"
  source: https://github.com/apache/mxnet/issues/9193
  reads: {kind: nccl_warn, form: null, failure: true, severity: error}
"""
NEAR_MISS = (
    GOOD_LINE.replace("failure: true, severity: error", "failure: false") + "  meaning: Fine.\n"
)


def _file(tmp_path: Path, eras: str) -> Path:
    path = tmp_path / "log_formats.yaml"
    parts = "- {id: nccl, title: NCCL, intro: Lines.}"
    path.write_text(f"parts:\n{parts}\neras:\n{eras}", encoding="utf-8")
    return path


def _era(examples: str = GOOD_LINE, near: str = "") -> str:
    out = (
        "- id: nccl-1\n  part: nccl\n  title: NCCL 1.x\n  summary: No prefix.\n"
        "  families:\n  - id: warn\n    title: A WARN\n    meaning: An error.\n"
        f"    examples:\n{textwrap.indent(examples, '    ')}"
    )
    return out + (f"  near_misses:\n{textwrap.indent(near, '  ')}" if near else "")


def test_a_good_file_loads(tmp_path: Path) -> None:
    formats = load_log_formats(_file(tmp_path, _era(near=NEAR_MISS)))
    line, near = formats.lines()
    assert line.line == "WARN src/reduce.cu:126 Cuda failure 'invalid resource handle'"
    assert line.kind == "nccl_warn" and line.failure
    assert near.meaning == "Fine." and not near.failure


@pytest.mark.parametrize(
    ("eras", "message"),
    [
        (
            _era().replace("  summary", "  colour: red\n  summary"),
            "unknown key 'colour' (expected:",
        ),
        (_era().replace("part: nccl", "part: cuda"), "unknown part 'cuda' (expected: nccl)"),
        (_era(GOOD_LINE.replace("nccl_warn", "nccl_warning")), "unknown event kind 'nccl_warning'"),
        (_era(GOOD_LINE.replace("severity", "seq")), "'seq' is not a field of nccl_warn events"),
        (_era(GOOD_LINE.replace("failure: true, ", "")), "reads: missing key 'failure'"),
        (_era(GOOD_LINE * 4), "family 'warn': one to 3 examples are needed"),
        (_era(GOOD_LINE.replace("https://github.com", "github.com")), "the thread's https:// URL"),
        (_era(near=GOOD_LINE), "near-miss: missing key 'meaning'"),
        (_era(near=GOOD_LINE + "  meaning: Fine.\n"), "a near-miss cannot read as a failure"),
        (_era() + _era(), "era id 'nccl-1' is used twice (first at line 4)"),
    ],
)
def test_every_problem_is_named_with_its_line(tmp_path: Path, eras: str, message: str) -> None:
    path = _file(tmp_path, eras)
    with pytest.raises(RuleError) as exc:
        load_log_formats(path)
    assert message in str(exc.value)
    assert f"{path}:" in str(exc.value)
