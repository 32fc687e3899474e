"""The code stays as the project keeps it: layers (import-linter), ruff, and strict mypy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)


def tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_import_layers_and_third_party_libraries_stay_where_they_belong() -> None:
    result = run(tool("lint-imports"))
    assert result.returncode == 0, result.stdout[-3000:]


def test_ruff_check_and_format() -> None:
    ruff = tool("ruff")
    checked = run(ruff, "check", "src", "tests", "bench", "scripts")
    assert checked.returncode == 0, checked.stdout[-3000:]
    formatted = run(ruff, "format", "--check", "src", "tests", "bench", "scripts")
    assert formatted.returncode == 0, formatted.stdout[-3000:]


def test_mypy_strict() -> None:
    result = run(tool("mypy"))
    assert result.returncode == 0, result.stdout[-3000:]
