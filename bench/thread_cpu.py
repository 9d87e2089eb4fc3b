"""CPU time and context switches by kind of thread, to say where an async turn's time goes: the event loop,
aiosqlite's connection thread (the checkpointer's SQL), the default executor (what a node sends off the loop:
gatedloop's gate logic and ledger) and gatedloop's tool pool. Read from /proc (Linux): cProfile and tracemalloc see
one thread only, and a sampling profiler's overhead moves the split it measures. Hand-written: no library reports
per-thread CPU by role.

Switches are counted beside the CPU: each is a thread that stopped to wait (for the GIL, a lock, a queue, a
sleep) or was stopped, so they show how often a turn's work changes threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

Snapshot = dict[int, tuple[str, float, int]]


def _role(name: str) -> str:
    if name == "MainThread":
        return "event loop"
    if "_connection_worker_thread" in name:
        return "aiosqlite"
    if name.startswith("asyncio_"):
        return "executor"
    if name.startswith("gatedloop-tool"):
        return "tool pool"
    return "other"


def snapshot() -> Snapshot:
    """Each live thread's role, CPU seconds and context switches (voluntary and not) so far: the scheduler's run
    time in nanoseconds (`schedstat`), not `stat`'s clock ticks, whose 10 ms steps lose much of what many short
    bursts on many threads cost."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    found: Snapshot = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            run_ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
        except OSError:  # the thread ended while being read
            continue
        tid = int(task.name)
        found[tid] = (_role(names.get(tid, "")), run_ns / 1e9, _switches(status))
    return found


def _switches(status: str) -> int:
    fields = dict(line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


def split(before: Snapshot, after: Snapshot, per: int) -> dict[str, float]:
    """Milliseconds of CPU per unit of work (`per` turns) by role, between two snapshots. A thread that ended in
    between is not counted (the executors' threads live as long as their loop)."""
    return {role: round(seconds / per * 1000, 2) for role, seconds in _by_role(before, after, 1).items()}


def split_switches(before: Snapshot, after: Snapshot, per: int) -> dict[str, float]:
    """Context switches per unit of work (`per` turns) by role, between two snapshots, as `split`."""
    return {role: round(count / per, 1) for role, count in _by_role(before, after, 2).items()}


def _by_role(before: Snapshot, after: Snapshot, field: int) -> dict[str, float]:
    """Each role's growth of one snapshot field (1: CPU seconds, 2: switches), roles that grew only."""
    grown: Counter[str] = Counter()
    for tid, now in after.items():
        grown[now[0]] += now[field] - before.get(tid, (now[0], 0.0, 0))[field]
    return {role: amount for role, amount in sorted(grown.items()) if amount > 0}
