from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage.cli.fr import fr
from nccl_triage.errors import InputError
from nccl_triage.flightrec.analysis import analyse
from nccl_triage.flightrec.reader import load_dumps, parse_dump, rank_from_name
from nccl_triage.flightrec.records import Frame
from nccl_triage.flightrec.render import render_text
from nccl_triage.flightrec.result import FindingKind, Side, is_user_frame

DATA = Path(__file__).resolve().parent / "data" / "fr"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "expected.json").is_file())


def expected(scenario: str) -> dict[str, Any]:
    return json.loads((DATA / scenario / "expected.json").read_text(encoding="utf-8"))


def record(
    rid: int,
    seq: int,
    *,
    op: str = "all_reduce",
    pg: tuple[str, str] = ("0", "default_pg"),
    pg_id: int = 0,
    state: str = "completed",
    size: int = 8,
    started: bool = False,
    p2p_seq: int = 0,
    frames: tuple[tuple[str, str, int], ...] = (),
) -> dict[str, Any]:
    base = op.split(" ")[0]
    return {
        "record_id": rid,
        "pg_id": pg_id,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_000 + rid,
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "output_sizes": [[size]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": 2_000 + rid if started or state == "completed" else None,
        "time_discovered_completed_ns": 3_000 + rid if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600_000,
        "is_p2p": base in ("send", "recv"),
        "frames": [{"name": n, "filename": f, "line": line} for n, f, line in frames],
    }


def dump(entries: list[dict[str, Any]], world: int = 4, **extra: Any) -> dict[str, Any]:
    ranks = str(list(range(world)))
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {},
        "entries": entries,
        "nccl_version": "2.21.5",
        **extra,
    }


def write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / name
    path.write_bytes(pickle.dumps(data, protocol=2))
    return path


def run_fr(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(fr, list(args))
    return result.exit_code, result.stdout, result.stderr


# --- the dumps made with PyTorch (scripts/make_fr_dumps.py) -------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_culprits_side_collective_and_frame(scenario: str) -> None:
    truth = expected(scenario)
    load = load_dumps([str(DATA / scenario)])
    analysis = analyse(load.dumps, load.unreadable_ranks)
    assert analysis.culprit_ranks == truth["culprit_ranks"]
    assert analysis.side == truth["side"]
    assert analysis.stuck is not None
    assert analysis.stuck.kind == truth["kind"]
    assert analysis.stuck.pg_name == truth["stuck_pg"]
    assert analysis.stuck.op == truth["stuck_op"]
    assert analysis.stuck.seq == truth["stuck_seq"]
    frame = analysis.user_frame
    assert (frame.name if frame else None) == truth["frame_function"]
    if frame:
        assert frame.filename.endswith("make_fr_dumps.py")


def test_all_four_kinds_of_scenario_are_committed() -> None:
    assert {"skip_collective", "op_mismatch", "size_mismatch", "python_stall", "two_groups"} <= set(
        SCENARIOS
    )


def test_two_groups_names_one_culprit_and_explains_the_waiting_rank() -> None:
    load = load_dumps([str(DATA / "two_groups")])
    analysis = analyse(load.dumps)
    world = next(g for g in analysis.groups if g.pg_name == "0")
    assert world.missing_ranks == (2, 3)
    assert world.suspects == (3,)
    assert 2 in world.waiting_in
    assert analysis.culprit_ranks == [3]


def test_size_mismatch_json_dumps_have_a_crashed_rank_without_dump() -> None:
    load = load_dumps([str(DATA / "size_mismatch")])
    assert {d.format for d in load.dumps} == {"json"}
    analysis = analyse(load.dumps)
    assert analysis.ranks_without_dump == [2]
    assert analysis.stuck is not None and analysis.stuck.mismatch_ranks == (3,)


def test_cli_json_gives_int_culprits_and_side() -> None:
    code, out, _ = run_fr(str(DATA / "python_stall"), "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert data["culprit_ranks"] == [0]
    assert data["side"] == "cpu"
    assert data["stuck"]["op"] == "all_reduce"
    assert data["user_frame"]["name"] == "save_checkpoint"
    assert isinstance(data["groups"], list) and data["groups"][0]["members"] == [0, 1, 2, 3]


def test_cli_text_has_a_table_then_the_culprit(tmp_path: Path) -> None:
    code, out, _ = run_fr(str(DATA / "skip_collective"))
    assert code == 1
    assert "process group 0 (default_pg), ranks 0-3: all_reduce #5" in out
    assert "culprit rank(s): 2 (cpu side)" in out
    assert "user frame:" in out and "in train_step" in out
    assert out.index("ranks  enqueued") < out.index("culprit rank(s)")


def test_cli_accepts_a_glob() -> None:
    code, out, _ = run_fr(str(DATA / "two_groups" / "trace_*"), "--format", "json")
    assert code == 1
    assert json.loads(out)["culprit_ranks"] == [3]


def test_facts_are_flat_plain_values() -> None:
    load = load_dumps([str(DATA / "two_groups")])
    facts = analyse(load.dumps).facts()
    assert facts["fr_culprit_ranks"] == [3]
    assert facts["fr_reached_ranks"] == [2]
    assert facts["fr_stuck_sizes"] == "[4]"
    assert facts["fr_side"] == "cpu"
    assert facts["fr_stuck_op"] == "all_reduce"
    assert facts["fr_stuck_seq"] == 5
    assert facts["fr_stuck_pg"] == "2"
    assert facts["fr_missing_ranks"] == [2, 3]
    assert facts["fr_frame_function"] == "train_step"
    assert facts["fr_frame"].endswith("in train_step")
    for value in facts.values():
        assert value is None or isinstance(value, str | int | bool | list)
        if isinstance(value, list):
            assert all(isinstance(v, int) for v in value)


# --- hostile and damaged input --------------------------------------------------------------


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_reduce_payload_calling_os_system_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_Evil(marker)]}, protocol=2)
    with pytest.raises(InputError) as info:
        parse_dump(payload, "nccl_trace_rank_0")
    message = str(info.value)
    assert message.startswith("nccl_trace_rank_0: refused")
    assert "system" in message and "\n" not in message
    assert not marker.exists()


def test_global_reference_to_builtins_eval_is_refused() -> None:
    payload = b"cbuiltins\neval\n(S'1+1'\ntR."
    with pytest.raises(InputError, match=r"^dump_3: refused: the pickle asks for builtins\.eval"):
        parse_dump(payload, "dump_3")


def test_hostile_file_costs_only_itself(tmp_path: Path) -> None:
    for rank in range(3):
        write(tmp_path, f"dump_{rank}", dump([record(0, 1)], world=3))
    (tmp_path / "dump_3").write_bytes(b"cbuiltins\neval\n(S'1+1'\ntR.")
    code, out, err = run_fr(str(tmp_path))
    assert code == 0
    assert "dump_3: refused" in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_truncated_and_empty_files_get_one_line_each(tmp_path: Path) -> None:
    for name in ("nccl_trace_rank_0", "nccl_trace_rank_2", "nccl_trace_rank_3"):
        shutil.copy(DATA / "skip_collective" / name, tmp_path / name)
    whole = (DATA / "skip_collective" / "nccl_trace_rank_1").read_bytes()
    (tmp_path / "nccl_trace_rank_1").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "nccl_trace_rank_4").write_bytes(b"")
    load = load_dumps([str(tmp_path)])
    assert [d.rank for d in load.dumps] == [0, 2, 3]
    assert len(load.problems) == 2
    assert any("nccl_trace_rank_1: truncated pickle" in p for p in load.problems)
    assert any("nccl_trace_rank_4: empty file" in p for p in load.problems)
    assert load.unreadable_ranks == (1, 4)
    analysis = analyse(load.dumps, load.unreadable_ranks)
    assert analysis.culprit_ranks == [2]
    assert 1 in analysis.ranks_without_dump


def test_no_readable_dump_exits_2(tmp_path: Path) -> None:
    (tmp_path / "dump_0").write_bytes(b"")
    (tmp_path / "dump_1").write_bytes(b"\x80\x02}q\x00(X")
    code, out, err = run_fr(str(tmp_path))
    assert code == 2
    assert out == ""
    assert "dump_0: empty file" in err and "dump_1: truncated pickle" in err
    assert "no flight-recorder dump could be read" in err


def test_missing_path_and_glob_without_match_are_reported(tmp_path: Path) -> None:
    code, _, err = run_fr(str(tmp_path / "nope_0"), str(tmp_path / "x*"))
    assert code == 2
    assert "nope_0: No such file or directory" in err
    assert "x*: no file matches" in err


def test_not_a_dump_is_named() -> None:
    with pytest.raises(InputError, match="not a flight-recorder dump"):
        parse_dump(pickle.dumps([1, 2, 3]), "dump_0")
    with pytest.raises(InputError, match="not a flight-recorder dump"):
        parse_dump(b'{"hello": 1}', "dump_0.json")
    with pytest.raises(InputError, match="damaged JSON dump"):
        parse_dump(b'{"version": ', "dump_0.json")


# --- names, ranks, ring buffer ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("nccl_trace_rank_3", 3),
        ("_dump_3", 3),
        ("fr_dump_3.json", 3),
        ("rank12.pkl", 12),
        ("host-7.node_trace_15.pickle", 15),
        ("/tmp/x1/dump_2", 2),
        ("expected.json", None),
    ],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_rank_field_wins_over_the_name(tmp_path: Path) -> None:
    write(tmp_path, "dump_0", dump([record(0, 1)], rank=5))
    load = load_dumps([str(tmp_path / "dump_0")])
    assert load.dumps[0].rank == 5


def test_two_files_for_one_rank_keep_the_first(tmp_path: Path) -> None:
    write(tmp_path, "a_0", dump([record(0, 1)]))
    write(tmp_path, "b_0", dump([record(0, 1)]))
    load = load_dumps([str(tmp_path)])
    assert len(load.dumps) == 1
    assert load.problems == (
        f"{tmp_path / 'b_0'}: rank 0 was already read from {tmp_path / 'a_0'}; ignored",
    )


def test_name_without_rank_needs_a_rank_field() -> None:
    data = pickle.dumps(dump([record(0, 1)]))
    with pytest.raises(InputError, match="cannot tell the rank"):
        parse_dump(data, "trace.pkl")


def test_directory_scan_skips_files_without_rank(tmp_path: Path) -> None:
    write(tmp_path, "dump_0", dump([record(0, 1)], world=1))
    (tmp_path / "README.txt").write_text("not a dump", encoding="utf-8")
    load = load_dumps([str(tmp_path)])
    assert [d.rank for d in load.dumps] == [0]
    assert load.problems == ()


def test_ring_buffer_that_dropped_old_entries(tmp_path: Path) -> None:
    # Rank 0 kept only collectives 6..10 (its buffer wrapped), ranks 1 and 3 everything, and
    # rank 2 stopped after 9: only collective 10 is stuck, and only rank 2 is missing from it.
    full = [record(i, i + 1) for i in range(9)]
    write(
        tmp_path,
        "dump_0",
        dump([record(i, i + 1) for i in range(5, 9)] + [record(9, 10, state="scheduled")]),
    )
    write(tmp_path, "dump_1", dump([*full, record(9, 10, state="scheduled")]))
    write(tmp_path, "dump_2", dump(full))
    write(tmp_path, "dump_3", dump([*full, record(9, 10, state="scheduled")]))
    load = load_dumps([str(tmp_path)])
    assert load.dumps[0].dropped_entries == 5
    analysis = analyse(load.dumps)
    assert analysis.culprit_ranks == [2]
    assert analysis.stuck is not None and analysis.stuck.seq == 10
    assert analysis.stuck.missing_ranks == (2,)


def test_missing_dump_of_a_bystander(tmp_path: Path) -> None:
    for name in ("nccl_trace_rank_0", "nccl_trace_rank_2", "nccl_trace_rank_3"):
        shutil.copy(DATA / "skip_collective" / name, tmp_path / name)
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [2]
    assert analysis.ranks_without_dump == [1]


def test_every_member_enqueued_and_one_has_no_dump(tmp_path: Path) -> None:
    for rank in (0, 1, 3):
        write(tmp_path, f"dump_{rank}", dump([record(0, 1), record(1, 2, state="scheduled")]))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [2]
    assert analysis.side is None
    assert analysis.stuck is not None and analysis.stuck.kind is FindingKind.NO_DUMP


# --- CPU side against GPU side ---------------------------------------------------------------


def test_enqueued_but_never_started_is_gpu_side(tmp_path: Path) -> None:
    frames = (
        ("all_reduce", "/x/torch/distributed/distributed_c10d.py", 1),
        ("step", "/job/train.py", 42),
    )
    for rank in range(4):
        stuck = record(
            1, 2, state="scheduled" if rank == 2 else "started", started=rank != 2, frames=frames
        )
        write(tmp_path, f"dump_{rank}", dump([record(0, 1), stuck]))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [2]
    assert analysis.side is Side.GPU
    assert analysis.stuck is not None and analysis.stuck.kind is FindingKind.NOT_STARTED
    assert analysis.user_frame == Frame("step", "/job/train.py", 42)


def test_missing_rank_with_idle_device_is_cpu_side(tmp_path: Path) -> None:
    for rank in range(4):
        entries = [record(0, 1)] + ([] if rank == 1 else [record(1, 2, state="scheduled")])
        write(tmp_path, f"dump_{rank}", dump(entries))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [1]
    assert analysis.side is Side.CPU


def test_rank_missing_from_several_groups_is_one_culprit(tmp_path: Path) -> None:
    config = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
        "1": {"name": "1", "desc": "dp", "ranks": "[1, 3]"},
        "2": {"name": "2", "desc": "dp", "ranks": "[0, 2]"},
    }
    for rank in range(4):
        sub = ("1", "dp") if rank in (1, 3) else ("2", "dp")
        entries = [record(0, 1), record(1, 1, pg=sub, pg_id=1)]
        if rank != 3:
            entries.append(record(2, 2, state="scheduled"))
            if rank == 1:
                entries.append(record(3, 2, pg=sub, pg_id=1, state="scheduled"))
        mine = {k: v for k, v in config.items() if rank in json.loads(v["ranks"])}
        write(tmp_path, f"dump_{rank}", dump(entries) | {"pg_config": mine})
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [3]
    assert {g.label for g in analysis.groups} == {"0 (default_pg)", "1 (dp)"}


def test_pending_send_whose_peer_never_posted_the_recv(tmp_path: Path) -> None:
    write(
        tmp_path,
        "dump_0",
        dump([record(0, 1), record(1, 1, op="send 0->1", state="scheduled", p2p_seq=1)], world=2),
    )
    write(tmp_path, "dump_1", dump([record(0, 1)], world=2))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [1]
    assert analysis.stuck is not None and analysis.stuck.p2p
    assert analysis.stuck.op == "send 0->1"


def test_clean_job_exits_0(tmp_path: Path) -> None:
    for rank in range(2):
        write(tmp_path, f"dump_{rank}", dump([record(0, 1), record(1, 2)], world=2))
    code, out, _ = run_fr(str(tmp_path))
    assert code == 0
    assert "no process group is stuck" in out
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [] and analysis.side is None and not analysis.hung
    assert "culprit" not in render_text(analysis)


@pytest.mark.parametrize(
    ("filename", "user"),
    [
        ("/work/train.py", True),
        ("/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", False),
        ("/usr/lib/python3.11/threading.py", False),
        ("/opt/conda/lib/python3.10/site-packages/megatron/core/pipeline.py", True),
        ("<frozen runpy>", False),
        ("/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp", False),
    ],
)
def test_user_frames(filename: str, user: bool) -> None:
    assert is_user_frame(Frame("f", filename, 1)) is user


# --- the reader never fails with anything but InputError -------------------------------------

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "version": plain,
        "pg_config": plain,
        "pg_status": plain,
        "rank": plain,
        "entries": st.lists(
            st.dictionaries(
                st.sampled_from(
                    [
                        "record_id",
                        "collective_seq_id",
                        "profiling_name",
                        "process_group",
                        "input_sizes",
                        "state",
                        "frames",
                        "is_p2p",
                        "pg_id",
                        "p2p_seq_id",
                    ]
                ),
                plain,
            ),
            max_size=3,
        )
        | plain,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_reader_on_arbitrary_bytes_raises_only_input_error(data: bytes) -> None:
    try:
        parse_dump(data, "dump_0")
    except InputError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(fields, st.sampled_from(["pickle", "json"]))
def test_reader_on_arbitrary_dump_shapes_raises_only_input_error(
    data: dict[str, Any], fmt: str
) -> None:
    if fmt == "json":
        try:
            raw = json.dumps(data).encode()
        except (TypeError, ValueError):
            return
    else:
        raw = pickle.dumps(data, protocol=2)
    try:
        parsed = parse_dump(raw, "dump_0")
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        analyse([parsed])


# --- what watchdog dumps look like (onlyActive, pg_status keyed by pg id) --------------------


def test_finished_on_some_members_only_is_gpu_side(tmp_path: Path) -> None:
    for rank in range(4):
        second = record(1, 2, state="scheduled" if rank == 2 else "completed")
        entries = [record(0, 1), second, record(2, 3, state="scheduled")]
        write(tmp_path, f"dump_{rank}", dump(entries))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [2]
    assert analysis.side is Side.GPU
    assert analysis.stuck is not None
    assert analysis.stuck.kind is FindingKind.INCOMPLETE and analysis.stuck.seq == 2


def test_dump_of_unfinished_work_only(tmp_path: Path) -> None:
    # As a watchdog dumps on timeout: finished entries left out, the counters in pg_status
    # under the rank's own process-group id. Rank 1 has nothing unfinished: it never
    # enqueued collective 10, and its device is idle.
    status = {
        "7": {
            "last_enqueued_collective": 10,
            "last_started_collective": -1,
            "last_completed_collective": 9,
        }
    }
    for rank in (0, 2, 3):
        pending = record(500, 10, state="scheduled", pg_id=7)
        write(tmp_path, f"dump_{rank}", dump([pending], pg_status=status))
    idle = {
        "7": {
            "last_enqueued_collective": 9,
            "last_started_collective": -1,
            "last_completed_collective": 9,
        }
    }
    write(tmp_path, "dump_1", dump([], pg_status=idle))
    load = load_dumps([str(tmp_path)])
    assert all(d.only_active for d in load.dumps)
    analysis = analyse(load.dumps)
    world = next(g for g in analysis.groups if g.pg_name == "0")
    assert world.missing_ranks == (1,)
    assert analysis.culprit_ranks == [1]
    assert analysis.side is Side.CPU


def test_pg_status_of_a_group_with_send_recv_is_not_read_as_collectives(tmp_path: Path) -> None:
    # pg_status counts the last work of any kind: here rank 1's numbers are point-to-point
    # sequence numbers, far past the three collectives both ranks finished.
    base = [record(0, 1), record(1, 2), record(2, 3)]
    send = record(3, 3, op="send 0->1", p2p_seq=7)
    recv = record(3, 3, op="recv 1<-0", p2p_seq=7)
    status = {
        "0": {
            "last_enqueued_collective": 7,
            "last_started_collective": -1,
            "last_completed_collective": 7,
        }
    }
    write(tmp_path, "dump_0", dump([*base, send], world=2))
    write(tmp_path, "dump_1", dump([*base, recv], world=2, pg_status=status))
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert not analysis.hung


def test_send_recv_posted_on_both_sides_is_explained_by_the_side_waiting_elsewhere(
    tmp_path: Path,
) -> None:
    # Rank 1 cannot run its recv before its collective in group 1, which rank 2 never joined.
    config = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        "1": {"name": "1", "desc": "tp", "ranks": "[1, 2]"},
    }
    send = record(0, 0, op="send 0->1", state="scheduled", p2p_seq=1)
    tp = record(0, 1, pg=("1", "tp"), pg_id=1, state="scheduled")
    recv = record(1, 0, op="recv 1<-0", state="scheduled", p2p_seq=1)
    write(tmp_path, "dump_0", dump([send], world=3) | {"pg_config": {"0": config["0"]}})
    write(tmp_path, "dump_1", dump([tp, recv], world=3) | {"pg_config": config})
    write(tmp_path, "dump_2", dump([], world=3) | {"pg_config": config})
    analysis = analyse(load_dumps([str(tmp_path)]).dumps)
    assert analysis.culprit_ranks == [2]
    pair = next(g for g in analysis.groups if g.p2p)
    assert not pair.root and 1 in pair.waiting_in


def test_a_dump_claiming_an_absurd_rank_costs_no_memory(tmp_path: Path) -> None:
    """A dump named for rank 10**12 is one more rank, not a job of 10**12 ranks to fill in."""
    import resource

    gloo = {"version": "2.10", "pg_config": {}, "pg_status": {}, "nccl_version": "2.21.5"}
    write(tmp_path, "nccl_trace_rank_0", {**gloo, "entries": [record(0, 1, pg=("", ""))]})
    write(tmp_path, "nccl_trace_rank_1000000000000", {**gloo, "entries": []})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = load_dumps([str(tmp_path)])
    analyse(loaded.dumps)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200_000
