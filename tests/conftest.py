"""Shared fixtures: paths to the bundled example logs and the public corpus, a private cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "logs"
CORPUS = ROOT.parent / "shared" / "corpus"


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches the tool writes (the scan's Hyperscan databases) go to a temporary directory."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def corpus_available() -> bool:
    return (CORPUS / "manifest.yaml").is_file()
