"""Shared fixtures. Tests import helper modules from this folder (run with --import-mode=importlib)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "runs.sqlite")
