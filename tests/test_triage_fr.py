"""triage LOG --fr DIR: the real gloo dumps of tests/data/fr joined with small logs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import nccl_triage
from nccl_triage.cli import main
from nccl_triage.diagnose.engine import Ranks, weigh
from nccl_triage.model import Event, Kind
from nccl_triage.pipeline import triage_text
from nccl_triage.ruleset import load_ruleset

DATA = Path(__file__).resolve().parent / "data" / "fr"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "expected.json").is_file())
RULESET = load_ruleset()
TIMEOUT = (
    "[rank{rank}]:[E1121 10:21:12.{rank}23456789 ProcessGroupNCCL.cpp:632] [Rank {rank}] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
    "NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600051 milliseconds before timing out.\n"
)


def expected(scenario: str) -> dict[str, Any]:
    return json.loads((DATA / scenario / "expected.json").read_text(encoding="utf-8"))


def timeouts(seq: int, ranks: list[int]) -> str:
    """What the job's stderr shows: the ranks that waited time out at the stuck collective."""
    return "".join(TIMEOUT.format(rank=r, seq=seq) for r in ranks)


def job_log(tmp_path: Path, scenario: str, before: str = "") -> Path:
    exp = expected(scenario)
    waited = [r for r in range(4) if r not in exp["culprit_ranks"]]
    log = tmp_path / f"{scenario}.log"
    log.write_text(before + timeouts(exp["stuck_seq"], waited), encoding="utf-8")
    return log


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["triage", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


# --- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_triage_with_dumps_names_the_culprit_side_and_frame(tmp_path: Path, scenario: str) -> None:
    exp = expected(scenario)
    log = job_log(tmp_path, scenario)
    code, out, err = run(str(log), "--fr", str(DATA / scenario))
    assert code == 1 and err == ""
    culprit = exp["culprit_ranks"][0]
    assert f"on rank {culprit} (line" in out.splitlines()[0]
    assert f"culprit rank(s) {culprit}, {exp['side']} side" in out
    if exp["frame_function"]:
        assert "last user frame: " in out and f"in {exp['frame_function']}" in out
    without = run(str(log))[1]
    assert "culprit rank(s)" not in without and f"on rank {culprit} " not in without


def test_text_says_which_ranks_never_reached_which_collective(tmp_path: Path) -> None:
    out = run(str(job_log(tmp_path, "skip_collective")), "--fr", str(DATA / "skip_collective"))[1]
    assert (
        "rank 2: [cpu] never reached all_reduce #5 [8] of process group 0 (default_pg), "
        "where rank(s) 0-1,3 wait"
    ) in out
    assert "1. [straggler_or_slow_rank]" in out and "rule dump-cpu-stall" in out
    assert "blamed by the flight-recorder dumps: 2" in out


def test_markdown_shows_the_dumps_in_a_block(tmp_path: Path) -> None:
    log = job_log(tmp_path, "python_stall")
    out = run(str(log), "--fr", str(DATA / "python_stall"), "--format", "markdown")[1]
    block = out.split("```")[1]
    assert "culprit rank(s) 0, cpu side" in block and "in save_checkpoint" in block


def test_json_report_gains_the_flight_recorder_fields(tmp_path: Path) -> None:
    log = job_log(tmp_path, "two_groups")
    data = json.loads(run(str(log), "--fr", str(DATA / "two_groups"), "--format", "json")[1])
    assert data["schema"] == "nccl-triage/1.1"
    fr = data["flight_recorder"]
    assert (
        fr["read"] is True and fr["problems"] == [] and fr["sources"] == [str(DATA / "two_groups")]
    )
    assert fr["culprit_ranks"] == [3] and fr["side"] == "cpu"
    assert fr["stuck"]["pg_desc"] == "tp_2_3" and fr["stuck"]["op"] == "all_reduce"
    assert fr["user_frame"]["name"] == "train_step"
    assert data["summary"]["fr_culprit_ranks"] == [3] and data["summary"]["fr_side"] == "cpu"
    facts = data["facts"]
    assert facts["fr_culprit_ranks"] == [3] and facts["culprit_ranks"][0] == 3
    assert (facts["fr_stuck_op"], facts["fr_stuck_seq"], facts["fr_stuck_sizes"]) == (
        "all_reduce",
        5,
        "[4]",
    )
    assert facts["fr_frame_function"] == "train_step"
    plain = json.loads(run(str(log), "--format", "json")[1])
    assert plain["flight_recorder"] is None and plain["facts"]["fr_culprit_ranks"] == []


def test_fr_is_repeatable_and_takes_globs(tmp_path: Path) -> None:
    log = job_log(tmp_path, "skip_collective")
    d = DATA / "skip_collective"
    code, out, err = run(
        str(log), "--fr", str(d / "nccl_trace_rank_[01]"), "--fr", str(d / "nccl_trace_rank_[23]")
    )
    assert code == 1 and err == "" and "4 dump(s), ranks 0-3; culprit rank(s) 2" in out


class _Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned > /dev/null",))


def test_hostile_and_damaged_dumps_cost_one_line_each(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    shutil.copytree(DATA / "skip_collective", dumps)
    (dumps / "nccl_trace_rank_7").write_bytes(pickle.dumps(_Hostile()))
    (dumps / "nccl_trace_rank_8").write_bytes(b"")
    (dumps / "nccl_trace_rank_9").write_bytes(b'{"version": "2.4", "entries": [')
    code, out, err = run(str(job_log(tmp_path, "skip_collective")), "--fr", str(dumps))
    assert code == 1 and "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert lines[0].startswith(f"nccl-triage: {dumps / 'nccl_trace_rank_7'}: refused: ")
    assert "system" in lines[0] and "plain data" in lines[0]
    assert lines[1] == f"nccl-triage: {dumps / 'nccl_trace_rank_8'}: empty file"
    assert lines[2].startswith(f"nccl-triage: {dumps / 'nccl_trace_rank_9'}: damaged JSON dump")
    assert "culprit rank(s) 2, cpu side" in out  # the readable dumps are analysed


def test_no_readable_dump_leaves_the_log_diagnosis(tmp_path: Path) -> None:
    log = job_log(tmp_path, "skip_collective")
    code, out, err = run(str(log), "--fr", str(tmp_path / "nowhere"))
    assert code == 1
    assert err.splitlines()[-1] == (
        f"nccl-triage: {tmp_path / 'nowhere'}: no flight-recorder dump could be read"
    )
    assert "no dump could be read; the diagnosis rests on the log alone" in out
    assert out.splitlines()[0] == run(str(log))[1].splitlines()[0]


def test_clean_log_with_hung_dumps_stays_clean_with_a_note(tmp_path: Path) -> None:
    log = tmp_path / "clean.log"
    log.write_text("{'loss': 0.91, 'learning_rate': 1e-05, 'epoch': 1.0}\n", encoding="utf-8")
    code, out, _ = run(str(log), "--fr", str(DATA / "skip_collective"))
    assert code == 0 and ": clean" in out.splitlines()[0]
    assert "dumps show a stuck process group, but the log shows no NCCL failure" in out
    assert "culprit rank(s) 2" in out


# --- the library ----------------------------------------------------------------------------


def test_library_triage_accepts_dumps(tmp_path: Path) -> None:
    log = job_log(tmp_path, "op_mismatch")
    report = nccl_triage.triage(log, dumps=DATA / "op_mismatch")
    assert report.facts.fr_culprit_ranks == [1] and report.facts.fr_kind == "mismatch"
    assert report.findings[0].rule.id == "dump-mismatch"
    assert report.culprit()[0] == 1
    assert report.flight_recorder is not None and report.flight_recorder.problems == ()
    text = log.read_text(encoding="utf-8")
    again = nccl_triage.triage(
        text, dumps=[str(DATA / "op_mismatch" / f"_dump_{r}") for r in range(4)]
    )
    assert again.facts.fr_culprit_ranks == [1]
    assert nccl_triage.triage(log).flight_recorder is None


# --- rank alignment -------------------------------------------------------------------------

BUSY = (
    "[rank0]: Saving model checkpoint to /ckpt/checkpoint-4\n"
    "[rank2]: Evaluating: 40%|████      | 2/5 [00:03<00:04,  1.50s/it]\n"
)


def test_the_dumps_culprit_decides_between_what_the_log_shows() -> None:
    log = BUSY + timeouts(5, [1])
    alone = triage_text(log, RULESET)
    assert alone.findings[0].rule.id == "slow-checkpoint-save" and alone.culprit()[0] == 0
    joined = triage_text(log, RULESET, dumps=[str(DATA / "skip_collective")])
    assert joined.findings[0].rule.id == "dump-culprit-evaluating"
    assert joined.culprit()[0] == 2
    save = next(f for f in joined.findings if f.rule.id == "slow-checkpoint-save")
    before = next(f for f in alone.findings if f.rule.id == "slow-checkpoint-save")
    assert save.confidence < before.confidence  # the dumps clear rank 0


def test_the_dumps_culprit_saving_is_the_save_rule() -> None:
    log = BUSY + timeouts(9, [1, 2, 3])
    joined = triage_text(log, RULESET, dumps=[str(DATA / "python_stall")])
    assert joined.findings[0].rule.cause == "slow_checkpoint_save"
    assert joined.culprit()[0] == 0
    ids = [f.rule.id for f in joined.findings]
    assert "dump-culprit-saving" in ids and "dump-culprit-evaluating" not in ids


def test_evidence_on_a_blamed_rank_weighs_fully_and_on_a_cleared_one_little() -> None:
    def ev(rank: int) -> Event:
        return Event(Kind.WATCHDOG_TIMEOUT, "x", 10, "x", rank=rank)

    trigger = ev(1)
    ranks = Ranks(frozenset({0, 2}), frozenset({1}), frozenset({2}), frozenset({0, 3}))
    assert weigh(ev(2), trigger, {}, ranks).rank == 1.0
    assert weigh(ev(0), trigger, {}, ranks).rank == 0.4  # a log culprit the dumps clear
    assert weigh(ev(3), trigger, {}, ranks).rank == 0.4
    without = Ranks(frozenset({0, 2}), frozenset({1}))
    assert weigh(ev(0), trigger, {}, without).rank == 1.0


def test_a_fifo_given_as_a_dump_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl_trace_rank_5"
    os.mkfifo(fifo)
    code, _, err = run(str(job_log(tmp_path, "skip_collective")), "--fr", str(fifo))
    assert code == 1
    assert err.splitlines()[0] == f"nccl-triage: {fifo}: not a regular file"
