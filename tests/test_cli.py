"""The command line: exit codes, one-line errors, formats."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from nccl_triage.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
TIMEOUT = (
    "[rank1]:[E1121 10:11:12.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=57, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) "
    "ran for 600038 milliseconds before timing out.\n"
)


def invoke(args: list[str], code: int, input: str | bytes | None = None) -> Result:
    result = CliRunner().invoke(main, args, input=input)
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_parse_stdin_jsonl() -> None:
    result = invoke(["parse", "--format", "jsonl", "-"], 1, input=TIMEOUT)
    event = json.loads(result.output.splitlines()[0])
    assert event["kind"] == "watchdog_timeout"
    assert (event["rank"], event["seq"], event["op_type"], event["numel_out"]) == (
        1,
        57,
        "ALLGATHER",
        4,
    )
    assert (event["timeout_ms"], event["ran_for_ms"], event["source"]) == (
        600000,
        600038,
        "<stdin>",
    )


def test_parse_table_of_a_gzip_file(tmp_path: Path) -> None:
    path = tmp_path / "job.log.gz"
    path.write_bytes(gzip.compress(TIMEOUT.encode()))
    result = invoke(["parse", str(path)], 1)
    assert "watchdog_timeout" in result.output and "ALLGATHER" in result.output


def test_clean_input_exits_zero() -> None:
    result = invoke(["triage", "-"], 0, input="step 1 loss 0.3\nstep 2 loss 0.2\n")
    assert "clean" in result.output


def test_missing_input_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(main, ["triage", "/no/such/file.log"])
    assert result.exit_code == 2
    assert result.output.strip() == "nccl-triage: /no/such/file.log: no such file"


def test_one_bad_input_among_good_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["triage", "/no/such/file.log", str(FIXTURES / "two-node-wrong-ifname.log")]
    )
    assert result.exit_code == 1
    assert "network_interface_misconfig" in result.output


def test_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress(TIMEOUT.encode() * 50)[:-20])
    result = CliRunner().invoke(main, ["triage", str(path)])
    assert result.exit_code == 2
    assert f"{path}: truncated gzip data" in result.output
    assert "Traceback" not in result.output


def test_triage_json_and_markdown() -> None:
    log = str(FIXTURES / "lora-oom-hidden-by-timeout.log")
    data = json.loads(invoke(["triage", "--format", "json", log], 1).output)
    assert data["diagnoses"][0]["cause"] == "oom_hidden"
    md = invoke(["triage", "--format", "markdown", log], 1).output
    assert md.startswith("### nccl-triage:") and "`oom_hidden`" in md


def test_explain_lists_every_rule() -> None:
    out = invoke(["triage", "--explain", str(FIXTURES / "two-node-wrong-ifname.log")], 1).output
    assert "fired  interface-misconfig" in out
    assert "silent slow-checkpoint-save" in out


def test_text_output_has_no_colour_when_piped_and_colour_when_asked() -> None:
    log = str(FIXTURES / "two-node-wrong-ifname.log")
    assert "\x1b[" not in invoke(["triage", log], 1).output
    assert "\x1b[" in invoke(["triage", "--color", log], 1).output


def test_bad_team_rules_exit_2_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("id: x\ntitel: typo\n", encoding="utf-8")
    result = CliRunner().invoke(
        main, ["triage", "--rules", str(tmp_path), str(FIXTURES / "two-node-wrong-ifname.log")]
    )
    assert result.exit_code == 2
    assert f"{tmp_path / 'x.yaml'}:2: unknown key 'titel'" in result.output


def test_an_unreadable_input_beside_a_clean_one_is_not_clean(tmp_path: Path) -> None:
    clean = tmp_path / "clean.log"
    clean.write_text("step 1 loss 0.3\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["triage", "/no/such/file.log", str(clean)])
    assert result.exit_code == 2


def test_evidence_lines_are_not_repeated() -> None:
    out = invoke(["triage", str(FIXTURES / "two-node-wrong-ifname.log")], 1).output
    evidence = [line for line in out.splitlines() if "two-node-wrong-ifname.log:" in line]
    assert len(evidence) == len(set(evidence))


def test_last_error_at_the_very_end_is_read_not_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "cut.log"
    log.write_text(
        "[rank0]:[E1121 10:11:12.1 ProcessGroupNCCL.cpp:1] NCCL error in: x.cpp:1, "
        "unhandled system error, NCCL version 2.21.5\nLast error:",
        encoding="utf-8",
    )
    result = CliRunner().invoke(main, ["triage", str(log)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_one_nccl_warn_line_is_a_failure_for_parse_and_triage_alike(tmp_path: Path) -> None:
    log = tmp_path / "warn.log"
    log.write_text(
        "host:1:2 [0] transport/net_ib.cc:100 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.2<1234> with error 12, opcode 0, len 0, vendor err 129\n",
        encoding="utf-8",
    )
    parsed = CliRunner().invoke(main, ["parse", str(log)])
    triaged = CliRunner().invoke(main, ["triage", str(log)])
    assert parsed.exit_code == triaged.exit_code == 1


def test_an_internal_error_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nccl_triage import pipeline

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(pipeline, "triage_path", broken)
    log = tmp_path / "x.log"
    log.write_text("hello\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["triage", str(log)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "internal error: ValueError: boom" in result.stderr and "--debug" in result.stderr
    result = CliRunner().invoke(main, ["--debug", "triage", str(log)])
    assert result.exit_code == 2 and "Traceback" in result.stderr


def test_empty_and_binary_inputs_say_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    result = CliRunner().invoke(main, ["triage", str(empty), str(binary)])
    assert result.exit_code == 0
    assert f"{empty}: clean" in result.stdout and "note: empty input (0 bytes)" in result.stdout
    assert "note: binary data, not a text log" in result.stdout
    assert f"nccl-triage: {binary}: binary data" in result.stderr
    data = json.loads(invoke(["triage", "--format", "json", str(empty)], 0).stdout)
    assert data["notes"] == ["empty input (0 bytes)"]


def test_a_dense_log_is_read_within_the_budget_and_says_what_it_skipped(tmp_path: Path) -> None:
    line = (
        "[rank{}]:[E1121 10:11:12.123456789 ProcessGroupNCCL.cpp:632] [Rank {}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum={}, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600051 milliseconds before timing out.\n"
    )
    log = tmp_path / "dense.log"
    body = "".join(line.format(r % 8, r % 8, 100 + r) for r in range(1000))
    log.write_text(body + "[rank3]: KeyError: 'input_ids'\n" + line.format(3, 3, 5000), "utf-8")
    out = invoke(["triage", "--max-candidates", "100", str(log)], 1).stdout
    assert "note: 902 of 1,002 candidate lines were skipped" in out
    # the end of the log, where its failure is, was read
    data = json.loads(
        invoke(["triage", "--max-candidates", "100", "--format", "json", str(log)], 1).stdout
    )
    assert any(e.get("seq") == 5000 for e in data["events"])
    full = json.loads(
        invoke(["triage", "--max-candidates", "0", "--format", "json", str(log)], 1).stdout
    )
    assert full["notes"] == [] and len(full["events"]) > len(data["events"])


@pytest.mark.parametrize("command", ["triage", "parse", "watch", "run", "batch", "rules", "fr"])
def test_help_has_no_stray_escapes(command: str) -> None:
    text = invoke([command, "--help"], 0).stdout
    assert "\\b" not in text and "\b" not in text


@pytest.mark.parametrize("command", ["triage", "parse"])
def test_an_unknown_scan_engine_is_one_line_and_exit_2(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "grep")
    result = CliRunner().invoke(main, [command, "-"], input=TIMEOUT)
    assert result.exit_code == 2
    assert result.output.strip() == (
        "nccl-triage: NCCL_TRIAGE_SCAN: expected one of auto, hyperscan, re2, not 'grep'"
    )


def test_hyperscan_asked_for_where_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from nccl_triage.ingest import hsdb

    monkeypatch.setattr(hsdb, "hyperscan_module", lambda: None)
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "hyperscan")
    result = CliRunner().invoke(main, ["triage", "-"], input=TIMEOUT)
    assert result.exit_code == 2
    assert "NCCL_TRIAGE_SCAN: hyperscan is not installed" in result.output
    monkeypatch.setenv("NCCL_TRIAGE_SCAN", "re2")
    invoke(["triage", "-"], 1, input=TIMEOUT)


def test_the_top_level_help_lists_each_command_as_its_own_help_says() -> None:
    """--help names the commands without importing them: their summaries are kept here."""
    import click

    from nccl_triage.cli import _SUMMARIES

    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        assert cmd is not None and cmd.help is not None
        assert _SUMMARIES[name] == cmd.help.split("\n\n")[0].strip(), name
    out = CliRunner().invoke(main, ["--help"]).stdout
    assert all(f"  {name}  " in out for name in _SUMMARIES)


def test_the_top_level_help_imports_no_command() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from nccl_triage.cli import main; "
        "CliRunner().invoke(main, ['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith('nccl_triage.cli.') "
        "and m != 'nccl_triage.cli.common'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_triage_without_dumps_imports_no_flight_recorder_code() -> None:
    log = Path(__file__).resolve().parents[1] / "fixtures/logs/lora-oom-hidden-by-timeout.log"
    code = (
        "import sys; from click.testing import CliRunner; from nccl_triage.cli import main; "
        f"CliRunner().invoke(main, ['triage', {str(log)!r}]); "
        "print(sorted(m for m in sys.modules if m.startswith('nccl_triage.flightrec')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
