"""``nccl-triage rules``: list, show, lint, test, new, schema, as a rule author uses them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from nccl_triage.cli import main
from test_authoring import RULE, TIMEOUT, team  # the team rule of those tests

ROOT = Path(__file__).resolve().parent.parent
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed$")


@pytest.fixture(autouse=True)
def _no_env_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_TRIAGE_RULES", raising=False)


def invoke(args: list[str], code: int, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def closing(result: Result) -> tuple[int, int]:
    m = CLOSING.match(result.stdout.splitlines()[-1])
    assert m, result.stdout
    return int(m[1]), int(m[2])


def test_rules_is_a_listed_subcommand() -> None:
    assert "rules" in invoke(["--help"], 0).stdout
    out = invoke(["rules", "--help"], 0).stdout
    for name in ("list", "show", "lint", "test", "new", "schema"):
        assert name in out


def test_list_shows_id_cause_severity_title_source() -> None:
    lines = invoke(["rules", "list"], 0).stdout.splitlines()
    assert lines[0].split() == ["id", "cause", "severity", "title", "source"]
    row = next(ln for ln in lines if ln.startswith("oom-behind-timeout "))
    assert row.split()[1:3] == ["oom_hidden", "critical"]
    assert row.endswith("rules/oom-behind-timeout.yaml")


def test_list_md_is_the_committed_reference() -> None:
    out = invoke(["rules", "list", "--format", "md"], 0).stdout
    assert out == (ROOT / "docs" / "rules.md").read_text("utf-8")


def test_list_with_team_rules_only_and_disable(tmp_path: Path) -> None:
    d = team(tmp_path)
    out = invoke(["rules", "list", "--rules", str(d), "--only", "s3-upload-stall"], 0).stdout
    assert len(out.splitlines()) == 2 and "s3-upload-stall" in out
    out = invoke(["rules", "list", "--disable", "unknown-cause"], 0).stdout
    assert "unknown-cause" not in out and "timeout-too-short" in out
    result = invoke(["rules", "list", "--only", "nope"], 2)
    assert "--only/--disable: no rule 'nope'" in result.stderr


def test_show_prints_the_rule_and_its_rendered_advice() -> None:
    out = invoke(["rules", "show", "timeout-too-short"], 0).stdout
    assert out.startswith("# rules/timeout-too-short.yaml\nid: timeout-too-short\n")
    assert "# advice, rendered on example 'ten-second-timeout'" in out
    assert "10.9 s" in out
    assert "no rule 'nope'" in invoke(["rules", "show", "nope"], 2).stderr


def test_schema_prints_the_committed_schema() -> None:
    out = invoke(["rules", "schema"], 0).stdout
    assert out == (ROOT / "docs" / "rule-schema.json").read_text("utf-8")


def test_lint_builtin_rules_directory_is_clean() -> None:
    out = invoke(["rules", "lint", str(ROOT / "rules")], 0).stdout
    assert out.startswith("rules lint: no problems (")


def test_lint_catches_a_misspelled_key_with_its_file_and_line(tmp_path: Path) -> None:
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE.replace("    within:", "    withn:")})
    lines = invoke(["rules", "lint", str(d)], 1).stdout.splitlines()
    assert lines[0] == (
        f"{d / 's3-upload-stall.yaml'}:9: context[0]: unknown key 'withn' "
        "(expected: event, where, within, direction, present, same_rank, other_rank, name,"
        " culprit, running, optional, outside_nccl, fr_culprit)"
    )
    assert lines[-1].startswith("rules lint: 1 problem (")


def test_lint_refuses_a_hostile_rule_file_with_a_clear_message(tmp_path: Path) -> None:
    text = RULE.replace("title: A", "title: !!python/object/apply:os.system ['id']\nx: A")
    d = team(tmp_path, **{"s3-upload-stall.yaml": text})
    out = invoke(["rules", "lint", str(d)], 1).stdout
    assert "tag '!!python/object/apply:os.system' refused" in out
    assert "Traceback" not in out


def test_test_runs_examples_and_ends_with_the_count() -> None:
    result = invoke(["rules", "test", str(ROOT / "rules")], 0)
    passed, failed = closing(result)
    assert passed >= 28 and failed == 0
    assert result.stdout.count("\n") == 1  # quiet: only the closing line


def test_test_shows_what_was_expected_against_what_fired(tmp_path: Path) -> None:
    text = RULE.replace("s3-sync: upload stalled for 612 s", "s3-sync: upload stuck for 612 s")
    d = team(tmp_path, **{"s3-upload-stall.yaml": text})
    result = invoke(["rules", "test", str(d)], 1)
    assert result.stdout.splitlines() == [
        f"FAIL  s3-upload-stall::stall-then-timeout  ({d / 's3-upload-stall.yaml'}:13)",
        "      expected: s3-upload-stall fires",
        "      fired:    unknown-cause",
        "      s3-upload-stall: context[0]: no s3_upload_stall before within 5000 lines of line 2",
        "1 passed, 1 failed",
    ]


def test_test_verbose_lists_each_example(tmp_path: Path) -> None:
    out = invoke(["rules", "test", "-v", str(team(tmp_path))], 0).stdout
    assert out.splitlines() == [
        "ok    s3-upload-stall::stall-then-timeout",
        "ok    s3-upload-stall::finished-then-timeout",
        "2 passed, 0 failed",
    ]


def test_test_refuses_rules_that_do_not_load(tmp_path: Path) -> None:
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE.replace("title:", "titel:")})
    result = invoke(["rules", "test", str(d)], 2)
    assert "unknown key 'titel'" in result.stderr and "no example was run" in result.stderr


def test_test_corpus_lists_the_logs_each_rule_fires_on(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "job-17.log").write_text(f"[rank0]: s3-sync: upload stalled for 9 s\n{TIMEOUT}\n")
    (corpus / "job-18.log").write_text(f"{TIMEOUT}\n")
    d = team(tmp_path)
    out = invoke(["rules", "test", str(d), "--corpus", str(corpus)], 0).stdout.splitlines()
    assert out[0] == f"corpus {corpus}: 2 logs"
    assert out[1] == "  s3-upload-stall: fires on 1 of 2"
    assert out[2].endswith("job-17.log:2")
    assert out[-1] == "2 passed, 0 failed"


def test_new_scaffolds_a_rule_that_test_runs_at_once(tmp_path: Path) -> None:
    d = tmp_path / "team-rules"
    out = invoke(
        ["rules", "new", "s3-upload-stall", "--cause", "slow_checkpoint_save", "--dir", str(d)], 0
    ).stdout
    assert f"wrote {d / 's3-upload-stall.yaml'}" in out
    assert closing(invoke(["rules", "test", str(d)], 0)) == (2, 0)
    lint = invoke(["rules", "lint", str(d)], 1).stdout
    assert "placeholder 'TODO' left to fill in" in lint
    again = invoke(["rules", "new", "s3-upload-stall", "--cause", "oom_hidden", "--dir", str(d)], 2)
    assert "exists already" in again.stderr


def test_new_rejects_a_cause_outside_the_taxonomy(tmp_path: Path) -> None:
    result = invoke(["rules", "new", "x-y", "--cause", "cosmic_rays", "--dir", str(tmp_path)], 2)
    assert "slow_checkpoint_save" in result.stderr


def test_env_rules_and_replacement_notice(tmp_path: Path) -> None:
    text = RULE.replace("id: s3-upload-stall", "id: timeout-too-short")
    d = team(tmp_path, **{"s3-upload-stall.yaml": None, "timeout-too-short.yaml": text})
    result = invoke(["rules", "list"], 0, env={"NCCL_TRIAGE_RULES": str(d)})
    assert "rule 'timeout-too-short' replaces the one loaded before" in result.stderr
    row = next(ln for ln in result.stdout.splitlines() if ln.startswith("timeout-too-short "))
    assert row.endswith("timeout-too-short.yaml") and "slow_checkpoint_save" in row


def test_triage_uses_team_rules_with_only(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(f"[rank0]: s3-sync: upload stalled for 612 s\n{TIMEOUT}\n")
    d = team(tmp_path)
    out = invoke(["triage", "--rules", str(d), str(log)], 1).stdout
    assert "rule s3-upload-stall" in out and "stalled for 10.2 min" in out
    out = invoke(["triage", "--rules", str(d), "--disable", "s3-upload-stall", str(log)], 1).stdout
    assert "rule s3-upload-stall" not in out
