"""Batch triage: discovery, grouping of per-rank files, table, summary, cache, HTML, engines."""

from __future__ import annotations

import bz2
import contextlib
import fnmatch
import gzip
import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage import batch as b
from nccl_triage.batch import job as batch_job
from nccl_triage.cli import main
from nccl_triage.errors import TriageError
from nccl_triage.pipeline import triage_path
from nccl_triage.render import html as batch_html
from nccl_triage.ruleset import load_ruleset

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
LORA = FIXTURES / "lora-oom-hidden-by-timeout.log"
ZERO3 = FIXTURES / "zero3-generate-inference-timeout.log"
DDP = FIXTURES / "ddp-sft-safetensors-save-timeout.log"
IFNAME = FIXTURES / "two-node-wrong-ifname.log"
TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=57, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600038 milliseconds before timing out.\n"
)


@pytest.fixture(scope="module")
def ruleset() -> Any:
    return load_ruleset()


def split_ranks(text: str) -> dict[int, str]:
    """Split a combined torchrun log into what each rank's own file would hold."""
    per: dict[int, list[str]] = {}
    for line in text.splitlines(keepends=True):
        m = re.match(r"\[default(\d+)\]:", line)
        if m:
            per.setdefault(int(m.group(1)), []).append(line[m.end() :])
            continue
        m = re.match(r"\[rank(\d+)\]:", line)
        per.setdefault(int(m.group(1)) if m else 0, []).append(line)
    return {r: "".join(lines) for r, lines in sorted(per.items())}


def make_archive(root: Path) -> Path:
    """A small archive: per-rank torchrun and Slurm jobs, plain and compressed, one broken."""
    for rank, text in split_ranks(LORA.read_text()).items():
        d = root / "torchrun" / "lora_7f3a" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        if rank == 1:
            (d / "stderr.log.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (d / "stderr.log").write_text(text)
    (root / "slurm").mkdir()
    for rank, text in split_ranks(ZERO3.read_text()).items():
        (root / "slurm" / f"gen-5512034-{rank}.out").write_text(text)
    (root / "single").mkdir()
    shutil.copy(DDP, root / "single" / DDP.name)
    (root / "single" / "ifname.log.bz2").write_bytes(bz2.compress(IFNAME.read_bytes()))
    (root / "single" / "clean.log").write_text("[2025-02-01 10:00:00,000] step 1 loss 0.9\n")
    (root / "single" / "README.md").write_text("not a log\n")
    blob = gzip.compress(LORA.read_bytes())
    (root / "broken").mkdir()
    (root / "broken" / "truncated.log.gz").write_bytes(blob[: len(blob) // 2])
    return root


def invoke(args: list[str], code: int) -> Result:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == code, (result.output, result.exception)
    return result


def files(*names: str) -> list[b.InputFile]:
    return [b.InputFile(n, n) for n in names]


# ----------------------------------------------------------------------------- grouping


def test_torchrun_log_dir_files_are_one_job_per_attempt() -> None:
    jobs = b.group_jobs(
        files(
            "logs/run_ab12/attempt_0/0/stderr.log",
            "logs/run_ab12/attempt_0/1/stderr.log.gz",
            "logs/run_ab12/attempt_0/1/stdout.log",
            "logs/run_ab12/attempt_1/0/stderr.log",
        )
    )
    assert [(j.name, j.layout, [f.rank for f in j.files]) for j in jobs] == [
        ("logs/run_ab12/attempt_0", "torchrun", [0, 1, 1]),
        ("logs/run_ab12/attempt_1", "torchrun", [0]),
    ]


def test_slurm_names_group_by_job_id_and_keep_the_task_as_rank() -> None:
    jobs = b.group_jobs(
        files(
            "out/train-884211-0.out",
            "out/train-884211-1.out",
            "out/train-884211-1.err",
            "out/884299.3.err",
            "out/slurm-1234.out",
            "out/slurm-1234.err",
            "out/slurm-777_3.out",  # an array task (slurm-%A_%a): a job of its own
            "out/notes.log",
        )
    )
    by_name = {j.name: j for j in jobs}
    assert [f.rank for f in by_name["out/train-884211"].files] == [0, 1, 1]
    assert [f.rank for f in by_name["out/884299"].files] == [3]
    assert len(by_name["out/slurm-1234"].files) == 2
    assert by_name["out/slurm-777_3.out"].layout == "file"
    assert by_name["out/notes.log"].layout == "file"


def test_group_by_pattern_names_job_and_rank() -> None:
    names = ("a/job-17/host1-r0.txt", "a/job-17/host2-r1.txt", "b/job-17/x-r0.txt", "c/other.log")
    jobs = b.group_jobs(files(*names), pattern=r"job-\d+/.*-r(?P<rank>\d+)")
    by_name = {j.name: j for j in jobs}
    # the job is the path up to the end of the match: the same id in two places is two jobs
    assert set(by_name) == {
        "a/job-17/host1-r0",
        "a/job-17/host2-r1",
        "b/job-17/x-r0",
        "c/other.log",
    }
    jobs = b.group_jobs(files(*names), pattern=r"(?P<job>\w/job-\d+)/.*-r(?P<rank>\d+)")
    by_name = {j.name: j for j in jobs}
    assert [f.rank for f in by_name["a/job-17"].files] == [0, 1]
    assert by_name["a/job-17"].layout == "pattern"
    assert len(b.group_jobs(files(*names), per_file=True)) == 4
    with pytest.raises(TriageError, match="not a regular expression"):
        b.group_jobs(files(*names), pattern="(")


# ----------------------------------------------------------------------------- discovery


def test_discovery_walks_directories_and_reports_what_it_cannot_list(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.log").write_text("x\n")
    (tmp_path / "a" / "y.out.zst").write_bytes(b"")
    (tmp_path / "a" / "z.json").write_text("{}")
    (tmp_path / "a" / ".hidden.log").write_text("x\n")
    os.symlink("..", tmp_path / "a" / "b" / "loop")
    os.symlink("missing.log", tmp_path / "a" / "dangling.log")
    os.mkfifo(tmp_path / "fifo.log")
    found = b.discover([str(tmp_path / "a"), str(tmp_path / "nope"), str(tmp_path / "fifo.log")])
    ok = [f.name.removeprefix(str(tmp_path) + "/") for f in found if f.error is None]
    bad = {f.name.removeprefix(str(tmp_path) + "/"): f.error for f in found if f.error}
    assert ok == ["a/b/x.log", "a/y.out.zst"]
    assert set(bad) == {"a/b/loop", "a/dangling.log", "nope", "fifo.log"}
    assert "directory loop" in str(bad["a/b/loop"])
    assert "broken symbolic link" in str(bad["a/dangling.log"])
    assert "no such file" in str(bad["nope"])
    assert "not a regular file" in str(bad["fifo.log"])
    globbed = b.discover([str(tmp_path / "a" / "**" / "*.log")])
    assert [Path(f.name).name for f in globbed if f.error is None] == ["x.log"]
    assert "directory loop" in str(next(f.error for f in globbed if f.name.endswith("loop")))
    assert b.discover([str(tmp_path / "*.nothing")])[0].error is not None
    # a broken link the pattern does not name is not reported; one it names is
    os.symlink("missing.txt", tmp_path / "a" / "b" / "notes.txt")
    globbed = b.discover([str(tmp_path / "a" / "**" / "*.log")])
    assert not any(f.name.endswith("notes.txt") for f in globbed)
    assert "broken symbolic link" in str(
        next(f.error for f in globbed if f.name.endswith("dangling.log"))
    )


# ----------------------------------------------------------------------------- triage


def test_per_rank_files_give_the_diagnosis_of_the_combined_log(
    tmp_path: Path, ruleset: Any
) -> None:
    make_archive(tmp_path)
    result = b.run_batch([str(tmp_path / "torchrun")], ruleset)
    [outcome] = result.outcomes
    assert outcome.job.layout == "torchrun" and len(outcome.job.files) == 4
    combined = triage_path(str(LORA), ruleset)
    assert outcome.diagnoses[0]["rule"] == combined.findings[0].rule.id == "oom-behind-timeout"
    row = result.table().iloc[0]
    assert (row["verdict"], row["cause"], row["op_type"], row["seq"]) == (
        "nccl_timeout",
        "oom_hidden",
        "ALLREDUCE",
        4812,
    )
    assert row["ranks_timed_out"] == "0,1,3" and row["culprit_rank"] == 2
    assert row["first_time"] == pd.Timestamp("2025-01-08 14:02:11")
    # evidence names the file each line comes from
    names = [f.name for f in outcome.job.files]
    files_of_evidence = {names[i] for i, *_ in outcome.diagnoses[0]["evidence"]}
    assert any("attempt_0/2/" in n for n in files_of_evidence)


def test_a_file_without_ranks_takes_the_rank_of_its_directory(tmp_path: Path, ruleset: Any) -> None:
    for rank in (0, 1):
        d = tmp_path / "run" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
    (tmp_path / "run/attempt_0/0/stderr.log").write_text(
        "Saving model checkpoint to /ckpt/step_9\n"
    )
    (tmp_path / "run/attempt_0/1/stderr.log").write_text(TIMEOUT.format(rank=1))
    [outcome] = b.run_batch([str(tmp_path)], ruleset).outcomes
    assert outcome.diagnoses[0]["cause"] == "slow_checkpoint_save"
    assert outcome.result["culprit_rank"] == 0  # the saving rank, which did not time out
    assert outcome.result["ranks_timed_out"] == [1]


def test_an_internal_error_is_a_row_and_the_run_goes_on(
    tmp_path: Path, ruleset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bad.log").write_text(TIMEOUT.format(rank=0))
    (tmp_path / "good.log").write_text(TIMEOUT.format(rank=0))
    real = batch_job._feed_file

    def flaky(triage: Any, f: b.InputFile, *args: Any) -> Any:
        if f.name.endswith("bad.log"):
            raise RuntimeError("boom")
        return real(triage, f, *args)

    monkeypatch.setattr(batch_job, "_feed_file", flaky)
    result = b.run_batch([str(tmp_path)], ruleset, b.BatchOptions(workers=1))
    by_name = {Path(o.job.name).name: o for o in result.outcomes}
    assert by_name["bad.log"].verdict is None
    assert "internal error: RuntimeError: boom" in by_name["bad.log"].errors[0]
    assert by_name["good.log"].verdict == "nccl_timeout"


# ----------------------------------------------------------------------------- command line


def test_batch_prints_table_and_summary_and_warns_on_stderr(tmp_path: Path) -> None:
    make_archive(tmp_path)
    result = invoke(["batch", str(tmp_path), "--no-cache"], 1)
    out = result.stdout
    assert "lora_7f3a/attempt_0" in out and "oom_hidden" in out
    assert "slurm/gen-5512034" in out and "generate_zero3" in out
    assert "6 jobs (12 files): 4 failed, 1 clean, 1 unreadable" in out
    assert "causes (failed jobs by top diagnosis)" in out and "top rules" in out
    assert "README.md" not in out
    assert result.stderr.strip().splitlines() == [
        f"nccl-triage: {tmp_path}/broken/truncated.log.gz: truncated gzip data"
    ]


def test_summary_counts_causes_hosts_and_rules(tmp_path: Path, ruleset: Any) -> None:
    make_archive(tmp_path)
    s = b.run_batch([str(tmp_path)], ruleset).summary()
    assert (s.jobs, s.failed, s.clean, s.unreadable) == (6, 4, 1, 1)
    assert sum(n for _, n, _ in s.causes) == 4
    assert sum(share for _, _, share in s.causes) == pytest.approx(1.0)
    assert ("slow_checkpoint_save", 1, 0.25) in s.causes
    assert {h for h, _, _ in s.hosts} >= {"node-a01", "node-b01", "gpu-node-07"}
    assert s.first[0][:2] == (f"{tmp_path}/torchrun/lora_7f3a/attempt_0", "oom_hidden")


def test_exit_status_follows_the_spec(tmp_path: Path) -> None:
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "a.log").write_text("step 1\n")
    invoke(["batch", str(tmp_path / "clean"), "--no-cache"], 0)
    (tmp_path / "clean" / "b.log.gz").write_bytes(gzip.compress(b"x" * 1000)[:20])
    invoke(["batch", str(tmp_path / "clean"), "--no-cache"], 0)  # an unreadable input: a row
    result = invoke(["batch", str(tmp_path / "clean" / "b.log.gz"), "--no-cache"], 2)
    assert "truncated gzip data" in result.stderr
    (tmp_path / "empty").mkdir()
    result = invoke(["batch", str(tmp_path / "empty"), "--no-cache"], 2)
    assert "no log files found" in result.stderr
    invoke(["batch", str(tmp_path), "--out", str(tmp_path / "t.xlsx")], 2)
    invoke(["batch", str(tmp_path), "--scheduler", "tcp://x:1"], 2)


def test_unreadable_file_is_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ok.log").write_text(TIMEOUT.format(rank=0))
    secret = tmp_path / "secret.log"
    secret.write_text(TIMEOUT.format(rank=1))
    secret.chmod(0)
    if os.access(secret, os.R_OK):  # root reads anything: make opening it fail instead
        import builtins

        def refusing(real: Any) -> Any:
            def opening(file: Any, *args: Any, **kwargs: Any) -> Any:
                if str(file) == str(secret):
                    raise PermissionError(13, "Permission denied", str(file))
                return real(file, *args, **kwargs)

            return opening

        monkeypatch.setattr(builtins, "open", refusing(builtins.open))
        monkeypatch.setattr(os, "open", refusing(os.open))
    result = invoke(["batch", str(tmp_path), "--db", str(tmp_path / "c.sqlite"), "-j", "1"], 1)
    assert f"{secret}: permission denied" in result.stderr
    assert "1 failed, 0 clean, 1 unreadable" in result.stdout


def test_out_writes_csv_jsonl_and_parquet(tmp_path: Path) -> None:
    make_archive(tmp_path / "in")
    for ext in ("csv", "jsonl", "parquet"):
        if ext == "parquet":
            pytest.importorskip("pyarrow")
        path = tmp_path / f"t.{ext}"
        result = invoke(["batch", str(tmp_path / "in"), "--no-cache", "--out", str(path)], 1)
        assert f"table: {path} (6 rows)" in result.stdout
        assert "oom_hidden" not in result.stdout.split("causes")[0]  # no table on stdout
        if ext == "csv":
            df = pd.read_csv(path)
        elif ext == "jsonl":
            df = pd.read_json(path, lines=True)
        else:
            df = pd.read_parquet(path)
        assert list(df.columns) == list(b.COLUMNS)
        assert sorted(df["cause"].dropna()) == sorted(
            [
                "generate_zero3",
                "network_interface_misconfig",
                "none",
                "oom_hidden",
                "slow_checkpoint_save",
            ]
        )
    first = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert first["error"].endswith("truncated gzip data")


def test_parquet_without_pyarrow_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nccl_triage.cli import batch as cli_batch

    monkeypatch.setattr(cli_batch, "_have", lambda name: name != "pyarrow")
    result = invoke(["batch", str(FIXTURES), "--out", str(tmp_path / "t.parquet")], 2)
    assert result.stderr == (
        f"nccl-triage: --out {tmp_path}/t.parquet: writing Parquet needs pyarrow: "
        "pip install 'nccl-triage[parquet]'\n"
    )


def test_per_diagnosis_gives_a_row_per_diagnosis(tmp_path: Path, ruleset: Any) -> None:
    make_archive(tmp_path)
    result = b.run_batch([str(tmp_path)], ruleset)
    jobs, diags = result.table(), result.table(per_diagnosis=True)
    assert len(diags) == len(jobs) + sum(max(0, len(o.diagnoses) - 1) for o in result.outcomes)
    assert list(diags.columns[3:6]) == ["verdict", "diagnosis", "cause"]
    assert set(diags["job"]) == set(jobs["job"])


def test_progress_bar_only_when_asked_or_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("step\n")
    assert invoke(["batch", str(tmp_path), "--no-cache"], 0).stderr == ""
    assert "triage" in invoke(["batch", str(tmp_path), "--no-cache", "--progress"], 0).stderr


# ----------------------------------------------------------------------------- cache


def test_rerun_triages_only_new_or_changed_files_and_rule_changes_invalidate(
    tmp_path: Path, ruleset: Any
) -> None:
    archive = make_archive(tmp_path / "archive")
    db = tmp_path / "cache.sqlite"
    opts = b.BatchOptions(db=db, workers=1)
    first = b.run_batch([str(archive)], ruleset, opts)
    assert (first.stats.triaged, first.stats.cached) == (6, 0)
    again = b.run_batch([str(archive)], ruleset, opts)
    assert (again.stats.triaged, again.stats.cached) == (0, 6)  # the truncated gzip too
    pd.testing.assert_frame_equal(first.table(), again.table())
    # a new job and a changed rank file: only those two jobs are triaged
    (archive / "single" / "new.log").write_text(TIMEOUT.format(rank=5))
    with (archive / "torchrun/lora_7f3a/attempt_0/3/stderr.log").open("a") as fh:
        fh.write("one more line\n")
    grown = b.run_batch([str(archive)], ruleset, opts)
    assert (grown.stats.triaged, grown.stats.cached) == (2, 5)
    # a renamed file, or a copy, is the same content: still cached
    shutil.copy(DDP, archive / "single" / "copy.log")
    (archive / "single" / "new.log").rename(archive / "single" / "renamed.log")
    assert b.run_batch([str(archive)], ruleset, opts).stats.triaged == 0
    # another ruleset version: everything again
    fewer = load_ruleset(disable=["timeout-too-short"])
    assert fewer.version != ruleset.version
    assert b.run_batch([str(archive)], fewer, opts).stats.triaged == 8


@pytest.mark.parametrize("preload", [True, False])
def test_a_rerun_over_unchanged_files_reads_none(
    tmp_path: Path, ruleset: Any, monkeypatch: pytest.MonkeyPatch, preload: bool
) -> None:
    """Each file's hash is remembered with its path, size, mtime and inode (as discovery saw
    them), read back in one query (or one a file, for a cache too big to read at once): a
    rerun hashes no file; a file touched is hashed again, and its job found in the cache."""
    from nccl_triage.batch import cache as cache_mod

    archive = make_archive(tmp_path / "archive")
    opts = b.BatchOptions(db=tmp_path / "c.sqlite", workers=1)
    first = b.run_batch([str(archive)], ruleset, opts)
    if not preload:
        monkeypatch.setattr(cache_mod, "PRELOAD_FILES", 0)
    read: list[str] = []
    real_read = cache_mod.read_digest

    def reading(path: str, hold: int) -> tuple[str, bytes | None]:
        read.append(path)
        return real_read(path, hold)

    monkeypatch.setattr(batch_job, "read_digest", reading)  # (in the process that triages)
    monkeypatch.setattr(cache_mod, "read_digest", reading)  # (in this one)
    again = b.run_batch([str(archive)], ruleset, opts)
    assert (again.stats.triaged, again.stats.cached, read) == (0, first.stats.jobs, [])
    touched = min(archive.rglob("*.log"))
    os.utime(touched, ns=(0, touched.stat().st_mtime_ns + 10**9))
    third = b.run_batch([str(archive)], ruleset, opts)
    assert (third.stats.triaged, third.stats.cached, read) == (0, first.stats.jobs, [str(touched)])


def test_a_cached_error_names_the_file_it_is_about_now(tmp_path: Path, ruleset: Any) -> None:
    blob = gzip.compress(TIMEOUT.format(rank=0).encode() * 50)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "one" / "first.log.gz").write_bytes(blob[: len(blob) // 2])
    opts = b.BatchOptions(db=tmp_path / "cache.sqlite", workers=1)
    first = b.run_batch([str(tmp_path / "one")], ruleset, opts)
    assert str(tmp_path / "one" / "first.log.gz") in first.outcomes[0].errors[0]
    (tmp_path / "two" / "second.log.gz").write_bytes(blob[: len(blob) // 2])
    again = b.run_batch([str(tmp_path / "two")], ruleset, opts)
    assert again.stats.cached == 1
    [message] = again.outcomes[0].errors
    assert str(tmp_path / "two" / "second.log.gz") in message and "first.log.gz" not in message


def test_a_damaged_cache_is_skipped_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.log").write_text(TIMEOUT.format(rank=0))
    db = tmp_path / "cache.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    result = invoke(["batch", str(tmp_path / "in"), "--db", str(db)], 1)
    assert f"cache {db} not used" in result.stderr


def test_default_cache_lives_in_the_user_cache_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert b.default_db() == Path("/x/cache/nccl-triage/batch.sqlite")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert b.default_db() == Path("/home/u/.cache/nccl-triage/batch.sqlite")


# ----------------------------------------------------------------------------- engines


def test_process_pool_gives_the_serial_table(tmp_path: Path, ruleset: Any) -> None:
    make_archive(tmp_path)
    serial = b.run_batch([str(tmp_path)], ruleset, b.BatchOptions(workers=1))
    pool = b.run_batch([str(tmp_path)], ruleset, b.BatchOptions(workers=2))
    assert (serial.stats.engine, pool.stats.engine) == ("serial", "processes")
    pd.testing.assert_frame_equal(serial.table(), pool.table())


def test_a_pool_with_a_cold_cache_hashes_in_its_workers(tmp_path: Path, ruleset: Any) -> None:
    """With a cache that knows none of the files, the workers hash the jobs as they read them:
    the same table as the serial run's, every result stored; the next run reads them all from
    the cache, a changed file alone is triaged again, and a copy of a job under a new name is
    found in the cache by the worker that hashes it."""
    make_archive(tmp_path / "archive")
    opts = b.BatchOptions(workers=2, db=tmp_path / "c.sqlite")
    serial = b.run_batch([str(tmp_path / "archive")], ruleset, b.BatchOptions(workers=1))
    from nccl_triage.batch.cache import ResultCache

    around: list[str] = []  # (no connection to the cache crosses the fork)
    real_release, real_reopen = ResultCache.release, ResultCache.reopen
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ResultCache, "release", lambda c: around.append("release") or real_release(c))
        m.setattr(ResultCache, "reopen", lambda c: around.append("reopen") or real_reopen(c))
        cold = b.run_batch([str(tmp_path / "archive")], ruleset, opts)
    assert around == ["release", "reopen"]
    assert cold.stats.engine == "processes" and cold.stats.triaged == cold.stats.jobs
    pd.testing.assert_frame_equal(serial.table(), cold.table())
    warm = b.run_batch([str(tmp_path / "archive")], ruleset, opts)
    assert (warm.stats.triaged, warm.stats.cached) == (0, warm.stats.jobs)
    pd.testing.assert_frame_equal(serial.table(), warm.table())
    changed = min((tmp_path / "archive").rglob("*.log"))
    changed.write_text(changed.read_text() + "one more line\n")
    again = b.run_batch([str(tmp_path / "archive")], ruleset, opts)
    assert (again.stats.triaged, again.stats.cached) == (1, again.stats.jobs - 1)
    shutil.copytree(tmp_path / "archive", tmp_path / "copy")
    copy = b.run_batch([str(tmp_path / "copy")], ruleset, opts)
    assert copy.stats.engine == "processes"
    assert (copy.stats.triaged, copy.stats.cached) == (0, copy.stats.jobs)
    moved = str(tmp_path / "archive"), str(tmp_path / "copy")
    # (the errors name the copy's files)
    expected = again.table().replace(re.escape(moved[0]), moved[1], regex=True)
    pd.testing.assert_frame_equal(copy.table(), expected)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_dask_engine_gives_the_local_table(tmp_path: Path, ruleset: Any) -> None:
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("fsspec")
    import logging

    archive = make_archive(tmp_path / "archive")
    # one part of the archive named as a file:// URL: read through fsspec on the workers
    inputs = [str(archive / "torchrun"), str(archive / "broken"), (archive / "single").as_uri()]
    local = b.run_batch(inputs, ruleset, b.BatchOptions(workers=1))
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",  # any free port: 8787 may be taken
        silence_logs=logging.ERROR,
    ) as cluster:
        opts = b.BatchOptions(engine="dask", scheduler=cluster.scheduler_address)
        remote = b.run_batch(inputs, ruleset, opts)
    assert remote.stats.engine == "dask" and remote.stats.triaged == 5
    assert any(j.startswith("file://") for j in local.table()["job"])
    pd.testing.assert_frame_equal(local.table(), remote.table())
    pd.testing.assert_frame_equal(local.table(True), remote.table(True))


# ----------------------------------------------------------------------------- html


def test_html_escapes_log_text_and_loads_nothing(tmp_path: Path, ruleset: Any) -> None:
    evil = '<script>alert("x")</script><img src=https://example.com/x.png>'
    (tmp_path / "job.log").write_text(
        f"Saving model checkpoint to /ckpt/{evil}\n" + TIMEOUT.format(rank=1)
    )
    result = b.run_batch([str(tmp_path)], ruleset)
    html = batch_html.render_html(result)
    assert result.outcomes[0].diagnoses[0]["cause"] == "slow_checkpoint_save"
    assert "&lt;script&gt;alert(" in html
    assert html.count("<script") == 1  # the page's own sorting script
    assert "<img" not in html
    assert re.search(r"""(?:src|href)=["']?(?:https?:)?//""", html.split("<main>")[0]) is None
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_an_unreadable_rows_error_is_shown_under_its_job_not_off_screen(
    tmp_path: Path, ruleset: Any
) -> None:
    blob = gzip.compress(TIMEOUT.format(rank=0).encode() * 50)
    (tmp_path / "broken.log.gz").write_bytes(blob[: len(blob) // 2])
    html = batch_html.render_html(b.run_batch([str(tmp_path)], ruleset))
    table = html.split('<table id="jobs">')[1].split("</table>")[0]
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table.split("</thead>")[0])
    assert "error" not in heads  # no last column far to the right of a wide table
    job_cell = re.search(r'<td class="job">(.*?)</td>', table, re.DOTALL)
    assert job_cell is not None and "truncated gzip data" in job_cell[1]


def test_advice_markdown_is_escaped_before_markup() -> None:
    html = str(batch_html._advice_html("Do `<b>x</b>` now:\n- raise `timeout`\n- <i>then</i>\n"))
    assert html == (
        "<p>Do <code>&lt;b&gt;x&lt;/b&gt;</code> now:</p>\n<ul>\n"
        "<li>raise <code>timeout</code></li>\n<li>&lt;i&gt;then&lt;/i&gt;</li>\n</ul>"
    )


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what chromium writes) into rows of raw pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        ftype, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, ul = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + left) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + up) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif ftype == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else ul
                line[i] = (line[i] + pred) & 0xFF
        rows.append(b"".join(bytes(line[j : j + 3]) for j in range(0, stride, bpp)))
        prev = line
    return width, height, rows


def _chromium() -> str | None:
    return (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (installed by .ci/run)")
def test_report_in_a_headless_browser(tmp_path: Path) -> None:
    make_archive(tmp_path / "archive")
    page = tmp_path / "report.html"
    invoke(["batch", str(tmp_path / "archive"), "--no-cache", "--html", str(page)], 1)
    browser = [str(_chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    browser += ["--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run(
        [
            *browser,
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri() + "#sort=confidence:desc",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # no script error, no blocked load, nothing logged
    assert 'data-ready="1"' in dom.stdout  # the script ran to the end
    body = dom.stdout.split('<table id="jobs">')[1].split("</tbody>")[0]
    first_row = body.split("<tr", 2)[2]
    assert "oom_hidden" in first_row  # sorted by confidence, highest first
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*browser, "--window-size=1200,900", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=60,
        env=env,
        check=True,
    )
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    colors = {bytes.fromhex(c[1:]) for c in batch_html.CAUSE_COLORS.values()}
    painted = sum(
        1 for row in rows[:600] for i in range(0, len(row), 3 * 4) if row[i : i + 3] in colors
    )
    assert painted > 200  # the bars of the causes chart are on screen


def test_a_save_far_from_the_end_of_another_ranks_file_is_no_context(
    tmp_path: Path, ruleset: Any
) -> None:
    # rank 1's file: a save, then 100,000 lines of training; rank 0's file ends in a timeout.
    # Without times, the files compare by distance from their end: the save is 100,000 lines
    # before the end, far outside the rule's 20,000-line window.
    for rank in (0, 1):
        (tmp_path / "run" / "attempt_0" / str(rank)).mkdir(parents=True)
    (tmp_path / "run/attempt_0/1/stderr.log").write_text(
        "Saving model checkpoint to /ckpt/step_9\n" + "step\n" * 100_000
    )
    (tmp_path / "run/attempt_0/0/stderr.log").write_text(
        "[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600100 milliseconds before timing out.\n"
    )
    [outcome] = b.run_batch([str(tmp_path)], ruleset).outcomes
    assert outcome.diagnoses[0]["cause"] != "slow_checkpoint_save"


# ----------------------------------------------------------------------------- flight recorder

FR = Path(__file__).resolve().parent / "data" / "fr"
STUCK_AT_5 = "".join(TIMEOUT.replace("SeqNum=57", "SeqNum=5").format(rank=r) for r in (0, 1, 3))


def copy_dumps(scenario: str, dest: Path) -> None:
    """The scenario's dumps (not its expected.json and fr_trace.txt) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in (FR / scenario).iterdir():
        if p.name not in ("expected.json", "fr_trace.txt"):
            shutil.copy(p, dest / p.name)


def test_dump_names_match_a_pattern_and_end_in_the_rank() -> None:
    for name in (
        "nccl_trace_rank_3",
        "/a/b/nccl_trace_rank_12",
        "job7_fr_trace_3.pkl",
        "fr_dump_0.json",
        "_dump_15",
    ):
        assert b.is_dump_name(name), name
    for name in ("nccl_trace_rank_", "fr_trace.txt", "rank3.pkl", "train.log", "_dump_x"):
        assert not b.is_dump_name(name), name
    assert b.is_dump_name("rank3.pkl", ("rank*.pkl",))


def test_dumps_are_found_beside_a_jobs_logs_and_never_triaged_as_logs(tmp_path: Path) -> None:
    job = tmp_path / "job1"
    copy_dumps("skip_collective", job)
    (job / "train.log").write_text(STUCK_AT_5)
    found = b.discover([str(tmp_path)], include=("*",))
    assert [f.name.rsplit("/", 1)[-1] for f in found if f.dump] == [
        f"nccl_trace_rank_{r}" for r in range(4)
    ]
    jobs, notes = b.attach_dumps(b.group_jobs(found), found)
    assert notes == []
    names = sorted(j.name.rsplit("/", 1)[-1] for j in jobs)
    assert "nccl_trace_rank_0" not in names  # a dump is no job of its own
    train = next(j for j in jobs if j.name.endswith("train.log"))
    assert len(train.dumps) == 4


def test_a_folder_of_dumps_joins_the_one_job_that_can_claim_it() -> None:
    def job(*names: str) -> b.Job:
        return b.Job(names[0], tuple(b.InputFile(n, n) for n in names), "file")

    jobs = [
        job("a/job1/train.log"),
        job("a/run/attempt_0/0/stderr.log", "a/run/attempt_0/1/stderr.log"),
        job("a/flat/x.log"),
        job("a/flat/y.log"),
    ]
    dumps = [
        b.InputFile(n, n, dump=True)
        for n in (
            "a/job1/fr/nccl_trace_rank_0",  # below a job's folder
            "a/run/nccl_trace_rank_0",  # above torchrun's attempt folder
            "a/flat/nccl_trace_rank_0",  # two jobs there
            "elsewhere/nccl_trace_rank_0",  # no job
        )
    ]
    out, notes = b.attach_dumps(jobs, dumps)
    got = {j.name: [d.name for d in j.dumps] for j in out}
    assert got["a/job1/train.log"] == ["a/job1/fr/nccl_trace_rank_0"]
    assert got["a/run/attempt_0/0/stderr.log"] == ["a/run/nccl_trace_rank_0"]
    assert got["a/flat/x.log"] == got["a/flat/y.log"] == []
    hint = "(keep one job per folder, or read them with nccl-triage triage LOG --fr DIR)"
    assert notes == [
        f"a/flat: 1 flight-recorder dump(s) left out: 2 jobs could claim them {hint}",
        f"elsewhere: 1 flight-recorder dump(s) left out: no job's logs are there {hint}",
    ]


def test_batch_reads_dumps_with_their_job(tmp_path: Path, ruleset: Any) -> None:
    job = tmp_path / "job1"
    copy_dumps("skip_collective", job)
    (job / "train.log").write_text(STUCK_AT_5)
    (job / "nccl_trace_rank_9").write_bytes(b"\x80\x04garbage")
    (tmp_path / "job2").mkdir()
    (tmp_path / "job2" / "train.log").write_text(STUCK_AT_5)
    result = b.run_batch([str(tmp_path)], ruleset, b.BatchOptions(workers=1))
    df = result.table()
    row = df[df["job"].str.endswith("job1/train.log")].iloc[0]
    assert (row["fr_dumps"], row["fr_culprit_ranks"], row["fr_side"]) == (4, "2", "cpu")
    assert row["fr_frame"].endswith("make_fr_dumps.py:187 in train_step")
    assert (row["rule"], row["culprit_rank"]) == ("dump-cpu-stall", 2)
    other = df[df["job"].str.endswith("job2/train.log")].iloc[0]
    assert pd.isna(other["fr_dumps"]) and other["rule"] == "unknown-cause"
    assert any("nccl_trace_rank_9: truncated pickle" in n for n in result.notes)
    assert result.summary().with_dumps == 1 and result.stats.dumps == 5


def test_fr_pattern_changes_which_names_are_dumps(tmp_path: Path) -> None:
    job = tmp_path / "job"
    copy_dumps("python_stall", job)
    (job / "train.log").write_text(STUCK_AT_5.replace("SeqNum=5", "SeqNum=9"))
    out = tmp_path / "t.jsonl"
    args = ["batch", str(tmp_path), "--no-cache", "--out", str(out)]
    invoke(args, 1)
    assert json.loads(out.read_text())["fr_dumps"] is None  # rankN.pkl: not a default name
    invoke([*args, "--fr-pattern", "rank*.pkl"], 1)
    row = json.loads(out.read_text())
    assert (row["fr_dumps"], row["fr_culprit_ranks"], row["rule"]) == (4, "0", "dump-frame-in-save")


def test_a_new_dump_triages_a_cached_job_again(tmp_path: Path, ruleset: Any) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.log").write_text(STUCK_AT_5)
    opts = b.BatchOptions(db=tmp_path / "cache.sqlite", workers=1)
    assert b.run_batch([str(job)], ruleset, opts).stats.triaged == 1
    assert b.run_batch([str(job)], ruleset, opts).stats.cached == 1
    for dump in sorted((FR / "skip_collective").glob("nccl_trace_rank_*")):
        shutil.copy(dump, job)
    again = b.run_batch([str(job)], ruleset, opts)
    assert again.stats.triaged == 1
    assert again.outcomes[0].result["flight_recorder"]["culprit_ranks"] == [2]


def test_the_cache_names_a_file_by_its_real_path(tmp_path: Path) -> None:
    """A file's real path (the key of its remembered hash) is ``os.path.realpath``'s, with its
    directory resolved once: through a linked directory, a linked file, a relative path."""
    from nccl_triage.batch.cache import ResultCache

    real = tmp_path / "real"
    real.mkdir()
    (real / "a.log").write_text("x\n")
    (tmp_path / "linked").symlink_to(real)
    (real / "b.log").symlink_to(real / "a.log")
    cache = ResultCache(tmp_path / "c.sqlite", "v")
    try:
        for path in (
            str(real / "a.log"),
            str(tmp_path / "linked" / "a.log"),
            str(tmp_path / "linked" / "b.log"),
            str(real / "b.log"),
            os.path.relpath(real / "a.log"),
            str(real / ".." / "linked" / "b.log"),
        ):
            assert cache._realpath(path) == os.path.realpath(path), path
    finally:
        cache.close()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["*.log", "*.txt", "job?.out", "[ab]*.err", "*fr_trace*", "x"]), max_size=4
    ),
    st.text(alphabet="abjoxfrtce_.-?*[]0123456789logutr", max_size=16),
)
def test_file_names_match_the_globs_as_fnmatch_says(patterns: list[str], name: str) -> None:
    """The globs of --include and --fr-pattern, as one pattern: fnmatch's answer for each."""
    from nccl_triage.batch.inputs import _globs

    expected = any(fnmatch.fnmatch(name, p) for p in patterns)
    assert (_globs(tuple(patterns)).match(os.path.normcase(name)) is not None) == expected


def test_a_worker_that_dies_fails_its_jobs_not_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed in the middle (the OOM killer): the jobs it held, and those no worker
    can take any more, get a failed result each; every job has one, the batch goes on."""
    from nccl_triage.batch import engines
    from nccl_triage.batch.inputs import Job

    # (the stand-in for a job is a function of this process: the workers must be its forks)
    monkeypatch.setattr(engines, "_start_method", lambda: "fork")

    def triage(job: Job, ruleset: Any, lookup: Any = None) -> dict[str, Any]:
        if job.name == "job-050":
            os._exit(9)
        return {"verdict": "clean", "errors": []}

    monkeypatch.setattr(engines, "_safe_triage", triage)
    jobs = [Job(f"job-{i:03d}", (), "file") for i in range(200)]
    for plain, new in ((jobs, []), ([], jobs)):  # (jobs new to a cache go the same way)
        got = dict(engines.run_processes(plain, load_ruleset(), 2, new=new))
        assert sorted(j.name for j in got) == [j.name for j in jobs]
        died = [j.name for j, r in got.items() if r.get("verdict") is None]
        assert "job-050" in died
        assert all(
            "a worker process died" in str(got_r["errors"])
            for j, got_r in got.items()
            if j.name in died
        )


_ISO = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")


@given(
    st.lists(
        st.sampled_from(
            [
                *(b"2025-04-06 10:18:00", b"12025-04-06T10:18:00", b"2025-4-06 10:18:00"),
                *(b"-", b"0", b"9", b"-06-07 ", b"10:1", b"x", b"\n", b"2025-04-06T1"),
            ]
        ),
        max_size=12,
    )
)
def test_the_first_iso_time_is_the_full_patterns_first_match(parts: list[bytes]) -> None:
    from nccl_triage.batch.inputs import first_iso_time

    data = b"".join(parts)
    m = _ISO.search(data)
    assert first_iso_time(data) == (m.group(0).decode() if m else None)


def test_a_file_is_hashed_and_held_when_small(tmp_path: Path) -> None:
    import hashlib

    from nccl_triage.batch.cache import file_digest, read_digest

    path = tmp_path / "a.log"
    data = b"line\n" * 1000
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    assert read_digest(str(path), len(data)) == (digest, data)
    assert read_digest(str(path), len(data) - 1) == (digest, None)  # too big to hold
    assert read_digest(str(path), 0) == (digest, None) and file_digest(str(path)) == digest
    with pytest.raises(OSError):
        read_digest(str(tmp_path / "missing.log"), 100)


def test_a_workers_view_of_the_cache_finds_what_was_committed(tmp_path: Path) -> None:
    """A worker's read-only view sees the results committed before it opened the cache; a
    cache empty then is not asked at all, and one that cannot be opened finds nothing."""
    from nccl_triage.batch.cache import ReadOnlyCache, ResultCache

    path = tmp_path / "c.sqlite"
    cache = ResultCache(path, "v")
    cold = ReadOnlyCache(str(path), "v")
    assert cold.db is None and cold.peek("k") is None
    cache.put("k", json.dumps({"verdict": "clean"}))
    cache.commit()
    view = ReadOnlyCache(str(path), "v")
    assert view.peek("k") == {"verdict": "clean"} and view.peek("other") is None
    with pytest.raises(sqlite3.OperationalError):  # read only
        assert view.db is not None
        view.db.execute("DELETE FROM results")
    view.close()
    cache.close()
    assert ReadOnlyCache(str(tmp_path / "missing.sqlite"), "v").peek("k") is None


def test_a_new_job_that_cannot_be_read_is_a_row_not_a_triage(
    tmp_path: Path, ruleset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that cannot be read when the job is hashed: the job's row says why, it is not
    counted as triaged and nothing is cached for it (it may be readable next time)."""
    (tmp_path / "ok.log").write_text(TIMEOUT.format(rank=0))
    gone = tmp_path / "gone.log"
    gone.write_text(TIMEOUT.format(rank=1))
    real_read = batch_job.read_digest

    def refusing(path: str, hold: int) -> tuple[str, bytes | None]:
        if path == str(gone):
            raise PermissionError(13, "Permission denied", path)
        return real_read(path, hold)

    monkeypatch.setattr(batch_job, "read_digest", refusing)
    opts = b.BatchOptions(db=tmp_path / "c.sqlite", workers=1)
    result = b.run_batch([str(tmp_path)], ruleset, opts)
    row = result.table().set_index("job").loc[str(gone)]
    assert (result.stats.jobs, result.stats.triaged) == (2, 1)
    assert row["verdict"] is None or pd.isna(row["verdict"])
    assert row["error"] == f"{gone}: permission denied"
    monkeypatch.undo()
    again = b.run_batch([str(tmp_path)], ruleset, opts)
    assert (again.stats.triaged, again.stats.cached) == (1, 1)


def test_files_gone_are_forgotten_once_the_table_has_grown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of files that no longer exist go at the end of a run, once the table holds more than
    the threshold and twice what the last pruning kept; a table of files that all exist is not
    looked through again at the next run."""
    from nccl_triage.batch import cache as cache_mod
    from nccl_triage.batch.cache import ResultCache

    monkeypatch.setattr(cache_mod, "PRUNE_FILES_AFTER", 4)
    paths = []
    for i in range(6):
        p = tmp_path / f"f{i}.log"
        p.write_text(f"{i}\n")
        paths.append(p)
    db = tmp_path / "c.sqlite"

    def remember_all(files: list[Path]) -> None:
        cache = ResultCache(db, "v")
        for p in files:
            cache.digest(b.InputFile(p.name, str(p)))
        cache.close()

    def rows() -> list[str]:
        with contextlib.closing(sqlite3.connect(str(db))) as con:
            return sorted(r[0] for r in con.execute("SELECT path FROM files"))

    remember_all(paths[:4])  # 4 rows: not past the threshold
    paths[0].unlink()
    remember_all(paths[4:5])
    # 5 rows > 4: looked through, the gone one dropped
    assert rows() == sorted(os.path.realpath(p) for p in paths[1:5])
    looked: list[str] = []
    real_lexists = os.path.lexists
    monkeypatch.setattr(os.path, "lexists", lambda p: looked.append(p) or real_lexists(p))
    remember_all(paths[5:])  # 5 rows, not twice the 4 kept: not looked through
    assert looked == [] and len(rows()) == 5
