"""Live triage: the incremental scan, the debounced reports, and `watch` / `run` end to end.

The end-to-end tests run the real command in a subprocess (pass-through works on raw file
descriptors, which CliRunner does not have). Timing bounds are generous (a loaded 2-core CI
machine); bench/bench_live.py measures the real latency.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CORPUS, FIXTURES, corpus_available
from nccl_triage.live.analyser import ReportSink
from nccl_triage.live.link import AnalyserConfig, FrameReader, encode_frame
from nccl_triage.live.triage import LiveStatus, LiveTriage
from nccl_triage.model import Report
from nccl_triage.pipeline import triage_path, triage_text
from nccl_triage.ruleset import Ruleset, load_ruleset

CLI = [sys.executable, "-m", "nccl_triage"]
LORA = FIXTURES / "lora-oom-hidden-by-timeout.log"
needs_corpus = pytest.mark.skipif(not corpus_available(), reason="../shared/corpus is absent")


def timeout_line(rank: int, seq: int = 4812) -> bytes:
    return (
        f"[rank{rank}]:[E108 14:47:33.69012{rank}466 ProcessGroupNCCL.cpp:616] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        f"NumelIn=41943040, NumelOut=41943040, Timeout(ms)=600000) ran for 600043 milliseconds "
        f"before timing out.\n"
    ).encode()


@pytest.fixture(scope="module")
def ruleset() -> Ruleset:
    return load_ruleset()


def all_logs() -> list[Path]:
    logs = sorted(FIXTURES.glob("*.log"))
    if corpus_available():
        logs += sorted(CORPUS.glob("*.log"))
    return logs


def chunked(data: bytes, rng: random.Random, biggest: int) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        n = rng.randint(1, biggest)
        yield data[pos : pos + n]
        pos += n


# ----------------------------------------------------------------------------- LiveTriage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.reports: list[tuple[Report, LiveStatus, float]] = []
        self.clock: Clock | None = None

    def __call__(self, report: Report, status: LiveStatus) -> None:
        assert self.clock is not None
        self.reports.append((report, LiveStatus(**status.to_dict()), self.clock.now))

    @property
    def live(self) -> list[tuple[Report, LiveStatus, float]]:
        return [r for r in self.reports if not r[1].final]


def make_live(ruleset: Ruleset, window: int | None = None) -> tuple[LiveTriage, Recorder, Clock]:
    clock, rec = Clock(), Recorder()
    rec.clock = clock
    return LiveTriage("<stdin>", ruleset, rec, clock=clock, window=window), rec, clock


def run_for(live: LiveTriage, clock: Clock, seconds: float, step: float = 0.01) -> None:
    end = clock.now + seconds
    while clock.now < end:
        live.tick()
        clock.now += step


def test_eight_timeouts_make_one_report_within_a_second(ruleset: Ruleset) -> None:
    live, rec, clock = make_live(ruleset)
    live.feed(b"Saving model checkpoint to /ckpt/checkpoint-200\n" + b"step\n" * 30)
    run_for(live, clock, 2.0)
    assert rec.reports == []  # nothing to say about a healthy job
    t0 = clock.now
    for rank in range(8):
        live.feed(timeout_line(rank))
        clock.now += 0.002
    run_for(live, clock, 3.0)  # the job hangs: no more lines
    [(report, status, at)] = rec.live
    assert at - t0 < 1.0
    assert report.facts.ranks_timed_out == list(range(8))
    assert report.findings[0].rule.id == "slow-checkpoint-save"
    assert (status.update, status.line, status.final) == (1, 39, False)
    final = live.finish()
    assert final.verdict == "nccl_timeout" and rec.reports[-1][1].final
    # nothing new at the end: the final text is a summary pointing to the advice above
    status = rec.reports[-1][1]
    assert status.unchanged
    sink = ReportSink(AnalyserConfig(), ruleset.template_dirs)
    text = sink.render(final, status)
    assert "unchanged since the live diagnosis above" in text
    assert "[slow_checkpoint_save]" in text and "What to do" not in text
    assert "What to do" in sink.render(report, rec.live[0][1])


def test_a_new_picture_is_reported_again_but_at_most_once_a_second(ruleset: Ruleset) -> None:
    live, rec, clock = make_live(ruleset)
    live.feed(timeout_line(0))
    run_for(live, clock, 0.6)
    assert len(rec.live) == 1
    live.feed(timeout_line(1))  # another rank: the picture changes
    run_for(live, clock, 0.2)
    assert len(rec.live) == 1  # not yet: one second since the last report
    run_for(live, clock, 1.0)
    assert len(rec.live) == 2 and rec.live[1][0].facts.ranks_timed_out == [0, 1]
    assert rec.live[1][2] - rec.live[0][2] >= 1.0
    live.feed(timeout_line(1))  # the same timeout again: same picture, no report
    run_for(live, clock, 2.0)
    assert len(rec.live) == 2


def test_a_busy_job_does_not_delay_the_report(ruleset: Ruleset) -> None:
    live, rec, clock = make_live(ruleset)
    t0 = clock.now
    live.feed(timeout_line(2))
    for i in range(300):  # the job keeps printing a line every 10 ms
        live.feed(f"step {i}\n".encode())
        live.tick()
        clock.now += 0.01
    assert rec.live and rec.live[0][2] - t0 < 1.0


def test_final_report_equals_batch_triage(ruleset: Ruleset) -> None:
    for path in all_logs():
        live, _rec, clock = make_live(ruleset)
        data = path.read_bytes()
        for chunk in chunked(data, random.Random(3), 97):
            live.feed(chunk)
            live.tick()
            clock.now += 0.001
        got = live.finish()
        want = triage_path(str(path), ruleset)
        assert got.verdict == want.verdict, path
        assert [(f.rule.id, f.trigger.line) for f in got.findings] == [
            (f.rule.id, f.trigger.line) for f in want.findings
        ], path
        assert [(e.kind, e.line) for e in got.events] == [(e.kind, e.line) for e in want.events]
        assert got.lines == want.lines


def test_signals_are_pruned_but_not_near_a_failure(ruleset: Ruleset) -> None:
    live, _rec, clock = make_live(ruleset, window=1000)
    block = b"".join(f"train step {i}\n".encode() for i in range(99))
    save = b"Saving model checkpoint to /ckpt/checkpoint-1\n"
    live.feed(save + block)
    live.feed(timeout_line(0))  # a failure near the first save: that save stays evidence
    for _ in range(2000):  # 200k lines, a save every 100: 2000 signal events without pruning
        live.feed(save + block)
        live.tick()
        clock.now += 0.001
    report = live.finish()
    saves = [s for s in report.signals if s.kind == "checkpoint_save"]
    assert len(saves) < 30
    assert saves[0].line == 1
    assert report.findings[0].rule.id == "slow-checkpoint-save"


def test_a_skipped_stretch_is_said_in_every_format(ruleset: Ruleset) -> None:
    live, rec, _clock = make_live(ruleset)
    live.feed(b"a\nb\n")
    live.skip(5 << 20, 70000, b"")
    live.feed(timeout_line(0))
    live.finish()
    report, status, _ = rec.reports[-1]
    assert (status.dropped_bytes, status.dropped_lines) == (5 << 20, 70000)
    assert report.events[0].line == 70003
    text = ReportSink(AnalyserConfig(), ruleset.template_dirs).render(report, status)
    assert "skipped 5.0 MiB, 70000 lines (lines 3-70003)" in text
    assert "final diagnosis at end of input (70003 lines)" in text
    obj = json.loads(
        ReportSink(AnalyserConfig(fmt="json"), ruleset.template_dirs).render(report, status)
    )
    assert obj["schema"] == "nccl-triage/1.1" and obj["verdict"] == "nccl_timeout"
    assert obj["live"]["final"] is True and obj["live"]["dropped_bytes"] == 5 << 20


def test_frames_survive_any_cut() -> None:
    frames = [(b"D", b"x" * 1000), (b"G", b"\x00" * 16 + b"tail"), (b"E", b"{}"), (b"D", b"")]
    wire = b"".join(encode_frame(k, p) for k, p in frames)
    reader = FrameReader()
    got = []
    for i in range(0, len(wire), 7):
        got += list(reader.push(wire[i : i + 7]))
    assert got == frames
    assert list(reader.push(encode_frame(b"D", b"cut")[:-1])) == []


def test_clean_input_gets_only_the_final_report(ruleset: Ruleset) -> None:
    live, rec, clock = make_live(ruleset)
    live.feed(b"hello\n" * 100)
    run_for(live, clock, 2.0)
    live.finish({"reason": "exit", "status": 0})
    [(report, status, _)] = rec.reports
    assert report.verdict == "clean" and status.final
    assert status.end == {"reason": "exit", "status": 0}
    assert triage_text("hello\n", ruleset).verdict == "clean"


# ----------------------------------------------------------------------------- end to end


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def watch(data: bytes, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, "watch", *args], input=data, capture_output=True, timeout=timeout, check=False
    )


def test_watch_passes_random_binary_through_byte_for_byte() -> None:
    data = random.Random(7).randbytes(8 << 20)
    proc = watch(data)
    assert sha(proc.stdout) == sha(data)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"final diagnosis at end of input" in proc.stderr


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux pipes only")
def test_watch_widens_the_pipes_it_reads_and_writes() -> None:
    """Fewer wake-ups for the job, the pump and the reader of its output: 1 MiB pipes."""
    proc = subprocess.Popen(
        [*CLI, "watch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.write(b"hello\n")
    proc.stdin.close()
    assert proc.stdout.read() == b"hello\n"
    proc.wait(timeout=60)
    # its output's pipe outlives it (the test holds the other end)
    assert fcntl.fcntl(proc.stdout.fileno(), fcntl.F_GETPIPE_SZ) >= 1 << 20
    proc.stdout.close()


def test_watch_passes_a_100_mb_line_without_newline() -> None:
    data = b"\x1b[32m" + b"x" * (100 << 20) + b"\xff\xfe invalid utf-8"
    proc = watch(data)
    assert len(proc.stdout) == len(data) and sha(proc.stdout) == sha(data)
    assert proc.returncode == 0, proc.stderr[-2000:]


@needs_corpus
def test_watch_passes_the_corpus_through_and_diagnoses_it(tmp_path: Path) -> None:
    data = b"".join(p.read_bytes() for p in sorted(CORPUS.glob("*.log")))
    report = tmp_path / "report.jsonl"
    proc = watch(data, "--report", str(report), "--format", "json")
    assert sha(proc.stdout) == sha(data)
    assert proc.returncode == 1
    assert proc.stderr == b""  # the diagnoses went to the file
    final = json.loads(report.read_text(encoding="utf-8").splitlines()[-1])
    assert final["live"]["final"] is True and final["verdict"] != "clean"
    assert final["summary"]["lines"] == data.count(b"\n") + (not data.endswith(b"\n"))


class Job:
    """`watch` fed by the test as a job would: write lines, watch stderr as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, "watch", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out = bytearray()
        self.err = bytearray()
        self.err_times: list[tuple[float, bytes]] = []
        self.sent = bytearray()
        self._threads = [
            threading.Thread(
                target=self._drain, args=(self.proc.stdout, self.out, False), daemon=True
            ),
            threading.Thread(
                target=self._drain, args=(self.proc.stderr, self.err, True), daemon=True
            ),
        ]
        for t in self._threads:
            t.start()

    def _drain(self, pipe: object, into: bytearray, stamp: bool) -> None:
        while chunk := os.read(pipe.fileno(), 65536):  # type: ignore[attr-defined]
            into += chunk
            if stamp:
                self.err_times.append((time.monotonic(), chunk))

    def wait_until_analysing(self, timeout: float = 60) -> None:
        """Wait until the analyser has started and waits for input, as it long has when a real
        job fails (it takes about a second of CPU to start; much longer on a loaded machine).
        """
        proc_dir = Path(f"/proc/{self.proc.pid}")
        if not proc_dir.exists():  # no /proc: give it time
            time.sleep(3.0)
            return
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            children = proc_dir / "task" / str(self.proc.pid) / "children"
            with contextlib.suppress(OSError):
                for pid in children.read_text().split():
                    if Path(f"/proc/{pid}/wchan").read_text().startswith(("do_select", "poll")):
                        return
            time.sleep(0.05)
        raise AssertionError("the analyser did not start")

    def write(self, data: bytes) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        self.sent += data
        return time.monotonic()

    def wait_for(self, needle: bytes, timeout: float) -> float | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            seen = b""
            for at, chunk in list(self.err_times):
                seen += chunk
                if needle in seen:
                    return at
            time.sleep(0.01)
        return None

    def close(self, timeout: float = 30) -> int:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout)
        for pipe in (self.proc.stdout, self.proc.stderr):
            assert pipe is not None
            pipe.close()
        return code

    def reap(self) -> None:
        """After a failed test: never leave the process (or pytest) hanging."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.close(timeout=10)


@pytest.fixture
def start_job() -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def start(*args: str) -> Job:
        jobs.append(Job(*args))
        return jobs[-1]

    yield start
    for job in jobs:
        job.reap()


@pytest.fixture
def popen() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """subprocess.Popen that is killed and closed after the test, whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(args, **kw))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


@pytest.mark.parametrize("keeps_printing", [True, False], ids=["busy", "hung"])
def test_watch_reports_before_end_of_input(
    keeps_printing: bool, start_job: Callable[..., Job]
) -> None:
    job = start_job()
    lines = LORA.read_bytes().splitlines(keepends=True)
    for line in lines[:10]:
        job.write(line)
        time.sleep(0.01)
    job.wait_until_analysing()
    for rank in range(8):
        if rank != 2:
            done = job.write(timeout_line(rank))
    at = None
    end = time.monotonic() + 3.0
    while at is None and time.monotonic() < end:
        if keeps_printing:
            job.write(b"[rank2]: still loading shard 7/8\n")
        at = job.wait_for(b"live diagnosis", 0.05)
    assert at is not None, bytes(job.err)
    assert at - done < 3.0
    assert b"ranks timed out: 0-1,3-7; did not: 2" in job.err
    # one report for all the ranks' lines
    assert job.err.count(b"nccl-triage: live diagnosis") == 1
    assert job.close() == 1
    assert sha(bytes(job.out)) == sha(bytes(job.sent))
    assert b"final diagnosis at end of input" in job.err


def test_ctrl_c_prints_what_is_known_and_exits_130(start_job: Callable[..., Job]) -> None:
    job = start_job("--format", "json")
    job.write(LORA.read_bytes()[:1500])
    time.sleep(0.5)
    job.write(timeout_line(0))
    assert job.wait_for(b'"final": false', 15.0) is not None
    job.proc.send_signal(signal.SIGINT)
    assert job.proc.wait(10) == 130
    job.close()
    final = json.loads(bytes(job.err).splitlines()[-1])
    assert final["live"]["final"] is True and final["live"]["end"] == {"reason": "interrupted"}
    assert final["verdict"] == "nccl_timeout"


def test_closed_stdout_ends_quietly(popen: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = popen(
        [*CLI, "watch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"line\n" * 1000)
    proc.stdin.flush()
    proc.stdout.read(100)
    proc.stdout.close()  # `| head` read what it wanted and left
    with pytest.raises(BrokenPipeError):
        for _ in range(10000):
            proc.stdin.write(b"more output\n" * 1000)
            proc.stdin.flush()
            time.sleep(0.001)
    assert proc.wait(10) == 0
    assert proc.stderr.read() == b""


# ----------------------------------------------------------------------------- run

FAKE_JOB = textwrap.dedent(
    """
    import os, resource, signal, sys, time
    log, delay = sys.argv[1], float(sys.argv[2])
    for line in open(log, "rb"):
        # the worker lines of a torchrun job go to stderr, the rest to stdout
        worker = line.startswith((b"[rank", b"[E", b"W0", b"E0"))
        out = sys.stderr.buffer if worker else sys.stdout.buffer
        out.write(line)
        out.flush()
        time.sleep(delay)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGABRT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGABRT)
    """
)


def split_streams(log: bytes) -> tuple[bytes, bytes]:
    out, err = b"", b""
    for line in log.splitlines(keepends=True):
        if line.startswith((b"[rank", b"[E", b"W0", b"E0")):
            err += line
        else:
            out += line
    return out, err


@pytest.mark.parametrize("archive", ["job.log.gz", "job.log.zst"])
def test_run_fake_job_dies_of_sigabrt(tmp_path: Path, archive: str) -> None:
    job = tmp_path / "fake_job.py"
    job.write_text(FAKE_JOB, encoding="utf-8")
    log = tmp_path / archive
    proc = subprocess.run(
        [*CLI, "run", "--log", str(log), "--", sys.executable, str(job), str(LORA), "0.01"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 134  # 128 + SIGABRT, the job's own status
    want_out, want_err = split_streams(LORA.read_bytes())
    assert proc.stdout == want_out  # kept separate, unchanged
    assert proc.stderr.startswith(want_err)
    report = proc.stderr[len(want_err) :].decode()
    assert "exited with status 134 (SIGABRT)" in report
    assert "[oom_hidden]" in report and f"{log}:10 rank 2" in report
    # the archive holds both streams, line by line, as they came
    if archive.endswith(".gz"):
        archived = gzip.decompress(log.read_bytes())
    else:
        import zstandard

        archived = zstandard.ZstdDecompressor().stream_reader(log.read_bytes()).read()
    assert sorted(archived.splitlines()) == sorted(LORA.read_bytes().splitlines())
    assert archived == LORA.read_bytes()  # printed slowly: the order is the log's
    batch = triage_path(str(log), load_ruleset())
    assert batch.findings[0].rule.id == "oom-behind-timeout"


def test_run_forwards_sigterm_and_returns_the_jobs_status(
    tmp_path: Path, popen: Callable[..., subprocess.Popen[bytes]]
) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import signal, sys, time
            def bye(signum, frame):
                print("job got", signal.Signals(signum).name, flush=True)
                sys.exit(7)
            signal.signal(signal.SIGTERM, bye)
            print("ready", flush=True)
            time.sleep(30)
            """
        ),
        encoding="utf-8",
    )
    proc = popen(
        [*CLI, "run", "--", sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert out == b"job got SIGTERM\n"
    assert b"exited with status 7" in err and b"clean" in err


def test_run_status_of_a_missing_command_and_of_a_signal() -> None:
    missing = subprocess.run(
        [*CLI, "run", "--", "no-such-command-xyz"], capture_output=True, timeout=30, check=False
    )
    assert missing.returncode == 127 and b"cannot run no-such-command-xyz" in missing.stderr
    killed = subprocess.run(
        [*CLI, "run", "--", sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert killed.returncode == 143 and b"(SIGTERM)" in killed.stderr


def test_run_with_closed_stdout_lets_the_job_meet_the_closed_pipe(
    popen: Callable[..., subprocess.Popen[bytes]],
) -> None:
    proc = popen([*CLI, "run", "--", "yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b"y\ny\ny\ny\ny\n"
    proc.stdout.close()
    assert proc.wait(20) == 128 + signal.SIGPIPE
    err = proc.stderr.read()
    assert b"Traceback" not in err and b"exited with status 141 (SIGPIPE)" in err


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU timeout")
def test_gnu_timeout_sigterm_is_one_signal_for_watch_and_run(tmp_path: Path) -> None:
    """GNU timeout signals the process, then its group: one SIGTERM, seen twice."""
    line = (
        "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800512 "
        "milliseconds before timing out."
    )
    # watch: its input stays open; timeout ends it: 143, as after any SIGTERM, not 130
    feeder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; print({line!r}, flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        watch = subprocess.run(
            ["timeout", "--preserve-status", "-s", "TERM", "3", *CLI, "watch"],
            stdin=feeder.stdout,
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        feeder.kill()
        feeder.wait()
        assert feeder.stdout is not None
        feeder.stdout.close()
    assert watch.returncode == 143, watch.stderr[-500:]
    # run: the job is stopped by the signal, and the final diagnosis still comes
    job = f"import time; print({line!r}, flush=True); time.sleep(30)"
    run = subprocess.run(
        [
            "timeout",
            "--preserve-status",
            "-s",
            "TERM",
            "3",
            *CLI,
            "run",
            "--",
            sys.executable,
            "-c",
            job,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 143, run.stderr[-500:]
    assert b"final diagnosis" in run.stderr  # the analyser was not in the signalled group


def test_one_sigterm_delivered_twice_is_one_stop() -> None:
    """To us, then to our process group (GNU timeout): not the second Ctrl-C that escalates."""
    from nccl_triage.live.pump import _Signals

    sigs = _Signals((signal.SIGTERM,), escalate=True)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # raised KeyboardInterrupt before
        assert sigs.take() == [signal.SIGTERM]
    finally:
        sigs.restore()


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(
        st.tuples(st.sampled_from([b"D", b"G", b"E"]), st.binary(max_size=300)), max_size=8
    ),
    cuts=st.lists(st.integers(0, 3000), max_size=10),
)
def test_frames_survive_any_cut_into_any_pieces(
    frames: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode_frame(k, p) for k, p in frames)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    reader = FrameReader()
    got = []
    for a, b in itertools.pairwise(points):
        got += list(reader.push(wire[a:b]))
    assert got == frames
