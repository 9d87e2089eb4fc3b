"""Throughput under Aegra (issue 31): approval turns per second with one and with two Aegra server processes.

    .venv/bin/python -m bench.aegra_throughput [--threads 200] [--model-wait 0.2] [--processes 1 2] [--anchor]
        [--workers 3] [--jobs-per-worker 10] [--warmup 2] [--via stream|wait] [--keep DIR]

Needs what tests/test_aegra.py needs: `GATEDLOOP_AEGRA` (.ci/aegra_venv.sh), `GATEDLOOP_TEST_PG_URL`
(.ci/start_postgres.sh), `GATEDLOOP_TEST_REDIS_URL` (.ci/start_redis.sh).

For each process count N of `--processes`: a fresh database, N Aegra server processes of tests/support/aegra_app/
(graph `throughput`: the payments graph of tests/support/aegra_payments.py whose scripted model waits `--model-wait`
seconds per call, awaited as a provider's HTTP call would be; the servers get it as `AEGRA_TEST_MODEL_WAIT`) on one
Postgres and one Redis queue. Each process runs `WORKER_COUNT=--workers` worker loops of `N_JOBS_PER_WORKER=
--jobs-per-worker` runs (Aegra's defaults, 3 x 10: 30 runs at once per process, so with a 200 ms model one process
is not held back by its slots), with Aegra's default lease (30 s, heartbeat 10 s, reaper 15 s: nothing is killed
here, and a short lease would only add heartbeats).

Then `--threads` threads, all at once (asyncio, langgraph-sdk's async client, one HTTP client per process with no
connection limit, so the client queues nothing): a finance user (bo: Aegra 0.11 lets only a thread's creator answer
on it, and bo's role and `self_approval` let him approve his own request) creates the thread and starts a run
(`runs.wait`: the model waits, proposes one gated `pay` to the thread's own payee, and the run pauses for approval),
then approves it (`runs.wait` with the resume: the payment runs, the model waits again and answers). Thread i's
create and first run go to process i mod N, its approval to process (i+1) mod N; any worker of any process may run
either (the runs go on the one queue). `--warmup` threads per process run the same way first, untimed.

A turn = one run, so 2 per thread (the request that pauses and the approval that finishes it). Turns/s = 2 x
threads / (first request to last completion). Also printed: p50/p95 of a run's `runs.wait` time (queueing
included), the machine's CPU busy share over the batch (/proc/stat), CPU seconds of each server, Postgres, Redis,
this client and the rest (the machine's busy time less those: other work, processes that came and went), per run
the servers' CPU on their event-loop thread and in their other threads (/proc/<pid>/task) and the database's commits
and inserted rows (pg_stat_database), and which process ran the model calls and the payments. Checked: every
thread `idle` with the run's status `completed` and the model's answer last, exactly one payment per payee (the
effects file), two model calls per thread. Prints one line per batch (a count may be repeated, `--processes 1 2 1 2`,
each on a fresh database), the ratio of each count's median turns/s to the first count's, and exits 1 on any
failure.

`--anchor` (issue 52) runs each batch twice, once for gatedloop and once for the anchor: graph `anchor` of the same
server config, LangChain's `create_agent` with `HumanInTheLoopMiddleware` pausing on `pay`, the same waiting scripted
model, the same payments (tests/support/aegra_payments.anchor_graph), answered with the same `{"decisions":
[{"type": "approve"}]}`. Same processes, Postgres, Redis, client and checks (the anchor's answer is its last message,
it has no `status`); each on a fresh database, the order alternating (gatedloop first, then the anchor first, ...).
Printed at the end: for each process count, gatedloop's median turns/s over the anchor's, and each pair's ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from aegra_servers import AEGRA_ENV, REDIS_ENV, TOKENS, Deployment, deployment, live_members  # noqa: E402
from sample_app import Effects  # noqa: E402

CONFIG = TESTS / "aegra_app" / "bench.json"
"""Both systems' graphs in one server config: every batch starts the same servers, the client picks the graph."""
GRAPHS = {"gatedloop": "throughput", "anchor": "anchor"}
ANSWER = "done: c1=success"
"""The scripted model's last message once the approved payment ran, in either system."""
AEGRA_LEASE = {"LEASE_DURATION_SECONDS": "30", "HEARTBEAT_INTERVAL_SECONDS": "10", "REAPER_INTERVAL_SECONDS": "15"}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Batch:
    system: str
    processes: int
    threads: int
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    payees: list[str] = field(default_factory=list)
    busy: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    spread: str = ""
    load: tuple[float, float] = (0.0, 0.0)
    per_run: dict[str, float] = field(default_factory=dict)

    @property
    def turns_per_s(self) -> float:
        return 2 * self.threads / self.wall_s if self.wall_s else 0.0


def client(server: Any) -> Any:
    import httpx
    from langgraph_sdk.client import LangGraphClient

    http = httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {TOKENS['bo']}"},
        timeout=httpx.Timeout(connect=30, read=600, write=60, pool=600),
        # no pool limit (the client queues nothing); an idle connection is dropped after 1 s, before uvicorn's 5 s
        # keep-alive timeout closes it under a request (a ReadError otherwise)
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=1.0),
    )
    return LangGraphClient(http)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot (/proc/stat: idle and iowait are not busy)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def ticks_by_process() -> dict[int, tuple[str, int]]:
    """pid -> (command name, utime + stime jiffies) for every process (/proc/<pid>/stat)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rpartition(")")[2].split()
        found[int(stat.parent.name)] = (name, int(fields[11]) + int(fields[12]))
    return found


def server_threads(aegra: Deployment) -> collections.Counter[str]:
    """Jiffies of the servers' event-loop threads (each process's first thread: uvicorn runs the loop there) and of
    their other threads (`asyncio.to_thread`'s executor, connection pools' workers; a thread that ended is missed)."""
    spent: collections.Counter[str] = collections.Counter()
    for server in aegra.servers:
        pid = server.process.pid if server.process else None
        for stat in Path(f"/proc/{pid}/task").glob("*/stat") if pid else ():
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            part = "event loop" if int(stat.parent.name) == pid else "other threads"
            spent[part] += int(fields[11]) + int(fields[12])
    return spent


def database_counts(url: str) -> collections.Counter[str]:
    """Transactions committed and rows inserted in the batch's database so far (pg_stat_database: a backend reports
    its counts at most a second or so after its transactions, so this waits that long first)."""
    import psycopg

    time.sleep(2)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return collections.Counter({"commits": row[0], "rows inserted": row[1]})


def cpu_split(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], aegra: Deployment) -> dict:
    """CPU seconds spent between two snapshots by each server's process group, postgres, redis and this client (a
    process that ended in between is missed; one that started counts from zero)."""
    groups = {pid: s.name for s in aegra.servers if s.process for pid in live_members(s.process.pid)}
    spent: dict[str, float] = collections.Counter()
    for pid, (name, ticks) in after.items():
        used = (ticks - before.get(pid, (name, 0))[1]) / TICK
        if pid in groups:
            key = f"server {groups[pid]}"
        elif name.startswith("postgres"):
            key = "postgres"
        elif name.startswith("redis"):
            key = "redis"
        elif pid == os.getpid():
            key = "client"
        else:
            continue  # in "rest": the machine's busy time less the above (other work, processes that came and went)
        spent[key] += used
    return dict(spent)


async def run_once(sdk: Any, thread_id: str, graph: str, via: str, **request: Any) -> Any:
    """One run to its end: `runs.stream` (the last `values` event; the end is pushed through Redis) or `runs.wait`
    (Aegra 0.11 answers it from a poll of the run's done-key every 2 s)."""
    if via == "wait":
        return await sdk.runs.wait(thread_id, graph, **request)
    last = None
    async for part in sdk.runs.stream(thread_id, graph, stream_mode="values", **request):
        if part.event == "error":
            raise AssertionError(f"run failed: {part.data}")
        if part.event == "values":
            last = part.data
    return last


def unfinished(system: str, state: Any) -> str | None:
    """Why `state` (the approval run's last values) is not a finished turn, or None: the model's answer after the
    payment is the last message (gatedloop also says `completed`; the anchor has no status)."""
    if not isinstance(state, dict):
        return f"ended {state!r}"
    if system == "gatedloop" and state.get("status") != "completed":
        return f"ended {state.get('status')}"
    last = (state.get("messages") or [{}])[-1]
    if last.get("type") != "ai" or last.get("content") != ANSWER:
        return f"ended on {last.get('type')} {str(last.get('content'))[:80]!r}"
    return None


async def one_thread(sdks: list[Any], system: str, index: int, payee: str, via: str, latencies: list[float]) -> None:
    first, second = sdks[index % len(sdks)], sdks[(index + 1) % len(sdks)]
    graph = GRAPHS[system]
    stage, thread_id = "threads.create", "?"
    try:
        thread_id = (await first.threads.create())["thread_id"]
        stage, started = "the first run", time.monotonic()
        message = {"role": "user", "content": f"pay 1 to {payee} as c1"}
        await run_once(first, thread_id, graph, via, input={"messages": [message]})
        stage, paused = "the approval run", time.monotonic()
        out = await run_once(second, thread_id, graph, via, command={"resume": {"decisions": [{"type": "approve"}]}})
        latencies += [paused - started, time.monotonic() - paused]
        if why := unfinished(system, out):
            raise AssertionError(why)
        stage = "threads.get"
        state = await first.threads.get(thread_id)
        if state["status"] != "idle":
            raise AssertionError(f"the thread is {state['status']} after the approval")
    except Exception as exc:
        raise AssertionError(f"thread {thread_id}, {stage}: {type(exc).__name__}: {exc}") from exc


async def drive(aegra: Deployment, threads: int, warmup: int, via: str, batch: Batch) -> None:
    sdks = [client(server) for server in aegra.servers]
    tag = uuid.uuid4().hex[:6]

    async def guarded(index: int, payee: str, latencies: list[float]) -> None:
        batch.payees.append(payee)
        try:
            await one_thread(sdks, batch.system, index, payee, via, latencies)
        except Exception as exc:  # report every failure, keep the others running
            batch.failures.append(f"{payee}: {exc}"[:400])

    try:
        for index in range(warmup * len(sdks)):
            await guarded(index, f"warm-{tag}-{index}", [])
        before_db, before_threads = database_counts(aegra.database_url), server_threads(aegra)
        before_ticks, before_cpu = machine_ticks(), ticks_by_process()
        load_at_start = os.getloadavg()[0]
        started = time.monotonic()
        await asyncio.gather(*(guarded(i, f"tp-{tag}-{i}", batch.latencies) for i in range(threads)))
        batch.wall_s = time.monotonic() - started
        batch.load = (load_at_start, os.getloadavg()[0])
        after_ticks, after_cpu = machine_ticks(), ticks_by_process()
        busy = after_ticks[0] - before_ticks[0]
        batch.busy = busy / max(1, after_ticks[1] - before_ticks[1])
        batch.cpu_s = cpu_split(before_cpu, after_cpu, aegra)
        batch.cpu_s["rest"] = busy / TICK - sum(batch.cpu_s.values())
        runs = 2 * threads
        for part, ticks in (server_threads(aegra) - before_threads).items():
            batch.per_run[f"{part} ms"] = 1000 * ticks / TICK / runs
        for what, count in (database_counts(aegra.database_url) - before_db).items():
            batch.per_run[what] = count / runs
    finally:
        for sdk in sdks:
            await sdk.http.client.aclose()


def check(aegra: Deployment, batch: Batch) -> None:
    """Exactly one payment per payee; two model calls per thread; where they ran."""
    pays = collections.Counter(args["to"] for _, args, _ in Effects(aegra.effects).rows())
    for payee in batch.payees:
        if pays[payee] != 1:
            batch.failures.append(f"{payee}: {pays[payee]} payments")
    calls_file = aegra.control / "model-calls"
    calls = collections.Counter(calls_file.read_text().split()) if calls_file.exists() else collections.Counter()
    if sum(calls.values()) != 2 * len(batch.payees):
        batch.failures.append(f"{sum(calls.values())} model calls for {len(batch.payees)} threads (2 each expected)")
    names = {str(pid): s.name for s in aegra.servers if s.process for pid in live_members(s.process.pid)}
    by_server = collections.Counter(names.get(pid, "?") for pid, n in calls.items() for _ in range(n))
    paid_by: collections.Counter[str] = collections.Counter()
    for seq_pid in _payment_pids(aegra.effects):
        paid_by[names.get(str(seq_pid), "?")] += 1
    batch.spread = (
        "model calls "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_server.items()))
        + "; payments "
        + ", ".join(f"{k} {v}" for k, v in sorted(paid_by.items()))
    )


def _payment_pids(path: Path) -> list[int]:
    import sqlite3

    with sqlite3.connect(str(path), timeout=30) as conn:
        return [int(row[0]) for row in conn.execute("SELECT pid FROM effects")]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def line(batch: Batch) -> str:
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(batch.cpu_s.items()))
    p50, p95 = statistics.median(batch.latencies or [float("nan")]), percentile(batch.latencies, 0.95)
    run = batch.per_run
    return (
        f"{batch.system}, {batch.processes} process(es): {2 * batch.threads} turns ({batch.threads} threads) in "
        f"{batch.wall_s:.1f} s = {batch.turns_per_s:.1f} turns/s; run p50 {p50:.2f} s, p95 {p95:.2f} s; "
        f"{len(batch.failures)} failures; CPU busy {100 * batch.busy:.0f}% of {os.cpu_count()} cores, load average "
        f"{batch.load[0]:.1f} -> {batch.load[1]:.1f} (CPU s: {cpu}); per run: server CPU "
        f"{run.get('event loop ms', 0):.1f} ms on the event loop + {run.get('other threads ms', 0):.1f} ms in other "
        f"threads, Postgres {run.get('commits', 0):.1f} commits, {run.get('rows inserted', 0):.1f} rows inserted; "
        f"{batch.spread}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--model-wait", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=3, help="WORKER_COUNT per process")
    parser.add_argument("--jobs-per-worker", type=int, default=10, help="N_JOBS_PER_WORKER")
    parser.add_argument("--warmup", type=int, default=2, help="untimed threads per process before the batch")
    parser.add_argument("--via", choices=("stream", "wait"), default="stream", help="how a run is followed")
    parser.add_argument("--keep", type=Path, help="keep the servers' logs and the effects files here")
    parser.add_argument("--anchor", action="store_true", help="each batch also for the anchor, alternating")
    args = parser.parse_args(argv)
    missing = [name for name in (AEGRA_ENV, REDIS_ENV, "GATEDLOOP_TEST_PG_URL") if not os.environ.get(name)]
    if missing:
        print(f"set {', '.join(missing)} (see this module's docstring)", file=sys.stderr)
        return 2

    env = {
        "AEGRA_TEST_MODEL_WAIT": str(args.model_wait),
        "WORKER_COUNT": str(args.workers),
        "N_JOBS_PER_WORKER": str(args.jobs_per_worker),
        "LOG_LEVEL": "WARNING",
        **AEGRA_LEASE,
    }
    print(
        f"aegra throughput: {args.threads} threads, model wait {args.model_wait} s, WORKER_COUNT={args.workers} "
        f"N_JOBS_PER_WORKER={args.jobs_per_worker} per process, runs followed by runs.{args.via}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="aegra-throughput-"))
    workdir.mkdir(parents=True, exist_ok=True)
    batches: list[Batch] = []
    try:
        for number, (system, count) in enumerate(schedule(args.processes, args.anchor), start=1):
            batch = Batch(system, count, args.threads)
            with deployment(
                os.environ[AEGRA_ENV],
                os.environ["GATEDLOOP_TEST_PG_URL"],
                os.environ[REDIS_ENV],
                workdir / f"batch-{number}-{system}-processes-{count}",
                count=count,
                env=env,
                config=CONFIG,
            ) as aegra:
                asyncio.run(drive(aegra, args.threads, args.warmup, args.via, batch))
                check(aegra, batch)
            batches.append(batch)
            print(line(batch), flush=True)
            for failure in batch.failures[:20]:
                print(f"  failure: {failure}", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    for text in process_ratios(batches, args.processes[0]) + anchor_ratios(batches):
        print(text)
    return 1 if any(b.failures for b in batches) else 0


def schedule(processes: list[int], anchor: bool) -> list[tuple[str, int]]:
    """(system, process count) of each batch: gatedloop alone, or each count for both systems, the first one
    alternating so that a drift of the machine's load favours neither."""
    if not anchor:
        return [("gatedloop", count) for count in processes]
    pairs = [(("gatedloop", "anchor") if i % 2 == 0 else ("anchor", "gatedloop"), n) for i, n in enumerate(processes)]
    return [(system, count) for order, count in pairs for system in order]


def process_ratios(batches: list[Batch], base: int) -> list[str]:
    """Each system's median turns/s at each process count over its median at `base` processes."""
    rates: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for batch in batches:
        rates[batch.system, batch.processes].append(batch.turns_per_s)
    return [
        f"{system}, ratio {count} process(es) / {base}: {statistics.median(found) / statistics.median(baseline):.2f}x "
        f"turns/s (median of {len(found)} and {len(baseline)} batch(es))"
        for (system, count), found in rates.items()
        if count != base and (baseline := rates.get((system, base))) and statistics.median(baseline)
    ]


def anchor_ratios(batches: list[Batch]) -> list[str]:
    """gatedloop's turns/s over the anchor's at each process count: of the medians, and of each pair of batches
    (the batches for one entry of `--processes`, run one after the other)."""
    by_count: dict[int, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for batch in batches:
        by_count[batch.processes][batch.system].append(batch.turns_per_s)
    found = []
    for count, rates in by_count.items():
        ours, theirs = rates.get("gatedloop", []), rates.get("anchor", [])
        if not ours or not theirs or not statistics.median(theirs):
            continue
        pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs, strict=False) if b)
        found.append(
            f"gatedloop / anchor, {count} process(es): {statistics.median(ours) / statistics.median(theirs):.2f}x "
            f"turns/s (medians {statistics.median(ours):.1f} and {statistics.median(theirs):.1f} of {len(ours)} "
            f"batch(es) each; pairs {pairs})"
        )
    return found


if __name__ == "__main__":
    sys.exit(main())
