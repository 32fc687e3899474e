"""Shared fixtures: paths to the bundled example logs and the public corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "logs"
CORPUS = ROOT.parent / "shared" / "corpus"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def corpus_available() -> bool:
    return (CORPUS / "manifest.yaml").is_file()
