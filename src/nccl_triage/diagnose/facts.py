"""Facts about the whole job, computed across ranks from the events of one input (or job).

Input: parsed events (and signal events). Output: :class:`JobFacts`, offered to rule
conditions (``facts:``) and to advice templates: which ranks were seen and timed out (and so
which did not: the likely culprits), who is furthest behind, collectives that disagree at the
same SeqNum, the configured timeout against the time the work ran, the data moved, and the
first rank to die according to torchrun.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from nccl_triage.model import Event, Kind
from nccl_triage.model.report import ASSUMED_ELEMENT_BYTES, UNSET_NUMEL, JobFacts


def compute_facts(events: Iterable[Event]) -> JobFacts:
    """Compute the job facts from one input's (or one job's) events."""
    facts = JobFacts()
    seen: set[int] = set()
    timed_out: set[int] = set()
    nranks: list[int] = []
    versions: set[str] = set()
    by_pg_seq: dict[tuple[str | None, int], list[Event]] = defaultdict(list)
    seqs_by_pg: dict[str | None, list[int]] = defaultdict(list)
    ops: list[str] = []
    failed: set[int] = set()
    child_root: Event | None = None
    worker_failures: list[Event] = []
    for ev in events:
        if ev.rank is not None:
            seen.add(ev.rank)
        d = ev.detail
        n = d.get("nranks") if ev.kind == Kind.NCCL_INFO else d.get("expected")
        if isinstance(n, int):
            nranks.append(n)  # NCCL's INIT line, or the store's "k/n clients joined"
        v = d.get("nccl_version")
        if isinstance(v, str):
            versions.add(v.split("+")[0])
        if ev.kind == Kind.WATCHDOG_TIMEOUT:
            facts.timeouts += 1
            if ev.rank is not None:
                timed_out.add(ev.rank)
            if ev.op_type and ev.op_type not in ops:
                ops.append(ev.op_type)
            if ev.seq is not None:
                pg = ev.pg_guid if ev.pg_guid is not None else ev.pg
                by_pg_seq[(pg, ev.seq)].append(ev)
                seqs_by_pg[pg].append(ev.seq)
            if ev.timeout_ms is not None:
                facts.timeout_ms = min(facts.timeout_ms or ev.timeout_ms, ev.timeout_ms)
            if ev.ran_for_ms is not None:
                facts.ran_for_ms = max(facts.ran_for_ms or 0, ev.ran_for_ms)
            for numel in (ev.numel_in, ev.numel_out):
                if numel is not None and numel != UNSET_NUMEL:
                    facts.max_numel = max(facts.max_numel or 0, numel)
            if ev.rank is not None and ev.last_completed is not None:
                facts.last_completed[ev.rank] = ev.last_completed
            if ev.rank is not None and ev.seq is not None:
                facts.last_seq[ev.rank] = max(ev.seq, facts.last_seq.get(ev.rank, ev.seq))
        elif ev.kind == Kind.CHILD_FAILED and ev.form == "root_cause":
            child_root = child_root or ev
        elif ev.kind == Kind.WORKER_FAILED and d.get("exit_code") is not None:
            worker_failures.append(ev)
        if ev.kind in (Kind.CHILD_FAILED, Kind.WORKER_FAILED) and ev.rank is not None:
            failed.add(ev.rank)
    facts.ranks_seen = sorted(seen)
    facts.ranks_timed_out = sorted(timed_out)
    facts.op_types = ops
    facts.nccl_versions = sorted(versions)
    facts.failed_ranks = sorted(failed)
    if nranks:
        facts.world_size = max(nranks)
    if timed_out:
        # Without NCCL's nranks the log may be an excerpt: only ranks it shows are named.
        universe = set(range(facts.world_size)) if facts.world_size else seen
        facts.ranks_not_timed_out = sorted(universe - timed_out)
    all_seqs = [s for seqs in seqs_by_pg.values() for s in seqs]
    if all_seqs:
        facts.min_seq, facts.max_seq = min(all_seqs), max(all_seqs)
        # Only within a process group that the log names: SeqNums of different groups (or of
        # lines that do not say their group) are not comparable.
        spreads = [max(s) - min(s) for pg, s in seqs_by_pg.items() if pg is not None]
        facts.seq_spread = max(spreads, default=0)
    if len(facts.last_completed) >= 2:
        low = min(facts.last_completed.values())
        if low < max(facts.last_completed.values()):
            facts.furthest_behind = sorted(r for r, c in facts.last_completed.items() if c == low)
    by_seq: dict[int, list[tuple[str | None, Event]]] = defaultdict(list)
    for (pg, seq), evs in by_pg_seq.items():
        by_seq[seq].extend((pg, e) for e in evs)
    for seq, members in sorted(by_seq.items()):
        # A watchdog line alone does not name its process group: it may be compared with any.
        named: set[str | None] = {pg for pg, _ in members if pg is not None}
        for pg in named or {None}:
            evs = [e for p, e in members if p is None or p == pg]
            seq_ops = {e.op_type for e in evs if e.op_type is not None}
            numels = {e.numel_in for e in evs if e.numel_in is not None}
            if len(seq_ops) > 1 or len(numels) > 1:
                facts.mismatched_collective = True
                facts.mismatch.append(
                    {
                        "pg": pg,
                        "seq": seq,
                        "ranks": {str(e.rank): f"{e.op_type}(NumelIn={e.numel_in})" for e in evs},
                    }
                )
                break
    if facts.seq_spread > 0:
        facts.mismatched_collective = True
    if facts.max_numel is not None:
        facts.max_bytes = facts.max_numel * ASSUMED_ELEMENT_BYTES
    if child_root is not None:
        facts.first_failure_rank = child_root.rank
        code = child_root.detail.get("exit_code")
        facts.first_failure_exit_code = code if isinstance(code, int) else None
        sig = child_root.detail.get("signal")
        facts.first_failure_signal = sig if isinstance(sig, str) else None
    elif worker_failures:
        first = worker_failures[0]
        code = first.detail.get("exit_code")
        facts.first_failure_rank = first.rank if first.rank is not None else first.local_rank
        facts.first_failure_exit_code = code if isinstance(code, int) else None
        sig = first.detail.get("signal")
        facts.first_failure_signal = sig if isinstance(sig, str) else None
    return facts
