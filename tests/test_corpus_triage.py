"""Accuracy over labelled real logs: the public corpus (../shared/corpus, skipped when absent)
and the logs mined for this project (tests/corpus/*), through ``rules test --corpus``'s own
evaluation.

The bars: every expected verdict right, no diagnosis on a clean log, and the cause the log's own
lines support (``evidence_cause``) first on at least 95% of the cases that show one. Until the
code meets them, each figure is a ratchet: the number below is what the code reaches today; it
may only ever be raised, and the test fails both when a change loses ground and when it gains
some without raising the number (so the written figure is always the true one).
``pytest -s`` prints each folder's report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_triage.authoring.evaluate import Evaluation, evaluate_corpus, has_manifest
from nccl_triage.render.report import report_json
from nccl_triage.ruleset import load_ruleset

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
MINED = Path(__file__).resolve().parent / "corpus"

# Per folder, the ratchets: (verdicts right, clean logs diagnosed, failing logs called clean,
# cause first, causes claimed where the lines show none). Raise them; never lower them.
RATCHETS: dict[str, tuple[int, int, int, int, int]] = {
    "shared": (116, 0, 0, 71, 0),
    "blind-errors": (24, 0, 0, 15, 0),
    "blind-forums": (17, 0, 0, 9, 1),
    "blind-recent": (11, 0, 0, 5, 0),
    "blind-timeouts": (18, 0, 0, 6, 0),
    "cleandesync": (33, 0, 0, 26, 0),
    "context": (10, 0, 0, 3, 0),
    "crash": (16, 0, 0, 10, 0),
    "ncclerr": (31, 0, 0, 17, 0),
    "fatal": (14, 0, 2, 7, 0),
    "store": (16, 0, 2, 9, 0),
    "validation-causes": (13, 0, 0, 7, 0),
    "validation-errors": (30, 0, 0, 14, 2),
    "validation-timeouts": (26, 0, 0, 0, 0),
}
FOLDERS = {"shared": SHARED, **{p.name: p for p in sorted(MINED.iterdir()) if has_manifest(p)}}


def ratchet(name: str, value: int, floor: int, higher_is_better: bool = True) -> None:
    if value == floor:
        return
    better = value > floor if higher_is_better else value < floor
    if better:
        pytest.fail(f"{name} improved to {value}: write it into the test (it was {floor})")
    pytest.fail(f"{name} fell to {value} (the ratchet is {floor})")


@pytest.fixture(scope="module")
def evaluations() -> dict[str, Evaluation]:
    rules = load_ruleset()
    return {
        name: evaluate_corpus(path, rules) for name, path in FOLDERS.items() if has_manifest(path)
    }


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_accuracy_ratchets(name: str, evaluations: dict[str, Evaluation]) -> None:
    if name not in evaluations:
        pytest.skip(f"{FOLDERS[name]} is not here")
    ev = evaluations[name]
    print("\n" + ev.format())
    assert not ev.problems
    verdicts, clean_diagnosed, called_clean, first, made_up = RATCHETS[name]
    ratchet(f"{name}: right verdicts", ev.verdicts_right, verdicts)
    ratchet(f"{name}: clean logs diagnosed", len(ev.clean_diagnosed), clean_diagnosed, False)
    ratchet(f"{name}: failing logs called clean", len(ev.failing_called_clean), called_clean, False)
    ratchet(f"{name}: evidence cause first", ev.first_right, first)
    ratchet(f"{name}: causes made up", len(ev.made_up), made_up, False)


def test_every_mined_folder_has_a_ratchet() -> None:
    assert set(FOLDERS) <= set(RATCHETS)


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_every_diagnosis_renders_its_advice(name: str) -> None:
    if not has_manifest(FOLDERS[name]):
        pytest.skip(f"{FOLDERS[name]} is not here")
    from nccl_triage.pipeline import triage_path

    rules = load_ruleset()
    for path in sorted(FOLDERS[name].glob("*.log")):
        report = triage_path(str(path), rules)
        for diagnosis in report_json(report, rules.template_dirs)["diagnoses"]:
            assert diagnosis["advice"].strip(), path.name
