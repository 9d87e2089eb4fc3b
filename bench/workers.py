"""N worker processes on one PostgreSQL, threads side by side, workers SIGKILLed during writes and restarted.

    .venv/bin/python -m bench.workers [--workers 4] [--threads 200] [--turns 2] [--kills 12] [--scaling 1,2,4]
    .venv/bin/python -m bench.workers --quick          # CI size: 3 workers, 32 threads, 3 kills, no scaling

The database is the one `.ci/start_postgres.sh` starts (`GATEDLOOP_TEST_PG_URL`, or `--url`). Each run gets
its own thread ids, so runs never meet. A turn = a user message -> the model proposes one write (`reserve`,
ungated, with a `reconcile`) and one read -> both run -> the model answers. The write records its effect in
a table of the same database (the authoritative system) between two sleeps, so a kill lands before or after
the effect. Workers pick any unfinished thread whose lease they can take, and continue it from wherever it
stopped: a fresh turn, a run cut by a kill (resumed with no input), or a question for a person (answered
from the authoritative system, and counted: with a `reconcile` there should be none).

A kill picks a worker that is inside a write when there is one (the phase it was in is reported) and
SIGKILLs it; the coordinator starts a new worker in its place. At the end it checks, per run: every call's
effect happened exactly once (no double effects, none missing), every tool call has exactly one answer,
every thread completed all its turns, every ledger entry is settled, and how the killed writes were
settled (reconciled as done, or run again after reconcile said "not done"). Prints a JSON summary last.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Annotated, Any

from langchain_core.tools import InjectedToolArg, tool

ROOT = Path(__file__).resolve().parent.parent
URL_ENV = "GATEDLOOP_TEST_PG_URL"
WRITE_S = 0.03

BENCH_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bench_jobs (run_id TEXT, thread_id TEXT, done BOOLEAN NOT NULL DEFAULT FALSE,"
    " PRIMARY KEY (run_id, thread_id))",
    "CREATE TABLE IF NOT EXISTS bench_effects (seq BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL,"
    " idempotency_key TEXT NOT NULL, thread_id TEXT NOT NULL, item TEXT NOT NULL, pid INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS bench_effects_key ON bench_effects (idempotency_key)",
    "CREATE TABLE IF NOT EXISTS bench_people (run_id TEXT NOT NULL, thread_id TEXT NOT NULL, calls INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bench_errors (run_id TEXT NOT NULL, thread_id TEXT NOT NULL, detail TEXT NOT NULL)",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Shared:
    """The bench's own tables (jobs, effects, people asked, errors) on one autocommit connection."""

    def __init__(self, url: str, run_id: str):
        import psycopg

        self.run_id = run_id
        self.conn = psycopg.connect(url, autocommit=True)
        self.lock = threading.Lock()

    def execute(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.lock, self.conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def setup(self, threads: list[str]) -> None:
        with self.lock, self.conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(4242)")  # two bench runs creating the tables at once
            for statement in BENCH_SCHEMA:
                cur.execute(statement)
            cur.execute("SELECT pg_advisory_unlock(4242)")
            cur.executemany(
                "INSERT INTO bench_jobs (run_id, thread_id) VALUES (%s, %s)", [(self.run_id, t) for t in threads]
            )

    def undone(self) -> list[str]:
        return [
            r[0] for r in self.execute("SELECT thread_id FROM bench_jobs WHERE run_id=%s AND NOT done", (self.run_id,))
        ]

    def mark_done(self, thread_id: str) -> None:
        self.execute("UPDATE bench_jobs SET done=TRUE WHERE run_id=%s AND thread_id=%s", (self.run_id, thread_id))

    def add_effect(self, key: str, thread_id: str, item: str) -> int:
        rows = self.execute(
            "INSERT INTO bench_effects (run_id, idempotency_key, thread_id, item, pid) VALUES (%s, %s, %s, %s, %s)"
            " RETURNING seq",
            (self.run_id, key, thread_id, item, os.getpid()),
        )
        return int(rows[0][0])

    def find_effect(self, key: str) -> dict[str, Any] | None:
        rows = self.execute("SELECT seq, item FROM bench_effects WHERE idempotency_key=%s ORDER BY seq LIMIT 1", (key,))
        return {"reservation": rows[0][0], "item": rows[0][1]} if rows else None

    def asked_person(self, thread_id: str, calls: int) -> None:
        self.execute("INSERT INTO bench_people VALUES (%s, %s, %s)", (self.run_id, thread_id, calls))

    def error(self, thread_id: str, detail: str) -> None:
        self.execute("INSERT INTO bench_errors VALUES (%s, %s, %s)", (self.run_id, thread_id, detail[:500]))


# --- the worker process ----------------------------------------------------------------------------------


def worker_responder(messages: list[Any]) -> Any:
    """Turn k of a thread: one write (reserve) and one read (lookup), then a text answer."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from gatedloop.graph.scripted import call, reply

    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    turn = len(humans)
    if any(isinstance(m, ToolMessage) for m in messages[humans[-1] + 1 :]):
        return reply(f"turn {turn} done")
    item = str(messages[humans[-1]].content).split("reserve ", 1)[1]
    return reply(
        calls=[
            call("reserve", {"item": item}, f"c{turn}_w"),
            call("lookup", {"item": item}, f"c{turn}_r"),
        ]
    )


def worker_graph(saver: Any, shared: Shared, phase_file: Path) -> Any:
    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel
    from gatedloop.tools import ToolPolicy

    def mark(phase: str) -> None:
        phase_file.write_text(phase)

    @tool
    def reserve(item: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Reserve an item (a write; its effect is a row in bench_effects)."""
        mark("write:before_effect")
        time.sleep(WRITE_S / 2)
        seq = shared.add_effect(idempotency_key, item.rsplit("/", 1)[0], item)
        mark("write:after_effect")
        time.sleep(WRITE_S / 2)
        mark("idle")
        return {"reservation": seq, "item": item}

    @tool
    def lookup(item: str) -> dict[str, Any]:
        """Look an item up (a read)."""
        return {"item": item, "available": True}

    policies = {
        "reserve": ToolPolicy(effect="write", approval="never", reconcile=lambda args, key: shared.find_effect(key)),
        "lookup": ToolPolicy(effect="read", approval="never"),
    }
    model = ScriptedChatModel(responder=worker_responder)
    return build_graph(model, [reserve, lookup], policies=policies, checkpointer=saver)


def advance(graph: Any, shared: Shared, thread_id: str, turns: int) -> int:
    """Move one thread on by one invoke (the caller holds its lease); returns turns completed by it."""
    from langchain_core.messages import HumanMessage
    from langgraph.types import Command

    cfg = {"configurable": {"thread_id": thread_id}}
    snapshot = graph.get_state(cfg)
    payload: Any
    if snapshot.interrupts:
        request = snapshot.interrupts[0].value
        if request.get("kind") != "unknown_outcome":
            raise RuntimeError(f"unexpected question: {request}")
        shared.asked_person(thread_id, len(request["calls"]))
        decisions = []
        for pending in request["calls"]:
            found = shared.find_effect(pending["idempotency_key"])
            decisions.append({"type": "done", "result": found} if found else {"type": "not_done"})
        payload = Command(resume={snapshot.interrupts[0].id: {"decisions": decisions, "reviewer": "bench"}})
    elif snapshot.next:
        payload = None  # a run cut short by a kill: continue from its last checkpoint
    else:
        values = snapshot.values or {}
        done = sum(isinstance(m, HumanMessage) for m in values.get("messages", []))
        if done and values.get("status") != "completed":
            shared.error(thread_id, f"turn {done} ended {values.get('status')}: {values.get('stop_detail')}")
        if done >= turns:
            shared.mark_done(thread_id)
            return 0
        payload = {"messages": [("user", f"turn {done + 1}: reserve {thread_id}/{done + 1}")]}
    out = graph.invoke(payload, cfg, durability="sync")
    return int("__interrupt__" not in out and out.get("status") == "completed")


def worker_main(url: str, run_id: str, turns: int, phase_dir: str) -> int:
    from gatedloop.checkpoints.lease import ThreadBusy
    from gatedloop.checkpoints.postgres import open_postgres

    shared = Shared(url, run_id)
    phase_file = Path(phase_dir, str(os.getpid()))
    phase_file.write_text("idle")
    rng = random.Random(os.getpid())
    with open_postgres(url, max_size=4) as saver:
        graph = worker_graph(saver, shared, phase_file)
        while True:
            todo = shared.undone()
            if not todo:
                return 0
            moved = False
            for thread_id in rng.sample(todo, min(8, len(todo))):
                try:
                    with saver.lease(thread_id):
                        advance(graph, shared, thread_id, turns)
                        moved = True
                except ThreadBusy:
                    continue
            if not moved:
                time.sleep(0.02)


# --- the coordinator ------------------------------------------------------------------------------------


def spawn(url: str, run_id: str, turns: int, phase_dir: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.workers", "worker", "--url", url, "--run", run_id, "--turns", str(turns)]
    return subprocess.Popen([*cmd, "--phase-dir", phase_dir], cwd=ROOT, stdout=subprocess.DEVNULL)


def phase_of(phase_dir: str, pid: int) -> str:
    try:
        return Path(phase_dir, str(pid)).read_text()
    except OSError:
        return "starting"


def run(
    url: str,
    workers: int,
    threads: int,
    turns: int,
    kills: int,
    seed: int,
    timeout_s: float,
    kill_gap_s: tuple[float, float] = (0.5, 2.0),
) -> dict[str, Any]:
    """One run: `workers` processes on `threads` threads of `turns` turns, with `kills` SIGKILLs (the first at the
    first write seen after 1.5-3 s, the next `kill_gap_s` apart); checked after."""
    run_id = f"w{uuid.uuid4().hex[:8]}"
    thread_ids = [f"{run_id}-{i:04d}" for i in range(threads)]
    shared = Shared(url, run_id)
    shared.setup(thread_ids)
    phase_dir = tempfile.mkdtemp(prefix="gatedloop-workers-")
    rng = random.Random(seed)
    procs = [spawn(url, run_id, turns, phase_dir) for _ in range(workers)]
    landed: Counter[str] = Counter()
    started = time.perf_counter()
    kills_left, next_kill = kills, started + rng.uniform(1.5, 3.0)
    try:
        while True:
            left = len(shared.undone())
            if left == 0 and all(p.poll() is not None for p in procs):
                break
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"run {run_id}: {left} threads unfinished after {timeout_s:.0f}s")
            for proc in procs:
                if proc.poll() is not None and proc.returncode != 0 and proc.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"worker {proc.pid} exited {proc.returncode}")
            if kills_left and left and time.perf_counter() >= next_kill:
                phases = {p.pid: phase_of(phase_dir, p.pid) for p in procs if p.poll() is None}
                writing = [p for p in procs if phases.get(p.pid, "").startswith("write")]
                running = [p for p in procs if phases.get(p.pid, "starting") != "starting"]
                if writing or (running and time.perf_counter() >= next_kill + 10.0):
                    victim = rng.choice(writing or running)
                    landed[phases[victim.pid]] += 1
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    procs[procs.index(victim)] = spawn(url, run_id, turns, phase_dir)
                    kills_left -= 1
                    next_kill = time.perf_counter() + rng.uniform(*kill_gap_s)
                    continue
            time.sleep(0.005 if kills_left else 0.05)
        wall = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        "run_id": run_id,
        "workers": workers,
        "threads": threads,
        "turns": threads * turns,
        "kills": kills,
        "wall_s": round(wall, 2),
        "turns_per_s": round(threads * turns / wall, 2),
        "kills_landed": dict(landed),
        **check(url, shared, thread_ids, turns),
    }


def check(url: str, shared: Shared, thread_ids: list[str], turns: int) -> dict[str, Any]:
    """The invariants, from Postgres alone: effects, answers, statuses, ledger, audit, people asked."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from gatedloop.checkpoints.ledger import idempotency_key
    from gatedloop.checkpoints.postgres import open_postgres

    run_id = shared.run_id
    effects = Counter(
        k for (k,) in shared.execute("SELECT idempotency_key FROM bench_effects WHERE run_id=%s", (run_id,))
    )
    expected = [idempotency_key(t, f"c{k}_w") for t in thread_ids for k in range(1, turns + 1)]
    unanswered = incomplete = 0
    with open_postgres(url, max_size=2) as saver:
        graph = worker_graph(saver, shared, Path(os.devnull))
        for thread_id in thread_ids:
            state = graph.get_state({"configurable": {"thread_id": thread_id}})
            messages = state.values.get("messages", [])
            answers = Counter(m.tool_call_id for m in messages if isinstance(m, ToolMessage))
            calls = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
            unanswered += sum(answers[c] != 1 for c in calls) + sum(n > 1 for n in answers.values())
            humans = sum(isinstance(m, HumanMessage) for m in messages)
            incomplete += int(humans != turns or state.values.get("status") != "completed" or bool(state.next))
        prefix = f"{run_id}-%"
        ledger = Counter(
            s for (s,) in shared.execute("SELECT state FROM gatedloop_ledger WHERE thread_id LIKE %s", (prefix,))
        )
        events = Counter(
            e if not e.startswith("rerun_") else "rerun"
            for (e,) in shared.execute("SELECT event FROM gatedloop_audit WHERE thread_id LIKE %s", (prefix,))
            if e in ("reconciled", "marked done") or e.startswith("rerun_")
        )
    people = shared.execute("SELECT COALESCE(SUM(calls), 0) FROM bench_people WHERE run_id=%s", (run_id,))[0][0]
    errors = [d for (d,) in shared.execute("SELECT detail FROM bench_errors WHERE run_id=%s", (run_id,))]
    return {
        "double_effects": sum(1 for k in expected if effects[k] > 1),
        "missing_effects": sum(1 for k in expected if effects[k] == 0),
        "unanswered_calls": unanswered,
        "threads_incomplete": incomplete,
        "writes_sent_to_a_person": int(people),
        "ledger_states": dict(ledger),
        "unknown_writes_settled": {"reconciled_as_done": events["reconciled"], "run_again": events["rerun"]},
        "errors": errors[:5],
        "error_count": len(errors),
    }


def ok(result: dict[str, Any]) -> bool:
    return (
        result["double_effects"] == 0
        and result["missing_effects"] == 0
        and result["unanswered_calls"] == 0
        and result["threads_incomplete"] == 0
        and result["writes_sent_to_a_person"] == 0
        and result["error_count"] == 0
        and set(result["ledger_states"]) <= {"done"}
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        parser = argparse.ArgumentParser(prog="python -m bench.workers worker")
        for name in ("--url", "--run", "--phase-dir"):
            parser.add_argument(name, required=True)
        parser.add_argument("--turns", type=int, required=True)
        args = parser.parse_args(argv[1:])
        return worker_main(args.url, args.run, args.turns, args.phase_dir)
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get(URL_ENV))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--scaling", default="1,2,4", help="worker counts for the no-kill throughput runs ('' = none)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="CI size: 3 workers, 32 threads, 3 kills, no scaling")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error(f"no database: pass --url or set {URL_ENV} (.ci/start_postgres.sh prints it)")
    kill_gap_s = (0.5, 2.0)
    if args.quick:  # kills close together, and enough work that they land before it is done on a fast machine
        args.workers, args.threads, args.kills, args.scaling = 3, 32, 3, ""
        kill_gap_s = (0.1, 0.4)
    summary: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    log(f"{args.workers} workers, {args.threads} threads x {args.turns} turns, {args.kills} kills")
    summary["with_kills"] = run(
        args.url, args.workers, args.threads, args.turns, args.kills, args.seed, args.timeout_s, kill_gap_s
    )
    log(json.dumps(summary["with_kills"]))
    summary["scaling"] = []
    for count in [int(n) for n in args.scaling.split(",") if n.strip()]:
        result = run(args.url, count, args.threads, args.turns, 0, args.seed, args.timeout_s)
        log(f"{count} worker(s), no kills: {result['turns_per_s']} turns/s, {result['wall_s']} s")
        summary["scaling"].append(result)
    summary["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    summary["ok"] = ok(summary["with_kills"]) and all(ok(r) for r in summary["scaling"])
    text = json.dumps(summary)
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    print(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
