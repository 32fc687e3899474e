"""Job facts across ranks: who timed out where, and whether the ranks disagree."""

from __future__ import annotations

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
