"""Writing rules: lint, test, scaffold, the generated schema and reference, hostile rule files."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from nccl_triage import authoring
from nccl_triage.errors import RuleError, TriageError
from nccl_triage.pipeline import triage_text
from nccl_triage.ruleset import CAUSES, SHAPES, builtin_dirs, collect_ruleset, load_ruleset

ROOT = Path(__file__).resolve().parent.parent
SPEC_CAUSES = ROOT.parent / "shared" / "spec" / "causes.md"
TIMEOUT = (
    "[rank1]:[E611 03:22:47.433063423 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600088 milliseconds before timing out."
)
SIGNAL = """\
id: s3_upload_stall
description: Our uploader reports an upload that makes no progress.
patterns:
  - name: upload-stalled
    regex: 's3-sync: upload stalled(?: for (?P<stalled_s>\\d+) s)?'
    anchors: ["s3-sync: upload stalled"]
"""
RULE = f"""\
id: s3-upload-stall
title: A checkpoint upload stalled while the other ranks waited
cause: slow_checkpoint_save
severity: high
match:
  event: watchdog_timeout
context:
  - event: s3_upload_stall
    within: {{lines: 5000}}
advice: s3-upload-stall.md.j2
references: [https://wiki.example.org/s3-sync]
examples:
  - name: stall-then-timeout
    expect: match
    evidence: ['Watchdog caught collective operation timeout', 's3-sync: upload stalled for 612 s']
    log: |
      [rank0]: s3-sync: upload stalled for 612 s
      {TIMEOUT}
  - name: finished-then-timeout
    expect: no-match
    log: |
      [rank0]: s3-sync: upload finished in 41 s
      {TIMEOUT}
"""
TEMPLATE = """\
{% set stall = evidence[0] %}
Rank {{ stall.rank }}'s upload stalled for {{ stall.stalled_s | seconds }} (line {{ stall.line }}).
"""


@pytest.fixture(autouse=True)
def _no_env_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_TRIAGE_RULES", raising=False)


def team(tmp_path: Path, name: str = "team", **files: str) -> Path:
    """A team directory: the good rule, signal and template, with ``files`` replacing them."""
    d = tmp_path / name
    contents = {
        "s3-upload-stall.yaml": RULE,
        "signals/s3_upload_stall.yaml": SIGNAL,
        "templates/s3-upload-stall.md.j2": TEMPLATE,
    }
    contents.update({k.replace("__", "/"): v for k, v in files.items()})
    for rel, text in contents.items():
        if text is None:
            continue
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return d


def rule_file(d: Path) -> str:
    return str(d / "s3-upload-stall.yaml")


# ----------------------------------------------------------------------------- generated files


def test_schema_file_is_generated_from_the_loader_definitions() -> None:
    committed = (ROOT / "docs" / "rule-schema.json").read_text("utf-8")
    assert committed == authoring.schema_json(), f"regenerate: {authoring.SCHEMA_COMMAND}"


def test_rule_reference_is_generated_from_the_rules() -> None:
    committed = (ROOT / "docs" / "rules.md").read_text("utf-8")
    assert committed == authoring.rules_markdown(load_ruleset()), (
        f"regenerate: {authoring.REFERENCE_COMMAND}"
    )


def test_schema_has_exactly_the_loader_keys() -> None:
    schema = authoring.rule_schema()
    for name, shape in SHAPES.items():
        definition = schema["definitions"][name]
        assert tuple(definition["properties"]) == shape.names
        assert definition["additionalProperties"] is False
        assert tuple(definition.get("required", ())) == shape.required
    rule = schema["definitions"]["rule"]["properties"]
    assert rule["cause"]["enum"] == list(CAUSES)


def test_builtin_files_validate_against_the_schema_and_bad_ones_do_not() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(authoring.rule_schema())
    jsonschema.Draft7Validator.check_schema(authoring.rule_schema())
    rules_dir = builtin_dirs()[0]
    files = sorted([*rules_dir.glob("*.yaml"), *rules_dir.glob("signals/*.yaml")])
    assert len(files) > 20
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, (path, errors)
    rule = yaml.safe_load(RULE)
    rule["context"][0]["withn"] = rule["context"][0].pop("within")
    assert any("'withn' was unexpected" in e.message for e in validator.iter_errors(rule))
    rule = yaml.safe_load(RULE)
    rule["examples"] = rule["examples"][:1]  # no no-match example
    assert list(validator.iter_errors(rule))
    rule = yaml.safe_load(RULE)
    rule["cause"] = "cosmic_rays"
    assert list(validator.iter_errors(rule))
    signal = yaml.safe_load(SIGNAL)
    signal["patterns"][0]["regx"] = signal["patterns"][0].pop("regex")
    assert list(validator.iter_errors(signal))


@pytest.mark.skipif(not SPEC_CAUSES.is_file(), reason="shared/spec is not beside the repository")
def test_causes_are_those_of_the_spec() -> None:
    table = re.findall(r"^\| `([a-z_0-9]+)` \|", SPEC_CAUSES.read_text("utf-8"), re.MULTILINE)
    assert set(CAUSES) == set(table) - {"none"}  # 'none' is a verdict, no rule diagnoses it


# ----------------------------------------------------------------------------- lint


def test_builtin_rules_lint_clean() -> None:
    result = authoring.lint([builtin_dirs()[0]])
    assert result.problems == []
    assert result.rules >= 14 and result.signals >= 10


def test_good_team_rule_lints_clean_next_to_builtins(tmp_path: Path) -> None:
    result = authoring.lint([team(tmp_path)])
    assert result.problems == []
    assert (result.rules, result.signals, result.files) == (1, 1, 2)


def test_lint_reports_a_misspelled_key_with_file_and_line(tmp_path: Path) -> None:
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE.replace("    within:", "    withn:")})
    assert authoring.lint([d]).problems == [
        (
            f"{rule_file(d)}:9: context[0]: unknown key 'withn' "
            "(expected: event, where, within, direction, present, same_rank, other_rank, name,"
            " culprit, running, optional, outside_nccl, fr_culprit)"
        )
    ]


def test_lint_reports_every_problem_of_every_file_in_order(tmp_path: Path) -> None:
    bad_rule = RULE.replace("cause: slow_checkpoint_save", "cause: cosmic_rays").replace(
        "severity: high", "severity: severe"
    )
    bad_signal = SIGNAL.replace("regex: 's3-sync", "regex: '(?<=x)s3-sync")
    d = team(
        tmp_path, **{"s3-upload-stall.yaml": bad_rule, "signals__s3_upload_stall.yaml": bad_signal}
    )
    problems = authoring.lint([d]).problems
    assert [p.split(": ")[0] for p in problems] == [
        f"{rule_file(d)}:3",
        f"{rule_file(d)}:4",
        f"{d / 'signals' / 's3_upload_stall.yaml'}:5",
    ]
    assert "cause 'cosmic_rays' is not in docs/causes.md" in problems[0]
    assert "RE2" in problems[2]


def test_ids_must_be_unique_across_linted_directories(tmp_path: Path) -> None:
    a, b = team(tmp_path, "a"), team(tmp_path, "b")
    problems = authoring.lint([a, b]).problems
    assert (
        f"{b / 's3-upload-stall.yaml'}:1: rule 's3-upload-stall' is also defined in"
        in (problems[0])
    )
    assert any("signal 's3_upload_stall' is also defined" in p for p in problems)


def test_a_builtin_id_is_replaced_with_a_notice_not_an_error(tmp_path: Path) -> None:
    text = RULE.replace("id: s3-upload-stall", "id: timeout-too-short")
    d = team(tmp_path, **{"s3-upload-stall.yaml": None, "timeout-too-short.yaml": text})
    result = authoring.lint([d])
    assert result.problems == []
    assert any("rule 'timeout-too-short' replaces" in n for n in result.notices)


def test_lint_renders_the_template_on_each_matching_example(tmp_path: Path) -> None:
    d = team(tmp_path, **{"templates__s3-upload-stall.md.j2": "{{ evidence[0].stalled_secs }}"})
    (problem,) = authoring.lint([d]).problems
    assert problem.startswith(f"{rule_file(d)}:13: examples[0] 'stall-then-timeout': ")
    assert "the advice does not render" in problem and "undefined" in problem


def test_lint_reports_a_missing_template(tmp_path: Path) -> None:
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE.replace("advice: s3-", "advice: s4-")})
    (problem,) = authoring.lint([d]).problems
    assert problem.startswith(
        f"{rule_file(d)}:10: advice template 's4-upload-stall.md.j2' not found"
    )


def test_lint_finds_unreachable_signal_patterns(tmp_path: Path) -> None:
    # Without anchors, or ignoring case, the scan runs the pattern itself: reachable.
    no_anchor = SIGNAL.replace('    anchors: ["s3-sync: upload stalled"]\n', "")
    d = team(tmp_path, **{"signals__s3_upload_stall.yaml": no_anchor})
    assert authoring.lint([d]).problems == []
    d = team(tmp_path, "t3", **{"signals__s3_upload_stall.yaml": SIGNAL + "ignore_case: true\n"})
    assert authoring.lint([d]).problems == []
    # An anchor the matching line does not hold makes the pattern unreachable.
    wrong_anchor = SIGNAL.replace('["s3-sync: upload stalled"]', '["s3-sync: upload stalled!"]')
    d = team(tmp_path, "t2", **{"signals__s3_upload_stall.yaml": wrong_anchor})
    (problem,) = authoring.lint([d]).problems
    assert "matches line 1 of example s3-upload-stall::stall-then-timeout" in problem
    assert "holds none of its anchors" in problem


def test_lint_checks_names_and_file_suffixes(tmp_path: Path) -> None:
    d = team(tmp_path, **{"Other_Rule.yml": "id: x\n"})
    (problem,) = authoring.lint([d]).problems
    assert problem == f"{d / 'Other_Rule.yml'}:1: not loaded: rule and signal files end in .yaml"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert authoring.lint([empty]).problems == [
        f"{empty}: no rule files (*.yaml) or signal files (signals/*.yaml)"
    ]


def test_lint_rejects_unknown_facts_and_bad_operands(tmp_path: Path) -> None:
    text = RULE.replace(
        "advice:", "facts:\n  ranks_timed_ot: {gt: 1}\n  timeouts: {in: 3}\nadvice:"
    )
    d = team(tmp_path, **{"s3-upload-stall.yaml": text})
    problems = authoring.lint([d]).problems
    assert problems[0].startswith(f"{rule_file(d)}:11: facts: unknown fact 'ranks_timed_ot'")
    assert problems[1] == f"{rule_file(d)}:12: facts: timeouts: 'in' takes a list"


def test_yaml_booleans_in_names_get_a_hint(tmp_path: Path) -> None:
    d = team(
        tmp_path,
        **{"s3-upload-stall.yaml": RULE.replace("name: finished-then-timeout", "name: no")},
    )
    (problem,) = authoring.lint([d]).problems
    assert "'name' must be a non-empty string (YAML reads an unquoted yes/no" in problem


# ----------------------------------------------------------------------------- test


def test_run_tests_passes_a_good_rule(tmp_path: Path) -> None:
    run = authoring.run_tests([team(tmp_path)])
    assert (run.passed, run.failed, run.problems) == (2, 0, [])
    assert [r.id for r in run.results] == [
        "s3-upload-stall::stall-then-timeout",
        "s3-upload-stall::finished-then-timeout",
    ]


def test_run_tests_says_what_was_expected_and_what_fired(tmp_path: Path) -> None:
    text = RULE.replace("s3-sync: upload stalled for 612 s", "s3-sync: upload stuck for 612 s")
    run = authoring.run_tests([team(tmp_path, **{"s3-upload-stall.yaml": text})])
    assert (run.passed, run.failed) == (1, 1)
    failure = next(r for r in run.results if not r.passed)
    assert failure.example.name == "stall-then-timeout"
    assert failure.fired == ["unknown-cause"]
    assert failure.reason == "context[0]: no s3_upload_stall before within 5000 lines of line 2"


def test_run_tests_reports_a_rule_that_fires_where_it_must_not(tmp_path: Path) -> None:
    text = RULE.replace("s3-sync: upload finished in 41 s", "s3-sync: upload stalled again")
    run = authoring.run_tests([team(tmp_path, **{"s3-upload-stall.yaml": text})])
    failure = next(r for r in run.results if not r.passed)
    assert failure.example.name == "finished-then-timeout"
    assert "s3-upload-stall" in failure.fired


def test_run_tests_only_disable_and_load_problems(tmp_path: Path) -> None:
    run = authoring.run_tests([], only=["timeout-too-short"])
    assert run.passed == len(run.results) >= 2 and run.failed == 0
    assert (
        authoring.run_tests([], only=["nope"]).problems[0].startswith("--only/--disable: no rule")
    )
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE.replace("title:", "titel:")})
    run = authoring.run_tests([d])
    assert run.results == [] and any("unknown key 'titel'" in p for p in run.problems)


def test_file_examples_are_relative_to_the_rule_file(tmp_path: Path) -> None:
    text = RULE.replace(
        "    log: |\n      [rank0]: s3-sync: upload stalled for 612 s\n      " + TIMEOUT + "\n",
        "    file: logs/stall.log\n",
    )
    d = team(tmp_path, **{"s3-upload-stall.yaml": text})
    (d / "logs").mkdir()
    (d / "logs" / "stall.log").write_text(
        f"[rank0]: s3-sync: upload stalled for 612 s\n{TIMEOUT}\n", encoding="utf-8"
    )
    run = authoring.run_tests([d])
    assert (run.passed, run.failed) == (2, 0)
    assert run.results[0].example.file == str(d / "logs" / "stall.log")


def test_match_examples_pin_the_lines_the_finding_quotes(tmp_path: Path) -> None:
    pinned = RULE.replace("s3-sync: upload stalled for 612 s']", "upload stalled for 612 s']", 1)
    run = authoring.run_tests([team(tmp_path / "a", **{"s3-upload-stall.yaml": pinned})])
    assert (run.passed, run.failed) == (2, 0)
    wrong = RULE.replace("s3-sync: upload stalled for 612 s']", "upload finished']", 1)
    run = authoring.run_tests([team(tmp_path / "b", **{"s3-upload-stall.yaml": wrong})])
    assert run.failed == 1
    assert "does not quote 'upload finished'" in next(
        r.message for r in run.results if not r.passed
    )


def test_corpus_shows_where_each_rule_fires(tmp_path: Path) -> None:
    d = team(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.log").write_text(f"x\n[rank0]: s3-sync: upload stalled for 9 s\n{TIMEOUT}\n")
    (corpus / "b.log").write_text(f"{TIMEOUT}\n")
    (corpus / "manifest.yaml").write_text("not: a log\n")
    run = authoring.run_tests([d])
    assert run.selection is not None
    found = authoring.corpus_hits(run.selection.ruleset, run.selection.rules, corpus)
    assert [p.name for p in found.logs] == ["a.log", "b.log"]
    assert found.hits == {"s3-upload-stall": [(corpus / "a.log", 3, "s3-upload-stall")]}


# ----------------------------------------------------------------------------- new


def test_scaffold_writes_files_whose_examples_pass_at_once(tmp_path: Path) -> None:
    d = tmp_path / "team-rules"
    made = authoring.scaffold("s3-upload-stall", "slow_checkpoint_save", d)
    assert made.paths == [
        d / "s3-upload-stall.yaml",
        d / "signals" / "s3_upload_stall.yaml",
        d / "templates" / "s3-upload-stall.md.j2",
    ]
    run = authoring.run_tests([d])
    assert (run.passed, run.failed, run.problems) == (2, 0, [])
    problems = authoring.lint([d]).problems
    assert problems and all("placeholder 'TODO' left to fill in" in p for p in problems)
    assert {Path(p.split(":")[0]) for p in problems} == set(made.paths)


def test_scaffold_refuses_bad_input_and_existing_files(tmp_path: Path) -> None:
    with pytest.raises(TriageError, match="kebab-case"):
        authoring.scaffold("S3_Stall", "slow_checkpoint_save", tmp_path)
    with pytest.raises(TriageError, match=r"not in docs/causes\.md"):
        authoring.scaffold("s3-stall", "cosmic_rays", tmp_path)
    with pytest.raises(TriageError, match="built-in signal"):
        authoring.scaffold("checkpoint-save", "slow_checkpoint_save", tmp_path)
    authoring.scaffold("s3-stall", "slow_checkpoint_save", tmp_path)
    with pytest.raises(TriageError, match="exists already"):
        authoring.scaffold("s3-stall", "slow_checkpoint_save", tmp_path)
    authoring.scaffold("s3-stall", "oom_hidden", tmp_path, force=True)
    assert "cause: oom_hidden" in (tmp_path / "s3-stall.yaml").read_text()


# ----------------------------------------------------------------------------- list and show


def test_show_renders_the_advice_on_the_first_matching_example(tmp_path: Path) -> None:
    rs = load_ruleset([team(tmp_path)])
    shown = authoring.show(rs, "s3-upload-stall")
    assert shown.example == "stall-then-timeout"
    assert shown.advice == "Rank 0's upload stalled for 10.2 min (line 1).\n"
    assert shown.text == RULE
    with pytest.raises(TriageError, match="no rule 'nope'"):
        authoring.show(rs, "nope")


def test_rows_and_reference_name_team_rules(tmp_path: Path) -> None:
    rs = load_ruleset([team(tmp_path)])
    rows = authoring.rule_rows(rs.rules)
    assert (
        "slow-checkpoint-save",
        "slow_checkpoint_save",
        "high",
        "Collective timed out while a rank was saving a checkpoint",
        "rules/slow-checkpoint-save.yaml",
    ) in rows
    assert rows[-1][0] == "s3-upload-stall"
    md = authoring.rules_markdown(rs)
    assert (
        "## s3-upload-stall" in md and "- with `s3_upload_stall` before it, within 5000 lines" in md
    )


# ----------------------------------------------------------------------------- rule sources


def test_env_path_list_adds_directories_and_a_dir_is_loaded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = team(tmp_path, "a")
    b = team(
        tmp_path,
        "b",
        **{
            "s3-upload-stall.yaml": None,
            "signals__s3_upload_stall.yaml": None,
            "other-stall.yaml": RULE.replace("id: s3-upload-stall", "id: other-stall").replace(
                "advice: s3-upload-stall", "advice: other-stall"
            ),
            "templates__other-stall.md.j2": TEMPLATE,
        },
    )
    monkeypatch.setenv("NCCL_TRIAGE_RULES", f"{a}:{b}")
    rs = load_ruleset([a, builtin_dirs()[0]])
    assert rs.rule("s3-upload-stall") and rs.rule("other-stall")  # b names a's signal
    assert rs.notices == []
    rs = load_ruleset(only=["other-stall"])
    assert [r.id for r in rs.rules] == ["other-stall"]


def test_team_signal_replaces_a_builtin_one_with_a_notice(tmp_path: Path) -> None:
    sig = SIGNAL.replace("id: s3_upload_stall", "id: checkpoint_save")
    d = team(tmp_path, **{"signals__checkpoint_save.yaml": sig})
    rs, problems = collect_ruleset([d])
    assert problems == []
    assert any("signal 'checkpoint_save' replaces" in n for n in rs.notices)


# ----------------------------------------------------------------------------- hostile rules


def test_hostile_yaml_tag_is_refused_and_builds_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = RULE.replace(
        "title: A checkpoint", f"title: !!python/object/apply:os.system ['touch {marker}']\nx: A"
    )
    d = team(tmp_path, **{"s3-upload-stall.yaml": text})
    (problem,) = authoring.lint([d]).problems
    assert problem == (
        f"{rule_file(d)}:2: invalid YAML: tag '!!python/object/apply:os.system' refused: "
        "rule files are plain data, tags that build objects are not allowed"
    )
    assert not marker.exists()


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        bomb += (
            f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        )
    d = team(tmp_path, **{"s3-upload-stall.yaml": RULE + bomb})
    (problem,) = authoring.lint([d]).problems
    assert problem.endswith("invalid YAML: YAML aliases (*name) are not allowed in rule files")


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    d = team(
        tmp_path,
        **{
            "s3-upload-stall.yaml": RULE.replace(
                "severity: high\n", "severity: high\nseverity: low\n"
            )
        },
    )
    assert authoring.lint([d]).problems == [f"{rule_file(d)}:5: duplicate key 'severity'"]


def test_hostile_template_is_refused_by_the_sandbox(tmp_path: Path) -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    d = team(tmp_path, **{"templates__s3-upload-stall.md.j2": evil})
    (problem,) = authoring.lint([d]).problems
    assert "the advice does not render" in problem
    assert re.search(r"sandbox|undefined", problem)


@pytest.mark.parametrize(
    "regex", [r"(s3)-sync: \1", r"s3-sync(?=: upload)", r"(?<!x)s3-sync", r"s3-sync(?!x)"]
)
def test_backreferences_and_lookarounds_are_refused_naming_re2(tmp_path: Path, regex: str) -> None:
    sig = SIGNAL.replace(r"'s3-sync: upload stalled(?: for (?P<stalled_s>\d+) s)?'", f"'{regex}'")
    d = team(tmp_path, **{"signals__s3_upload_stall.yaml": sig})
    with pytest.raises(RuleError) as info:
        load_ruleset([d])
    msg = str(info.value)
    assert msg.startswith(
        f"{d / 'signals' / 's3_upload_stall.yaml'}:5: patterns[0]: regex does not compile under RE2"
    )
    assert "RE2 has no backreferences or lookarounds" in msg


def test_a_catastrophic_pattern_runs_in_linear_time(tmp_path: Path) -> None:
    # (a+)+$ takes exponential time in a backtracking engine on 'aaaa...b'; RE2 is linear.
    sig = SIGNAL.replace(
        r"'s3-sync: upload stalled(?: for (?P<stalled_s>\d+) s)?'", "'(a+)+$'"
    ).replace('["s3-sync: upload stalled"]', '["aaaa"]')
    d = team(tmp_path, **{"signals__s3_upload_stall.yaml": sig})
    rs, problems = collect_ruleset([d])
    assert not [p for p in problems if "RE2" in p]
    hostile = "a" * 100_000 + "b"
    start = time.perf_counter()
    report = triage_text(f"{hostile}\n{hostile}\n{TIMEOUT}\n", rs)
    assert time.perf_counter() - start < 5
    assert report.verdict == "nccl_timeout"
    import re2

    start = time.perf_counter()
    assert re2.compile("(a+)+$").search(hostile) is None
    assert time.perf_counter() - start < 1


def test_a_huge_repetition_is_refused_not_compiled(tmp_path: Path) -> None:
    sig = SIGNAL.replace(r"(?: for (?P<stalled_s>\d+) s)?", "((a{100}){100}){100}")
    d = team(tmp_path, **{"signals__s3_upload_stall.yaml": sig})
    problems = authoring.lint([d]).problems
    assert any("regex does not compile under RE2: invalid repetition size" in p for p in problems)


def test_schema_json_is_valid_json_with_both_file_kinds() -> None:
    schema = json.loads(authoring.schema_json())
    assert schema["if"] == {"required": ["patterns"]}
    assert {"rule", "signal", "clause", "example", "pattern"} <= set(schema["definitions"])


def test_lint_asks_a_match_example_to_pin_what_the_finding_quotes(tmp_path: Path) -> None:
    unpinned = RULE.replace(
        "    evidence: ['Watchdog caught collective operation timeout', "
        "'s3-sync: upload stalled for 612 s']\n",
        "",
    )
    assert unpinned != RULE
    result = authoring.lint([team(tmp_path, **{"s3-upload-stall.yaml": unpinned})])
    [problem] = result.problems
    assert "examples[0] 'stall-then-timeout': a 'match' example pins the lines" in problem
    assert "it quotes: [rank1]:[E611" in problem and "s3-sync: upload stalled for 612 s" in problem


def test_libyaml_and_the_python_loader_read_every_rule_file_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nccl_triage.ruleset import doccache, safeyaml, yamlparse

    monkeypatch.setattr(doccache, "lookup", lambda text: None)  # parse every time
    root = Path(__file__).resolve().parents[1] / "rules"
    bad = {
        "alias.yaml": "a: &x [1, 2]\nb: *x\n",
        "dup.yaml": "a: 1\nb: 2\na: 3\n",
        "tag.yaml": "a: !!python/object/apply:os.system ['true']\n",
        "broken.yaml": "a: [1\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    files = sorted(root.rglob("*.yaml")) + sorted(tmp_path.glob("*.yaml"))

    def read_all() -> list[tuple[object, list[str], object]]:
        out = []
        for f in files:
            data, problems = safeyaml.load_yaml(f)
            # the same data, the same problems at the same lines (libyaml words syntax errors
            # its own way)
            where = [p.partition(" invalid YAML: ")[0] for p in problems]
            out.append((data, where, safeyaml.line_of(data) if data is not None else None))
        return out

    fast = read_all()
    monkeypatch.setattr(yamlparse, "_CBase", None)
    assert read_all() == fast
    assert sum(1 for _, problems, _ in fast if problems) == len(bad)


def test_rule_files_parsed_before_are_read_back_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rule file, and files with problems, read from the cache of parsed files: the same
    data at the same lines, the same problems; no YAML parser imported for them; a cache
    that another user could have written, or a damaged one, is not read."""
    import os
    import subprocess
    import sys

    from nccl_triage.ruleset import doccache, safeyaml

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(doccache, "_known", None)
    root = Path(__file__).resolve().parents[1] / "rules"
    (tmp_path / "dup.yaml").write_text("a: 1\nb: [x, {c: 2.5, d: null}]\na: 3\n")
    (tmp_path / "date.yaml").write_text("when: 2024-01-02\n")  # (a date: not kept)
    files = sorted(root.rglob("*.yaml")) + sorted(tmp_path.glob("*.yaml"))

    def lines(obj: object) -> list[object]:
        """The lines of every mapping, key and list inside, depth first."""
        if isinstance(obj, safeyaml.YamlMap):
            inner = [x for v in obj.values() for x in lines(v)]
            return [obj.line, dict(obj.key_lines), *inner]
        if isinstance(obj, safeyaml.YamlSeq):
            return [obj.line, *[x for v in obj for x in lines(v)]]
        return []

    def read_all() -> list[tuple[object, list[str], list[object]]]:
        out = []
        for f in files:
            data, problems = safeyaml.load_yaml(f)
            out.append((data, problems, lines(data)))
        return out

    parsed = read_all()
    doccache.save()
    monkeypatch.setattr(doccache, "_known", None)
    assert read_all() == parsed
    assert len(doccache._load()) == len(files) - 1  # all but the date
    # a fresh process reads the built-in rules without importing yaml
    code = (
        "import sys; from nccl_triage.ruleset import loader; loader.load_ruleset(); "
        "print('yaml' in sys.modules)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def yaml_imported() -> list[str]:
        run = [sys.executable, "-c", code]
        return subprocess.run(
            run, env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    assert yaml_imported() == ["False"]  # (every rule file was kept by the reads above)
    assert yaml_imported() == ["False"]
    # writable by others: not read
    stored = doccache._file(tmp_path / "cache" / "nccl-triage" / "rules")
    stored.chmod(0o666)
    monkeypatch.setattr(doccache, "_known", None)
    assert doccache._load() == {}
    stored.chmod(0o600)
    stored.write_text(stored.read_text()[:100])  # damaged
    monkeypatch.setattr(doccache, "_known", None)
    assert doccache._load() == {}
    assert read_all() == parsed
    # nested beyond reason, or an entry of another form: a miss, no traceback
    nested = "[" * 50_000 + "]" * 50_000
    deep = f'{{"stamp": "{doccache._stamp()}", "documents": {nested}}}'
    stored.write_text(deep)
    monkeypatch.setattr(doccache, "_known", None)
    assert doccache._load() == {}
    text = files[0].read_text()
    monkeypatch.setattr(doccache, "_known", {doccache._digest(text): [["x", 1], []]})
    assert doccache.lookup(text) is None
    monkeypatch.setattr(doccache, "_changed", False)
