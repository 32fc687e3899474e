"""Per process group, the first collective that went wrong, and why.

Input: a group and where each rank is blocked. Output: a finding (ranks missing, a mismatch,
finished on some ranks only, started on some only), with the suspects it points to; findings
that only echo a rank waiting elsewhere are resolved to that rank.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from nccl_triage.flightrec.groups import Group, first_mismatch, signature
from nccl_triage.flightrec.records import FrRecord
from nccl_triage.flightrec.result import (
    FindingKind,
    GroupFinding,
    RankStatus,
    describe,
)
from nccl_triage.model.ranks import format_ranks


def find(group: Group, blocked: Mapping[int, tuple[str, int, bool]]) -> GroupFinding | None:
    """The first collective of ``group`` that went wrong, or None when the group is not stuck."""
    prog = group.progress
    if not prog:
        return None
    seq = min(p.completed for p in prog.values()) + 1
    reached = [r for r, p in prog.items() if p.enqueued >= seq]
    max_enq = max(p.enqueued for p in prog.values())
    mismatch = first_mismatch(group, seq if reached else max_enq)
    if mismatch is not None:
        return _mismatch_finding(group, *mismatch)
    if reached:
        return _hang_finding(group, seq, reached, blocked)
    return _p2p_finding(group, blocked)


def _majority(group: Group, seq: int) -> FrRecord | None:
    recs = [p.by_seq[seq][0] for p in group.progress.values() if p.by_seq.get(seq)]
    if not recs:
        return None
    common, _ = Counter(signature([r]) for r in recs).most_common(1)[0]
    return next(r for r in recs if signature([r]) == common)


def _statuses(
    group: Group,
    seq: int,
    roles: Mapping[int, tuple[str, str]],
    p2p_rows: Mapping[int, FrRecord] | None,
) -> tuple[RankStatus, ...]:
    """One row per member at collective ``seq``; for a send/recv, only its two sides."""
    rows: list[RankStatus] = []
    ranks = group.members if p2p_rows is None else sorted({*p2p_rows, *roles})
    for rank in ranks:
        p = group.progress.get(rank)
        role, note = roles.get(rank, ("ok", ""))
        if p is None:
            has_dump = rank in group.dumped
            if rank not in roles:
                role, note = ("unknown", "no record of this group") if has_dump else ("no_dump", "")
            rows.append(RankStatus(rank, has_dump, None, None, None, None, role, note))
            continue
        if p2p_rows is not None:
            record = p2p_rows.get(rank)
        else:
            record = p.by_seq[seq][0] if p.by_seq.get(seq) else None
        rows.append(RankStatus(rank, True, p.enqueued, p.started, p.completed, record, role, note))
    return tuple(rows)


def _make(
    group: Group,
    kind: FindingKind,
    seq: int,
    ref: FrRecord | None,
    *,
    missing: Sequence[int] = (),
    mismatch: Sequence[int] = (),
    suspects: Sequence[int] = (),
    waiting: Mapping[int, str] | None = None,
    roles: Mapping[int, tuple[str, str]],
    summary: str,
    p2p_rows: Mapping[int, FrRecord] | None = None,
) -> GroupFinding:
    return GroupFinding(
        pg_name=group.name,
        pg_desc=group.desc,
        members=group.members,
        members_from=group.members_from,
        kind=kind,
        seq=seq,
        p2p=p2p_rows is not None,
        op=ref.op if ref else "?",
        input_sizes=ref.input_sizes if ref else (),
        output_sizes=ref.output_sizes if ref else (),
        input_dtypes=ref.input_dtypes if ref else (),
        output_dtypes=ref.output_dtypes if ref else (),
        missing_ranks=tuple(sorted(missing)),
        mismatch_ranks=tuple(sorted(mismatch)),
        suspects=tuple(sorted(suspects)),
        root=bool(suspects),
        waiting_in=dict(waiting or {}),
        ranks=_statuses(group, seq, roles, p2p_rows),
        summary=summary,
    )


def _mismatch_finding(
    group: Group, seq: int, classes: Mapping[tuple[object, ...], list[int]]
) -> GroupFinding:
    ordered = sorted(classes.values(), key=lambda ranks: (-len(ranks), min(ranks)))
    top = len(ordered[0])
    tied = [ranks for ranks in ordered if len(ranks) == top]
    odd = (
        sorted(r for ranks in ordered for r in ranks)
        if len(tied) > 1
        else sorted(r for ranks in ordered[1:] for r in ranks)
    )
    ref = group.progress[ordered[0][0]].by_seq[seq][0]
    roles = {r: ("mismatch", describe(group.progress[r].by_seq[seq][0])) for r in odd}
    expected = "no majority" if len(tied) > 1 else f"the others called {describe(ref)}"
    summary = (
        f"collective #{seq}: rank(s) {format_ranks(odd)} called "
        f"{describe(group.progress[odd[0]].by_seq[seq][0])}; {expected}"
    )
    return _make(
        group,
        FindingKind.MISMATCH,
        seq,
        ref,
        mismatch=odd,
        suspects=odd,
        roles=roles,
        summary=summary,
    )


def _hang_finding(
    group: Group, seq: int, reached: Sequence[int], blocked: Mapping[int, tuple[str, int, bool]]
) -> GroupFinding:
    prog = group.progress
    ref = _majority(group, seq)
    what = f"{ref.op if ref else 'collective'} #{seq}"
    # A silent rank would list the collective among its unfinished work had it enqueued it.
    missing = sorted([r for r in prog if r not in reached] + list(group.silent))
    undumped = sorted(set(group.members) - set(prog) - group.silent)
    roles: dict[int, tuple[str, str]] = {
        r: ("no_dump", "no dump") if r not in group.dumped else ("unknown", "no record of group")
        for r in undumped
    }
    if missing:
        idle = [r for r in missing if r not in blocked]
        waiting = {r: blocked_at(blocked[r]) for r in missing if r in blocked}
        for r in missing:
            last = f"#{prog[r].enqueued}" if r in prog else "unknown, nothing unfinished here"
            if r in waiting:
                roles[r] = ("waiting", f"never enqueued it (last {last}); waits in {waiting[r]}")
            else:
                roles[r] = ("missing", f"never enqueued it (last {last}); all its work finished")
        summary = f"{what}: rank(s) {format_ranks(missing)} never enqueued it"
        if waiting and not idle:
            summary += ", waiting on unfinished work in another group"
        return _make(
            group,
            FindingKind.MISSING,
            seq,
            ref,
            missing=missing,
            suspects=idle,
            waiting=waiting,
            roles=roles,
            summary=summary,
        )
    if undumped:
        summary = (
            f"{what}: every rank with a record of the group enqueued it; nothing from "
            f"{format_ranks(undumped)}"
        )
        return _make(
            group, FindingKind.NO_DUMP, seq, ref, suspects=undumped, roles=roles, summary=summary
        )
    done = [r for r in reached if prog[r].completed >= seq]
    started = [r for r in reached if (prog[r].started or 0) >= seq]
    timing = any(prog[r].started is not None for r in reached)
    odd = [r for r in reached if r not in started]
    if done:
        roles.update(dict.fromkeys(done, ("ok", "finished it")))
        kind, odd = FindingKind.INCOMPLETE, [r for r in reached if r not in done]
        summary = f"{what}: finished on {format_ranks(done)}, not on {format_ranks(odd)}"
        note = "enqueued, never finished while others did"
    elif timing and started and odd:
        kind = FindingKind.NOT_STARTED
        summary = f"{what}: started on {format_ranks(started)}, never on {format_ranks(odd)}"
        note = "enqueued, never started while others did"
    else:
        kind, odd = FindingKind.UNDETERMINED, list(reached)
        state = "started" if timing and started else "enqueued"
        summary = f"{what}: {state} on every rank, completed on none"
        note = f"{state}, not completed"
    local = [r for r in odd if blocked.get(r, (group.label, seq, False))[:2] == (group.label, seq)]
    waiting = {r: blocked_at(blocked[r]) for r in odd if r not in local and r in blocked}
    for r in odd:
        roles[r] = (str(kind), note) if r in local else ("waiting", f"waits in {waiting.get(r)}")
    if kind is FindingKind.UNDETERMINED and waiting:
        # Nothing tells the members apart, and some cannot run it before older work elsewhere
        # finishes: that older work holds the collective up, not the members waiting here.
        local = []
        summary += f"; rank(s) {format_ranks(waiting)} first wait elsewhere"
    elif not local:
        summary += "; every such rank has older unfinished work elsewhere"
    return _make(
        group, kind, seq, ref, suspects=local, waiting=waiting, roles=roles, summary=summary
    )


def _p2p_finding(group: Group, blocked: Mapping[int, tuple[str, int, bool]]) -> GroupFinding | None:
    """Find the send/recv that holds a group up.

    First a pending op whose peer never posted the matching one (or left nothing about the
    group); else the oldest op posted on both sides and finished on neither. Its sides are
    suspects only when it is the oldest unfinished work of both: a side that first waits for
    older work elsewhere explains it.
    """
    members = group.members
    pairs: list[tuple[int, int, FrRecord, FrRecord]] = []
    for rank, p in sorted(group.progress.items()):
        for record in p.p2p:
            local_peer = record.peer
            if record.finished or local_peer is None or local_peer >= len(members):
                continue
            peer = members[local_peer]
            want = "recv" if record.base_op == "send" else "send"
            where = f"{record.op} (p2p #{record.p2p_seq_id}) on rank {rank}"
            peer_prog = group.progress.get(peer)
            rows = {rank: record}
            if peer_prog is None and peer not in group.silent:
                return _make(
                    group,
                    FindingKind.NO_DUMP,
                    record.p2p_seq_id,
                    record,
                    suspects=[peer],
                    roles={peer: ("no_dump", "no record of the group")},
                    summary=f"{where}: peer {peer} left nothing about this group",
                    p2p_rows=rows,
                )
            me = members.index(rank)
            match = next(
                (
                    q
                    for q in (peer_prog.p2p if peer_prog else [])
                    if q.base_op == want and q.peer == me and not q.finished
                ),
                None,
            )
            if match is not None:
                pairs.append((record.time_created_ns or record.record_id, rank, record, match))
                continue
            idle = peer not in blocked
            waiting = {} if idle else {peer: blocked_at(blocked[peer])}
            note = f"never posted the matching {want}"
            return _make(
                group,
                FindingKind.MISSING,
                record.p2p_seq_id,
                record,
                missing=[peer],
                suspects=[peer] if idle else [],
                waiting=waiting,
                roles={
                    peer: ("missing", note)
                    if idle
                    else ("waiting", f"{note}; waits in {waiting[peer]}")
                },
                summary=f"{where}: rank {peer} never posted the matching {want}",
                p2p_rows=rows,
            )
    if not pairs:
        return None
    _, rank, record, match = min(pairs, key=lambda item: (item[0], item[1]))
    peer = members[record.peer or 0]
    local = [r for r in (rank, peer) if _waits_here(r, group, blocked)]
    waiting = {r: blocked_at(blocked[r]) for r in (rank, peer) if r not in local and r in blocked}
    roles = {r: ("waiting", f"waits in {where}") for r, where in waiting.items()}
    if waiting:
        # One side cannot run its half before older work elsewhere finishes: the other side
        # only waits for it.
        local = []
    roles.update(dict.fromkeys(local, ("undetermined", "posted, not finished")))
    summary = (
        f"{record.op} (p2p #{record.p2p_seq_id}) between ranks {rank} and {peer}: "
        "posted on both, finished on neither"
    )
    return _make(
        group,
        FindingKind.UNDETERMINED,
        record.p2p_seq_id,
        record,
        suspects=local,
        waiting=waiting,
        roles=roles,
        summary=summary,
        p2p_rows={rank: record, peer: match},
    )


def _waits_here(rank: int, group: Group, blocked: Mapping[int, tuple[str, int, bool]]) -> bool:
    """True when the rank's oldest unfinished work is a send/recv of this group."""
    where = blocked.get(rank)
    return where is not None and where[0] == group.label and where[2]


def resolve_waiting(
    findings: list[GroupFinding], blocked: Mapping[int, tuple[str, int, bool]]
) -> list[GroupFinding]:
    """Keep non-root findings only when the groups they wait on lead to a root; else make them root.

    Two groups whose missing ranks wait on each other (ranks calling the groups' collectives in
    different orders) would otherwise explain each other and leave no culprit.
    """
    by_label = {f.label: f for f in findings}

    def leads_to_root(finding: GroupFinding, seen: frozenset[str]) -> bool:
        if finding.root:
            return True
        if finding.label in seen:
            return False
        targets = {blocked[r][0] for r in finding.waiting_in if r in blocked}
        return any(
            t in by_label and leads_to_root(by_label[t], seen | {finding.label}) for t in targets
        )

    resolved: list[GroupFinding] = []
    for f in findings:
        if f.root or leads_to_root(f, frozenset()):
            resolved.append(f)
            continue
        suspects = tuple(sorted(f.missing_ranks or f.waiting_in))
        resolved.append(dataclasses.replace(f, suspects=suspects, root=bool(suspects)))
    return resolved


def blocked_at(blocked: tuple[str, int, bool]) -> str:
    """Where a rank is blocked, for people: ``group 3 #41`` or ``group 3 p2p #7``."""
    label, seq, p2p = blocked
    return f"group {label} {'p2p ' if p2p else ''}#{seq}"
