"""The notebooks run top to bottom, unattended, with the scripted model, and are committed with their outputs.

Each notebook is executed in a fresh kernel (nbclient, cwd = notebooks/) from an in-memory copy, so the committed
file is never rewritten by the test; any cell error fails the test with the cell and its traceback. The committed
copy must carry the outputs of one clean top-to-bottom run (execution counts 1..n, no error outputs): after editing
a notebook, re-execute and save it, e.g. ``pytest --nbmake --overwrite notebooks/`` or nbclient.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = (
    "01_quickstart.ipynb",
    "02_approvals.ipynb",
    "03_durability.ipynb",
    "04_studio.ipynb",
    "05_migrating_from_create_agent.ipynb",
)
CELL_TIMEOUT_S = 120
NOTEBOOK_BUDGET_S = 120  # each is meant to take well under a minute; this only catches a runaway


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_are_there() -> None:
    assert {p.name for p in _notebooks()} >= set(EXPECTED)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_committed_with_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    counts = [cell.get("execution_count") for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: not saved from one clean run: {counts}"
    errors = [o for cell in code for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name} was saved with an error output: {errors[0].get('ename')}"
    assert any(cell.get("outputs") for cell in code), f"{path.name} was saved without outputs"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_notebook_runs(path: Path) -> None:
    book = copy.deepcopy(nbformat.read(path, as_version=4))
    client = NotebookClient(
        book,
        timeout=CELL_TIMEOUT_S,
        kernel_name=book.metadata.get("kernelspec", {}).get("name", "python3"),
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    client.execute()  # raises CellExecutionError (with the cell source and traceback) on any failing cell
    elapsed = time.monotonic() - started
    assert elapsed < NOTEBOOK_BUDGET_S, f"{path.name} took {elapsed:.0f}s"
