"""Job facts across ranks: who timed out where, and whether the ranks disagree."""

from __future__ import annotations

from pathlib import Path

from nccl_triage.model.report import JobFacts
from nccl_triage.pipeline import triage_text
from nccl_triage.ruleset import load_ruleset

RULES = load_ruleset()


def _wd(rank: int, seq: int, op: str, numel: int = 1) -> str:
    return (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:523] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, "
        f"NumelOut={numel}, Timeout(ms)=1800000) ran for 1800123 milliseconds before timing out."
    )


def facts(*lines: str) -> JobFacts:
    report = triage_text("\n".join(lines) + "\n", RULES, source="t")
    assert report.facts is not None
    return report.facts


def test_ranks_two_seqnums_apart_in_one_group_are_out_of_step() -> None:
    f = facts(_wd(0, 812, "ALLREDUCE"), _wd(1, 812, "ALLREDUCE"), _wd(2, 810, "ALLREDUCE"))
    assert f.out_of_step and f.desync
    assert f.furthest_behind == [2]


def test_different_ops_at_one_seqnum_are_a_mismatch() -> None:
    f = facts(_wd(0, 812, "ALLREDUCE"), _wd(1, 812, "BROADCAST"))
    assert f.mismatched_collective and f.desync


def test_a_rank_stuck_at_two_seqnums_is_in_two_groups_not_out_of_step() -> None:
    # real shape (a job with a data-parallel and a model-parallel group, lines that name no
    # group): rank 4 and rank 7 time out in both; each SeqNum agrees across its ranks
    f = facts(
        _wd(6, 956300, "_ALLGATHER_BASE"),
        _wd(4, 956300, "_ALLGATHER_BASE"),
        _wd(4, 1008, "ALLREDUCE", 4096),
        _wd(7, 956300, "_ALLGATHER_BASE"),
        _wd(7, 1008, "ALLREDUCE", 4096),
    )
    assert not f.out_of_step and not f.mismatched_collective and not f.desync
    assert f.furthest_behind == []


def test_two_groups_split_that_way_still_show_a_mismatch_inside_one() -> None:
    f = facts(
        _wd(4, 1008, "ALLREDUCE"),
        _wd(4, 956300, "_ALLGATHER_BASE"),
        _wd(7, 1008, "BROADCAST"),
    )
    assert f.mismatched_collective


def test_each_rank_s_last_output_before_it_failed_culprits_first() -> None:
    from nccl_triage.render.report import activity_lines

    log = "[default0]:{'loss': 1.15, 'grad_norm': 0.39, 'learning_rate': 1.8e-05, 'epoch': 0.33}\n[default0]: 33%|███▎      | 500/1500 [3:02:11<6:04:22, 21.86s/it]\n[default1]:{'loss': 1.15, 'grad_norm': 0.39, 'learning_rate': 1.8e-05, 'epoch': 0.33}\n[default0]:[INFO|trainer.py:3478] 2024-03-14 05:13:20,402 >> Saving model checkpoint to /ckpt/checkpoint-500\n[default1]:[rank1]:[E314 05:43:21.874425901 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=61734, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=2, Timeout(ms)=1800000) ran for 1800091 milliseconds before timing out.\n[default1]:printed after the failure\n"
    report = triage_text(log, RULES, source="t")
    assert report.facts is not None
    rows = report.facts.rank_activity
    assert [(r["rank"], r["timed_out"], r["line"]) for r in rows] == [(0, False, 4), (1, True, 3)]
    assert rows[0]["progress"]["n"] == 500 and rows[0]["progress"]["total"] == 1500
    text = activity_lines(report)
    assert text[0].startswith("what each rank printed last")
    assert text[1].startswith("  rank 0, line 4: [default0]:[INFO|trainer.py:3478]")
    assert text[2] == "  rank 0, its last bar (line 2): 500/1500 (33%) after 3.0 h"
    assert text[3].startswith("  rank 1 (timed out), line 3:")


def test_a_log_without_ranks_has_one_row_and_a_clean_log_none() -> None:
    lone = (
        "epoch 3 step 1200 loss 0.41\n"
        "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800123 milliseconds "
        "before timing out.\n"
    )
    assert [(r["rank"], r["line"]) for r in facts(lone).rank_activity] == [(None, 1)]
    assert facts("epoch 3 step 1200 loss 0.41").rank_activity == []


def test_nccl_releases_as_pytorch_1_10_printed_them() -> None:
    from nccl_triage.diagnose.facts import nccl_release

    assert nccl_release("21.0.3") == "2.10.3"  # NCCL 2.10.3's code 21003, split the old way
    assert nccl_release("21.1.4") == "2.11.4"
    assert nccl_release("2.10.3+cuda11.3") == "2.10.3"
    assert nccl_release("2.18.1") == "2.18.1" and nccl_release("1.3.4") == "1.3.4"


def test_a_damaged_rank_count_names_no_job() -> None:
    # an NCCL INIT line whose count a paste or a log shipper garbled: no job of 10**12 ranks
    f = facts(
        "node:1:1 [0] NCCL INFO comm 0x55d1c0a2b0 rank 0 nranks 999999999999 cudaDev 0 "
        "busId 18000 - Init COMPLETE",
        _wd(1, 812, "ALLREDUCE"),
    )
    assert f.world_size is None and f.ranks_timed_out == [1]


def test_facts_as_plain_data_are_what_asdict_gives() -> None:
    """The fast copy of the facts equals dataclasses.asdict's (with string keys for ranks)."""
    import dataclasses

    from nccl_triage import triage

    logs = sorted(Path(__file__).parent.parent.joinpath("fixtures", "logs").glob("*.log"))
    assert logs
    for log in logs:
        facts = triage(log).facts
        want = dataclasses.asdict(facts)
        want["last_completed"] = {str(k): v for k, v in facts.last_completed.items()}
        want["last_seq"] = {str(k): v for k, v in facts.last_seq.items()}
        got = facts.to_dict()
        assert got == want
        for name, value in got.items():  # a copy: changing it leaves the facts alone
            if isinstance(value, list | dict) and value:
                assert value is not getattr(facts, name)
