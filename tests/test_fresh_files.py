"""Processes opening a new SQLite file at the same moment all succeed: two CLIs, `langgraph dev` and its
inbox, or pytest's workers importing the served demo graph. SQLite refuses a concurrent switch to WAL mode
on a fresh file at once ("database is locked") without waiting its busy timeout; seen as a collection error
of the README's test command on a fresh clone."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

PROCESSES = 6
ROUNDS = 10
OPEN_FRESH_FILES = r"""
import sys, time
from pathlib import Path
from gatedloop.checkpoints import open_sqlite
from gatedloop.demo.store import DemoStore

folder, start, rounds = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
for k in range(rounds):
    while time.time() < start + k * 0.2:  # every process opens round k's files at the same moment
        time.sleep(0.0005)
    with open_sqlite(folder / f"threads-{k}.sqlite") as saver:
        saver.ledger.audit(f"t-{k}")
    DemoStore(folder / f"demo-{k}.sqlite")
print("opened", rounds)
"""


def test_processes_opening_the_same_new_files_at_once_all_succeed(tmp_path: Path):
    start = time.time() + 4  # after every child has imported gatedloop
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_FRESH_FILES, str(tmp_path), str(start), str(ROUNDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    results = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0] * PROCESSES, [err[-1500:] for _, err in results]
    assert [out.strip() for out, _ in results] == [f"opened {ROUNDS}"] * PROCESSES
    for k in range(ROUNDS):
        for name in (f"threads-{k}.sqlite", f"demo-{k}.sqlite"):
            with closing(sqlite3.connect(tmp_path / name)) as conn:
                assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",), name
