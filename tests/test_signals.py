"""Runs of a signal grow by counting: the events are those extending them line by line gives,
however often they are read or pruned on the way."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from nccl_triage.diagnose.signals import RUN_GAP_LINES, SignalClassifier
from nccl_triage.model import Event, Line
from nccl_triage.parse.anatomy import peel
from nccl_triage.ruleset import load_ruleset

SIGNALS = load_ruleset().signals
TEXTS = [
    "{{'loss': 3.95, 'grad_norm': 1.5, 'epoch': 0.01}}",
    "[2024-10-22 10:07:{s:02d},900] {{'loss': 3.9, 'epoch': 0.02}}",
    "[rank{r}]:[2024-10-22 10:08:{s:02d},100] {{'loss': 2.5, 'epoch': 0.03}}",
    "[rank{r}]: Saving model checkpoint to /ckpt/checkpoint-{s}",
    "plain output {s}",
]


def line(n: int, choice: int, second: int, rank: int) -> Line:
    return peel(Line("<log>", n, TEXTS[choice].format(s=second, r=rank)))


def run(steps: list[tuple[int, int, int, int]], read_every_line: bool) -> list[Event]:
    classifier = SignalClassifier(SIGNALS)
    n = 0
    for gap, choice, second, rank in steps:
        n += gap
        classifier.feed(line(n, choice, second, rank))
        if read_every_line:
            classifier.events  # noqa: B018 - builds every grown run, as one line at a time did
    return classifier.events


STEPS = st.lists(
    st.tuples(st.integers(1, 70), st.integers(0, 4), st.integers(0, 59), st.integers(0, 2)),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(steps=STEPS)
def test_runs_grow_as_if_extended_line_by_line(steps: list[tuple[int, int, int, int]]) -> None:
    assert run(steps, read_every_line=False) == run(steps, read_every_line=True)


@settings(max_examples=50, deadline=None)
@given(steps=STEPS, cut=st.integers(0, 2000))
def test_pruning_builds_the_runs_first(steps: list[tuple[int, int, int, int]], cut: int) -> None:
    lazy, eager = SignalClassifier(SIGNALS), SignalClassifier(SIGNALS)
    n = 0
    for i, (gap, choice, second, rank) in enumerate(steps):
        n += gap
        lazy.feed(line(n, choice, second, rank))
        eager.feed(line(n, choice, second, rank))
        eager.events  # noqa: B018
        if i == len(steps) // 2:
            assert lazy.prune(cut) == eager.prune(cut)
    assert lazy.events == eager.events


def every_nth_line(n: int) -> Callable[[Event], bool]:
    """What a pruning spares in these tests: the events on every ``n``-th line."""
    return lambda e: e.line % n == 0


Step = tuple[int, int, int, int]  # lines ahead (a gap), which line, its second, its rank


def fed_alike(
    classifiers: tuple[SignalClassifier, ...],
    steps: list[Step],
    cuts: list[tuple[int, int]],
    n: int,
) -> Iterator[tuple[int, int]]:
    """Feed every classifier the lines of ``steps`` from line ``n`` on; at each cut (after the
    step it names), yield the line reached and the cut's offset."""
    at = dict(cuts)
    for i, (gap, choice, second, rank) in enumerate(steps):
        n += gap
        for classifier in classifiers:
            classifier.feed(line(n, choice, second, rank))
        if i in at:
            yield n, at[i]


def test_a_run_counts_its_lines_and_times() -> None:
    classifier = SignalClassifier(SIGNALS)
    for n, second in ((10, 1), (12, 5), (14, 9)):
        classifier.feed(line(n, 1, second, 0))
    [event] = classifier.events
    assert event.kind == "training_progress" and event.line == 10
    assert (event.detail["count"], event.detail["last_line"]) == (3, 14)
    assert event.detail["duration_s"] == 8


def test_named_groups_are_text() -> None:
    classifier = SignalClassifier(SIGNALS)
    classifier.feed(line(5, 3, 42, 1))
    [event] = classifier.events
    assert event.kind == "checkpoint_save"
    assert event.detail["path"] == "/ckpt/checkpoint-42"
    assert all(isinstance(k, str) for k in event.detail)


def _scan_anchors_in(text: bytes, anchors: tuple[str, ...]) -> set[bytes]:
    from nccl_triage.ingest.engines import split_anchors
    from nccl_triage.ingest.regex import compile_bytes_alternation

    literals, regexes = split_anchors(anchors)
    found = {a for a in literals if a in text}
    return found | {r for r in regexes if compile_bytes_alternation((), (r,)).search(text)}


def test_the_anchors_a_line_holds_stand_for_every_pattern_that_matches_it() -> None:
    """Every example a signal must match holds an anchor of the pattern that matches it.

    The scan finds lines by their anchors, and a redrawn line's parts are matched only
    against the patterns whose anchors they hold (anchor_hits): a pattern matching without
    one of its anchors would be missed.
    """
    from nccl_triage.pipeline import scan_patterns
    from nccl_triage.ruleset import Ruleset

    anchors = scan_patterns(Ruleset(rules=[], signals=list(SIGNALS)))
    classifier = SignalClassifier(SIGNALS)
    checked = 0
    for sig in SIGNALS:
        for ex in sig.examples:
            if ex.expect != "match":
                continue
            ln = peel(Line("<log>", 1, ex.line))
            held = _scan_anchors_in(ln.text.encode(), anchors)
            assert set(classifier.hits(ln)) <= set(classifier.anchor_hits(held)), (sig.id, ex.line)
            got = [e.kind for e in SignalClassifier(SIGNALS).feed(ln, classifier.anchor_hits(held))]
            assert sig.id in got, (sig.id, ex.line)
            checked += 1
    assert checked > 30


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="{}'lossepch: 0123456789.-e,_x\u00e9", max_size=60),
    which=st.integers(0, 2),
)
def test_the_direct_search_finds_what_the_wrapper_finds(text: str, which: int) -> None:
    """BytesSearcher (the compiled pattern called directly) equals re2's search, with and
    without the wrapper's internals."""
    from nccl_triage.ingest.regex import BytesSearcher, compile_bytes_regex

    pattern = [
        r"\{'loss': (?P<loss>-?[\d.]+)(?:e(?P<exp>-?\d+))?,",
        r"(?P<a>x)?(?P<b>\d+)|e",
        r"epoch[: ]+(?P<epoch>[\d.]+)",
    ][which]
    compiled = compile_bytes_regex(pattern)
    data = text.encode()
    m = compiled.search(data)
    want_spans = None if m is None else [m.span(i) for i in range(compiled.groups + 1)]
    want_named = (
        {}
        if m is None
        else {k.decode(): v.decode() for k, v in m.groupdict().items() if v is not None}
    )
    direct = BytesSearcher(compiled)
    fallback = BytesSearcher(compiled)
    fallback._match = None  # a wrapper that exposes nothing
    for searcher in (direct, fallback):
        spans = searcher.spans(data)
        assert spans == want_spans
        if spans is not None:
            assert searcher.named(data, spans) == want_named


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 70), st.integers(0, 4), st.integers(0, 59), st.integers(0, 2)),
        max_size=80,
    ),
    cuts=st.lists(st.tuples(st.integers(0, 79), st.integers(RUN_GAP_LINES + 1, 400)), max_size=4),
    kept=st.integers(1, 4),
)
def test_pruning_forgets_exactly_what_ended_before_the_line(
    steps: list[Step], cuts: list[tuple[int, int]], kept: int
) -> None:
    """Pruned now and then (behind the runs that may still grow, as live triage does), the
    events are those never pruned, less those that had ended at a cut and were not kept;
    the runs still open grow as before."""
    pruned, whole = SignalClassifier(SIGNALS), SignalClassifier(SIGNALS)

    keep = every_nth_line(kept)

    def last(e: Event) -> int:
        return int(e.detail.get("last_line") or e.line)

    done = []
    for n, back in fed_alike((pruned, whole), steps, cuts, 0):
        cut = n - back
        gone = [e for e in pruned.events if last(e) < cut and not keep(e)]
        assert pruned.prune(cut, keep) == len(gone)
        done.append(cut)
    assert pruned.events == [
        e for e in whole.events if not any(last(e) < cut and not keep(e) for cut in done)
    ]


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(-5, 70), st.integers(0, 4), st.integers(0, 59), st.integers(0, 2)),
        max_size=80,
    ),
    cuts=st.lists(st.tuples(st.integers(0, 79), st.integers(-50, 50)), max_size=4),
    kept=st.integers(1, 4),
)
def test_pruning_looks_at_what_started_before_the_line_as_at_every_event(
    steps: list[Step], cuts: list[tuple[int, int]], kept: int
) -> None:
    """Pruning what started before the line (events in order) forgets what pruning every
    event forgets, keeps the same runs open, and grows them alike afterwards; lines going
    back (a gap below zero) make it look at every event."""
    fast, every = SignalClassifier(SIGNALS), SignalClassifier(SIGNALS)
    every._in_order = False  # the reference: every event looked at

    keep = every_nth_line(kept)
    for n, ahead in fed_alike((fast, every), steps, cuts, 100):
        before = n + ahead
        assert fast.prune(before, keep) == every.prune(before, keep)
        assert fast.events == every.events
    assert fast.events == every.events
