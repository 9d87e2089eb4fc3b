"""Soak: many threads x many approval turns on one SQLite file, async, with bounded concurrency.

    .venv/bin/python -m bench.soak                                # 1,000 threads x 10 turns, 50 at a time
    .venv/bin/python -m bench.soak --threads 50 --turns 3         # quick run
    .venv/bin/python -m bench.soak --db /tmp/soak.sqlite --json bench/out/soak.json

Every turn is a gated write: the user asks for a booking, the model proposes one `book` call, the graph pauses
for approval, `Command(resume={"decisions": [{"type": "approve"}]})` approves it, the write runs, the model
answers. Each turn is checked (status `completed`, the scripted answer), and at the end every approved write
must have happened exactly once (one side effect per idempotency key, one `done` ledger row per call).

Reported: total wall time, turns/s, current and peak RSS sampled over time (to show memory stays bounded as
threads come and go), errors (must be zero), the file's size (with its WAL, and after folding the WAL in).
A watchdog stops a run in which no turn finishes for `--stall-s` seconds and reports it as hung (a deadlocked
executor thread cannot be joined, so the process exits hard after printing the report).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import faulthandler
import json
import os
import re
import resource
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool
from langgraph.types import Command

from gatedloop.checkpoints import open_async_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

APPROVE = {"decisions": [{"type": "approve"}]}
_TURN = re.compile(r"^turn (\d+): book (\d+) (\w+)$")


class Bookings:
    """The authoritative system the writes land in: one entry per real execution, keyed by idempotency key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_key: Counter[str] = Counter()

    def add(self, key: str) -> int:
        with self._lock:
            self.by_key[key] += 1
            return sum(self.by_key.values())

    def find(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return {"booked": True} if self.by_key.get(key) else None


def responder(messages: list[BaseMessage]) -> AIMessage | None:
    """A booking call for a fresh user message; a fixed answer once its result is in."""
    last_user = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    found = _TURN.match(str(last_user.content)) if last_user is not None else None
    if found is None:
        return None
    turn, quantity, item = int(found.group(1)), int(found.group(2)), found.group(3)
    if isinstance(messages[-1], ToolMessage):
        return reply(f"turn {turn} booked")
    if not isinstance(messages[-1], HumanMessage):
        return None
    return reply(calls=[call("book", {"item": item, "quantity": quantity}, f"call-{turn}")])


def make_graph(saver: Any, bookings: Bookings) -> Any:
    @tool
    def book(item: str, quantity: int, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Book `quantity` of `item` (a write; a person approves every call)."""
        return {"booking": bookings.add(idempotency_key), "item": item, "quantity": quantity}

    policies = {
        "book": ToolPolicy(effect="write", approval="always", reconcile=lambda args, key: bookings.find(key)),
    }
    return build_graph(
        ScriptedChatModel(responder=responder),
        [book],
        policies=policies,
        limits=Limits(max_model_calls=4),
        checkpointer=saver,
    )


def rss_mb() -> float:
    """Current resident set size (from /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return 0.0
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def file_bytes(db: str) -> dict[str, int]:
    return {suffix or "db": Path(db + suffix).stat().st_size for suffix in ("", "-wal") if Path(db + suffix).exists()}


class Soak:
    def __init__(self, args: argparse.Namespace, db: str) -> None:
        self.args = args
        self.db = db
        self.bookings = Bookings()
        self.turns_done = 0
        self.threads_done = 0
        self.errors: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def sample(self) -> None:
        self.samples.append(
            {
                "t_s": round(time.perf_counter() - self.started, 2),
                "turns_done": self.turns_done,
                "threads_done": self.threads_done,
                "rss_mb": rss_mb(),
                "peak_rss_mb": peak_rss_mb(),
            }
        )

    async def one_turn(self, graph: Any, thread_id: str, turn: int) -> None:
        cfg = {"configurable": {"thread_id": thread_id}}
        text = f"turn {turn}: book {turn} seats"
        out = await graph.ainvoke({"messages": [("user", text)]}, cfg, durability="sync")
        request = out.get("__interrupt__")
        if not request or request[0].value.get("kind") != "approval":
            raise AssertionError(f"{thread_id} turn {turn} did not pause for approval: {out.get('status')}")
        out = await graph.ainvoke(Command(resume=APPROVE), cfg, durability="sync")
        if "__interrupt__" in out or out.get("status") != "completed" or out.get("answer") != f"turn {turn} booked":
            raise AssertionError(f"{thread_id} turn {turn} ended {out.get('status')!r}: {out.get('stop_detail')}")

    async def one_thread(self, graph: Any, gate: asyncio.Semaphore, index: int) -> None:
        async with gate:
            for turn in range(1, self.args.turns + 1):
                try:
                    await self.one_turn(graph, f"soak-{index}", turn)
                except Exception as exc:
                    self.errors.append(f"soak-{index} turn {turn}: {type(exc).__name__}: {str(exc)[:200]}")
                    return
                self.turns_done += 1
            self.threads_done += 1

    async def run(self) -> dict[str, Any]:
        if self.args.pool:
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=self.args.pool))
        self.sample()
        async with open_async_sqlite(self.db) as saver:
            graph = make_graph(saver, self.bookings)
            gate = asyncio.Semaphore(self.args.concurrency)
            work = asyncio.gather(*(self.one_thread(graph, gate, i) for i in range(self.args.threads)))
            seen, quiet_since, last_sample, hung = -1, time.perf_counter(), 0.0, False
            while not work.done():
                await asyncio.wait([work], timeout=0.25)
                now = time.perf_counter()
                if now - last_sample >= self.args.sample_s:
                    self.sample()
                    last_sample = now
                if self.turns_done != seen:
                    seen, quiet_since = self.turns_done, now
                elif now - quiet_since > self.args.stall_s:
                    hung = True
                    break
            wall = time.perf_counter() - self.started
            self.sample()
            if hung:
                report = self.report(wall, hung=True, ledger=None)
                emit(report, self.args.json)
                if self.args.dump_on_hang:
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(2)
            ledger = Counter(e.state for i in range(self.args.threads) for e in saver.ledger.entries(f"soak-{i}"))
            with_wal = file_bytes(self.db)
        report = self.report(wall, hung=False, ledger=dict(ledger))
        report["file_bytes_with_wal"] = with_wal
        return report

    def report(self, wall: float, *, hung: bool, ledger: dict[str, int] | None) -> dict[str, Any]:
        expected = self.args.threads * self.args.turns
        with_wal = file_bytes(self.db)
        folded: dict[str, int] = {}
        if not hung:
            conn = sqlite3.connect(self.db, timeout=30)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
            folded = file_bytes(self.db)
        keys = self.bookings.by_key
        rss = [s["rss_mb"] for s in self.samples]
        half = len(rss) // 2
        return {
            "command": " ".join(sys.argv),
            "threads": self.args.threads,
            "turns_per_thread": self.args.turns,
            "concurrency": self.args.concurrency,
            "executor_workers": self.args.pool or min(32, (os.cpu_count() or 1) + 4),
            "turns_expected": expected,
            "turns_completed": self.turns_done,
            "threads_completed": self.threads_done,
            "hung": hung,
            "wall_s": round(wall, 2),
            "turns_per_s": round(self.turns_done / wall, 2) if wall > 0 else 0.0,
            "model_and_graph_invokes_per_s": round(2 * self.turns_done / wall, 2) if wall > 0 else 0.0,
            "errors": len(self.errors),
            "error_samples": self.errors[:5],
            "writes_executed": sum(keys.values()),
            "distinct_idempotency_keys": len(keys),
            "keys_executed_more_than_once": sum(1 for n in keys.values() if n > 1),
            "ledger_states": ledger,
            "file_bytes_with_wal": with_wal,
            "file_bytes_after_wal_truncate": folded,
            "rss_mb_start": rss[0] if rss else None,
            "rss_mb_max_first_half": max(rss[: max(half, 1)]) if rss else None,
            "rss_mb_max_second_half": max(rss[half:]) if rss else None,
            "peak_rss_mb": peak_rss_mb(),
            "samples": thin(self.samples, 40),
        }


def thin(samples: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    if len(samples) <= keep:
        return samples
    step = (len(samples) - 1) / (keep - 1)
    return [samples[round(i * step)] for i in range(keep)]


def emit(report: dict[str, Any], path: str | None) -> None:
    text = json.dumps(report, indent=2)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    print("rss over time (t_s, turns_done, rss_mb, peak_rss_mb):")
    for s in report["samples"]:
        print(f"  {s['t_s']:>8.1f} {s['turns_done']:>7} {s['rss_mb']:>8.1f} {s['peak_rss_mb']:>8.1f}")
    sys.stdout.flush()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=10, help="approval turns per thread")
    parser.add_argument("--concurrency", type=int, default=50, help="threads in flight at once")
    parser.add_argument("--pool", type=int, default=0, help="default executor threads (0: asyncio's default)")
    parser.add_argument("--db", default=None, help="SQLite file (default: a fresh temporary file)")
    parser.add_argument("--json", default=None, help="write the full report (with all RSS samples) here")
    parser.add_argument("--sample-s", type=float, default=2.0, help="RSS sampling period")
    parser.add_argument("--stall-s", type=float, default=60.0, help="report a hang after this long with no turn done")
    parser.add_argument("--dump-on-hang", action="store_true", help="print every thread's stack when hung")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="gatedloop-soak-") as tmp:
        db = args.db or str(Path(tmp) / "soak.sqlite")
        report = asyncio.run(Soak(args, db).run())
        emit(report, args.json)
    ok = (
        report["errors"] == 0
        and report["turns_completed"] == report["turns_expected"]
        and report["writes_executed"] == report["turns_expected"]
        and report["keys_executed_more_than_once"] == 0
        and report["ledger_states"] == {"done": report["turns_expected"]}
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
