"""What an async ledger driver would cost: CPU per ledger-shaped transaction from many asyncio tasks at once.

    .venv/bin/python -m bench.ledger_driver [--backend sqlite|postgres] [--tasks 50] [--transactions 40] [--reps 3]

Issue 52 asked for ledger I/O under `ainvoke` through an async driver (`aiosqlite`, psycopg's async pool) instead
of the executor. This measures the two shapes on the same transaction, the shape of the gate's writes (`BEGIN`, three
INSERTs, one SELECT, `COMMIT`), from `--tasks` concurrent tasks:

- `executor`: the whole transaction in one hop to the default executor, on a connection of the worker thread (as
  the gate's nodes run now: one hop per node, each doing its transactions synchronously);
- `async`: statement by statement on an async driver: SQLite through `aiosqlite` on one connection under an
  `asyncio.Lock` (a second writer connection would wait on the checkpointer's open transaction, and blocking the
  loop for it deadlocks: the checkpointer's commit needs the loop), Postgres through psycopg's `AsyncConnectionPool`.

Prints one line per shape and rep (CPU of the whole process per transaction, and transactions/s), then a JSON object
with the medians. Postgres needs `GATEDLOOP_TEST_PG_URL` (`.ci/start_postgres.sh`).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

ROW = ("y" * 40, 1.0)
_local = threading.local()


def _sqlite_tx(path: str, key: str) -> None:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    for _ in range(3):
        conn.execute("INSERT INTO ledger_shape VALUES (?, ?, ?)", (key, *ROW))
    conn.execute("SELECT count(*) FROM ledger_shape WHERE k = ?", (key,)).fetchone()
    conn.execute("COMMIT")


async def _sqlite_executor(path: str, tasks: int, count: int) -> None:
    async def one(index: int) -> None:
        for _ in range(count):
            await asyncio.to_thread(_sqlite_tx, path, f"k{index}")

    await asyncio.gather(*(one(i) for i in range(tasks)))


async def _sqlite_async(path: str, tasks: int, count: int) -> None:
    async with aiosqlite.connect(path, isolation_level=None, timeout=30) as conn:
        await conn.execute("PRAGMA synchronous=NORMAL")
        lock = asyncio.Lock()

        async def one(index: int) -> None:
            for _ in range(count):
                async with lock:
                    await conn.execute("BEGIN IMMEDIATE")
                    for _ in range(3):
                        await conn.execute("INSERT INTO ledger_shape VALUES (?, ?, ?)", (f"k{index}", *ROW))
                    async with conn.execute("SELECT count(*) FROM ledger_shape WHERE k = ?", (f"k{index}",)) as cur:
                        await cur.fetchone()
                    await conn.execute("COMMIT")

        await asyncio.gather(*(one(i) for i in range(tasks)))


def _sqlite_target() -> str:
    path = str(Path(tempfile.mkdtemp()) / "ledger-shape.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE ledger_shape (k TEXT, v TEXT, at REAL)")
    return path


def _postgres_tx(url: str, table: str, key: str) -> None:
    import psycopg

    conn = getattr(_local, "pg", None)
    if conn is None:
        conn = _local.pg = psycopg.connect(url)
    with conn.transaction():
        for _ in range(3):
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (key, *ROW))
        conn.execute(f"SELECT count(*) FROM {table} WHERE k = %s", (key,)).fetchone()


async def _postgres_executor(target: str, tasks: int, count: int) -> None:
    url, table = target.split(" ")

    async def one(index: int) -> None:
        for _ in range(count):
            await asyncio.to_thread(_postgres_tx, url, table, f"k{index}")

    await asyncio.gather(*(one(i) for i in range(tasks)))


async def _postgres_async(target: str, tasks: int, count: int) -> None:
    from psycopg_pool import AsyncConnectionPool

    url, table = target.split(" ")
    async with AsyncConnectionPool(url, min_size=6, max_size=6, open=False) as pool:

        async def one(index: int) -> None:
            for _ in range(count):
                async with pool.connection() as conn, conn.transaction():
                    for _ in range(3):
                        await conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (f"k{index}", *ROW))
                    await (await conn.execute(f"SELECT count(*) FROM {table} WHERE k = %s", (f"k{index}",))).fetchone()

        await asyncio.gather(*(one(i) for i in range(tasks)))


def _postgres_target() -> str:
    import psycopg

    url = os.environ.get("GATEDLOOP_TEST_PG_URL")
    if not url:
        raise SystemExit("--backend postgres needs GATEDLOOP_TEST_PG_URL (start a server with .ci/start_postgres.sh)")
    table = f"ledger_shape_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (k TEXT, v TEXT, at DOUBLE PRECISION)")
    return f"{url} {table}"


Shape = Callable[[str, int, int], Awaitable[None]]
BACKENDS: dict[str, tuple[Callable[[], str], dict[str, Shape]]] = {
    "sqlite": (_sqlite_target, {"executor": _sqlite_executor, "async": _sqlite_async}),
    "postgres": (_postgres_target, {"executor": _postgres_executor, "async": _postgres_async}),
}


def measure(backend: str, tasks: int, count: int, reps: int) -> dict[str, Any]:
    """Each shape `reps` times, interleaved, each on a fresh table; medians of CPU per transaction and throughput."""
    target_for, shapes = BACKENDS[backend]
    cpu: dict[str, list[float]] = {name: [] for name in shapes}
    rate: dict[str, list[float]] = {name: [] for name in shapes}
    for rep in range(reps):
        for name, shape in shapes.items():
            target = target_for()
            cpu_started, started = time.process_time(), time.perf_counter()
            asyncio.run(shape(target, tasks, count))
            done = tasks * count
            cpu[name].append((time.process_time() - cpu_started) / done * 1e6)
            rate[name].append(done / (time.perf_counter() - started))
            print(f"{backend} rep {rep} {name:8s} CPU {cpu[name][-1]:7.1f} us/transaction, {rate[name][-1]:6.0f}/s")
    medians = {
        name: {"cpu_us": statistics.median(cpu[name]), "per_s": statistics.median(rate[name])} for name in shapes
    }
    return {"backend": backend, "tasks": tasks, "transactions": count, "reps": reps, "medians": medians}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_driver")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="sqlite")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.backend, args.tasks, args.transactions, args.reps)))


if __name__ == "__main__":
    main()
