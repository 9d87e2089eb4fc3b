"""A served run's CPU in process, without the server: what each graph costs on top of the server's own work.

    .venv/bin/python -m bench.served_cpu [--threads 100] [--reps 3] [--systems floor anchor gatedloop gatedloop-memory]

The graphs `bench.aegra_throughput` serves, run the way Aegra runs them, minus Aegra: `astream` on LangGraph's
`AsyncPostgresSaver` over an async pool (GATEDLOOP_TEST_PG_URL), the stream modes Aegra always asks for (`debug`,
`updates`, `values`), `--threads` threads at once (30 running), each a request that pauses and an approval that
runs the payment. Systems:

- `floor`: `bench/floor.py`'s graph, gatedloop's state, routing and supersteps with nodes that do nothing;
- `anchor`: `create_agent` with `HumanInTheLoopMiddleware` (tests/support/aegra_payments.anchor_graph);
- `gatedloop`: the served payments graph (tests/support/aegra_payments.served_graph), its ledger in the same
  Postgres, each statement awaited on the saver's pool, as under Aegra;
- `gatedloop-memory`: the same graph with its ledger in an in-memory SQLite on the loop: what is left of the gate's
  cost without its Postgres statements.

Each batch runs in a child process, on new threads in the same database; the systems alternate batch by batch.
Prints, per system, the median CPU per run (a request or an approval; all threads of the process, the Postgres
server's own CPU not counted) and runs/s, then one JSON object on its last line. On a served run, add the server's
own work per run (Aegra's: about 45-50 ms of its CPU here, docs/performance.md).
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
import resource
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"
SYSTEMS = ("floor", "anchor", "gatedloop", "gatedloop-memory")
MODES = ["debug", "updates", "values"]
APPROVE = {"decisions": [{"type": "approve"}]}
USER = {"identity": "bo", "roles": ["finance"]}  # a finance user who may approve her own request, as the bench's


def _graph(system: str) -> Any:
    if system == "floor":
        from bench.floor import floor_graph

        return floor_graph(None)
    import aegra_payments

    if system == "anchor":
        return aegra_payments.anchor_graph(model_wait_s=0.0)
    if system == "gatedloop-memory":
        from gatedloop.checkpoints.ledger import SqliteLedger
        from gatedloop.checkpoints.ledger_for import LedgerOfTheRun

        in_memory = SqliteLedger(":memory:", on_loop=True)
        LedgerOfTheRun.of = lambda self, saver: in_memory  # type: ignore[method-assign]  # the one thing swapped
    return aegra_payments.served_graph(model_wait_s=0.0, name="throughput")


async def _batch(system: str, threads: int, url: str) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.types import Command
    from psycopg_pool import AsyncConnectionPool

    from bench import thread_cpu

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": psycopg.rows.dict_row}
    async with AsyncConnectionPool(url, kwargs=kwargs, max_size=10, open=False) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        graph = _graph(system).copy(update={"checkpointer": saver})
        running = asyncio.Semaphore(30)

        async def one(n: int) -> None:
            async with running:
                config = {"configurable": {"thread_id": str(uuid.uuid4()), "langgraph_auth_user": USER}}
                ask = {"messages": [("user", f"pay 500 to p{n} as c{n}")]}
                async for _ in graph.astream(ask, config, stream_mode=MODES):
                    pass
                async for _ in graph.astream(Command(resume=APPROVE), config, stream_mode=MODES):
                    pass
                last = (await graph.aget_state(config)).values["messages"][-1]
                if "done" not in str(last.content):
                    raise AssertionError(f"{system}: thread {n} ended with {last.content!r}")

        await asyncio.gather(*(one(-n - 1) for n in range(5)))  # warm: imports, the ledger's tables, the pool
        before, used, started = thread_cpu.snapshot(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(threads)))
        elapsed = time.perf_counter() - started
        after, spent = thread_cpu.snapshot(), resource.getrusage(resource.RUSAGE_SELF)
    runs = 2 * threads
    cpu_s = spent.ru_utime + spent.ru_stime - used.ru_utime - used.ru_stime
    return {
        "system": system,
        "runs": runs,
        "runs_per_s": round(runs / elapsed, 1),
        "cpu_ms_per_run": round(cpu_s / runs * 1000, 2),
        "by_thread_ms_per_run": thread_cpu.split(before, after, runs),
    }


def _child(system: str, threads: int) -> dict[str, Any]:
    """One batch in a fresh process: the graph modules, the effects file and the ledger swap are its own."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "AEGRA_TEST_EFFECTS": f"{folder}/effects.sqlite", "AEGRA_TEST_CONTROL": folder}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
        done = subprocess.run(
            [sys.executable, "-m", "bench.served_cpu", "--batch", system, "--threads", str(threads)],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{system} batch failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--batch", choices=SYSTEMS, help=argparse.SUPPRESS)  # a child's one batch
    args = parser.parse_args(argv)
    url = os.environ.get("GATEDLOOP_TEST_PG_URL")
    if not url:
        parser.error("set GATEDLOOP_TEST_PG_URL to a Postgres database (.ci/start_postgres.sh prints one)")
    if args.batch:
        print(json.dumps(asyncio.run(_batch(args.batch, args.threads, url))))
        return
    batches: dict[str, list[dict[str, Any]]] = {system: [] for system in args.systems}
    for rep in range(args.reps):
        for system in args.systems if rep % 2 == 0 else reversed(args.systems):
            batch = _child(system, args.threads)
            batches[system].append(batch)
            print(f"{system}: {batch['cpu_ms_per_run']} ms CPU per run, {batch['runs_per_s']} runs/s", file=sys.stderr)
    print(f"| system | CPU per run, ms: median of {args.reps} (each batch) | runs/s, median |\n| --- | ---: | ---: |")
    summary = {}
    for system, found in batches.items():
        cpu = [b["cpu_ms_per_run"] for b in found]
        rate = statistics.median(b["runs_per_s"] for b in found)
        summary[system] = {"cpu_ms_per_run": statistics.median(cpu), "runs_per_s": rate, "batches": found}
        print(f"| {system} | {statistics.median(cpu):.1f} ({', '.join(f'{c:.1f}' for c in cpu)}) | {rate:.1f} |")
    print(json.dumps({"threads": args.threads, "reps": args.reps, "load_average": os.getloadavg()[0], **summary}))


if __name__ == "__main__":
    main()
