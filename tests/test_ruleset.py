"""Loading rules: every problem reported as file:line with the allowed values; hostile input refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_triage.errors import RuleError
from nccl_triage.ruleset import load_ruleset

GOOD = """\
id: team-rule
title: Team uploader stalled
cause: slow_checkpoint_save
severity: high
match:
  event: watchdog_timeout
context:
  - event: checkpoint_save
    within: {lines: 100}
advice: unknown-cause.md.j2
references: [https://example.org/runbook]
examples:
  - name: fires
    expect: match
    log: |
      Saving model checkpoint to /x
      [E ProcessGroupNCCL.cpp:464] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=10000) ran for 10917 milliseconds before timing out.
  - name: silent
    expect: no-match
    log: |
      nothing here
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "team"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text, encoding="utf-8")
    return d


def load_error(d: Path) -> str:
    with pytest.raises(RuleError) as info:
        load_ruleset([d])
    return str(info.value)


def test_good_team_rule_loads_next_to_builtins(tmp_path: Path) -> None:
    d = write(tmp_path, "team-rule.yaml", GOOD)
    rs = load_ruleset([d])
    assert rs.rule("team-rule") is not None
    assert rs.rule("slow-checkpoint-save") is not None


def test_misspelled_key_names_file_line_and_allowed_keys(tmp_path: Path) -> None:
    d = write(
        tmp_path,
        "team-rule.yaml",
        GOOD.replace("    within: {lines: 100}", "    withn: {lines: 100}"),
    )
    msg = load_error(d)
    assert (
        f"{d / 'team-rule.yaml'}:9: context[0]: unknown key 'withn' (expected: event, where, within"
        in msg
    )


def test_duplicate_key_is_rejected(tmp_path: Path) -> None:
    d = write(
        tmp_path,
        "team-rule.yaml",
        GOOD.replace("severity: high\n", "severity: high\nseverity: low\n"),
    )
    assert ":5: duplicate key 'severity'" in load_error(d)


def test_python_object_tag_is_refused(tmp_path: Path) -> None:
    hostile = GOOD.replace(
        "title: Team uploader stalled",
        "title: !!python/object/apply:os.system ['touch /tmp/pwned']",
    )
    d = write(tmp_path, "team-rule.yaml", hostile)
    msg = load_error(d)
    assert "team-rule.yaml:2: invalid YAML" in msg
    assert not Path("/tmp/pwned").exists()


def test_cause_outside_taxonomy(tmp_path: Path) -> None:
    d = write(
        tmp_path,
        "team-rule.yaml",
        GOOD.replace("cause: slow_checkpoint_save", "cause: cosmic_rays"),
    )
    msg = load_error(d)
    assert (
        "team-rule.yaml:3: cause 'cosmic_rays' is not in docs/causes.md (expected one of: slow_checkpoint_save"
        in msg
    )


def test_id_must_equal_file_name_and_all_problems_reported(tmp_path: Path) -> None:
    bad = GOOD.replace("severity: high", "severity: severe").replace(
        "cause: slow_checkpoint_save", "cause: nope"
    )
    d = write(tmp_path, "other-name.yaml", bad)
    msg = load_error(d)
    assert "id 'team-rule' must equal the file name 'other-name'" in msg
    assert "severity 'severe'" in msg and "cause 'nope'" in msg


def test_examples_of_both_kinds_are_required(tmp_path: Path) -> None:
    only_match = GOOD[: GOOD.index("  - name: silent")]
    d = write(tmp_path, "team-rule.yaml", only_match)
    assert "at least one 'match' and one 'no-match'" in load_error(d)


def test_signal_regex_must_compile_under_re2(tmp_path: Path) -> None:
    d = tmp_path / "team"
    (d / "signals").mkdir(parents=True)
    (d / "signals" / "uploader.yaml").write_text(
        "id: uploader\ndescription: x\npatterns:\n  - name: backref\n    regex: '(a)\\1'\n",
        encoding="utf-8",
    )
    msg = load_error(d)
    assert "uploader.yaml:5: patterns[0]: regex does not compile under RE2" in msg


def test_team_rule_replaces_builtin_with_notice(tmp_path: Path) -> None:
    text = GOOD.replace("id: team-rule", "id: timeout-too-short")
    d = write(tmp_path, "timeout-too-short.yaml", text)
    rs = load_ruleset([d])
    assert rs.rule("timeout-too-short").title == "Team uploader stalled"  # type: ignore[union-attr]
    assert any("replaces" in n for n in rs.notices)


def test_unknown_event_names_known_ones(tmp_path: Path) -> None:
    d = write(
        tmp_path, "team-rule.yaml", GOOD.replace("event: checkpoint_save", "event: checkpoint_saev")
    )
    msg = load_error(d)
    assert "unknown event or signal 'checkpoint_saev'" in msg and "checkpoint_save" in msg


def test_a_where_field_the_event_kind_lacks_is_named_with_the_ones_it_has(tmp_path: Path) -> None:
    misspelt = GOOD.replace(
        "  event: watchdog_timeout\n",
        "  event: watchdog_timeout\n  where: {timeout_msec: {gt: 0}}\n",
    )
    d = write(tmp_path, "team-rule.yaml", misspelt)
    msg = load_error(d)
    assert "team-rule.yaml:7: where: 'timeout_msec' is not a field of watchdog_timeout" in msg
    assert "timeout_ms" in msg and "seq" in msg  # the fields it has are listed


def test_where_fields_of_signals_are_their_named_groups(tmp_path: Path) -> None:
    d = write(
        tmp_path,
        "team-rule.yaml",
        GOOD.replace(
            "  - event: checkpoint_save\n",
            "  - event: checkpoint_save\n    where: {path: {matches: ckpt}, iteration: '5'}\n",
        ),
    )
    load_ruleset([d])  # 'path' and 'iteration' are named groups of checkpoint_save's patterns
    d = write(
        tmp_path,
        "team-rule.yaml",
        GOOD.replace(
            "  - event: checkpoint_save\n",
            "  - event: checkpoint_save\n    where: {filename: x}\n",
        ),
    )
    assert "'filename' is not a field of checkpoint_save events" in load_error(d)
