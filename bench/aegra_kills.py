"""Kills at scale under Aegra: tests/test_aegra.py's killed worker, N times, and one summary line.

    .venv/bin/python -m bench.aegra_kills [--kills 20] [--seed 1] [--keep DIR]

Needs what tests/test_aegra.py needs: `GATEDLOOP_AEGRA` (.ci/aegra_venv.sh), `GATEDLOOP_TEST_PG_URL`
(.ci/start_postgres.sh), `GATEDLOOP_TEST_REDIS_URL` (.ci/start_redis.sh). Two Aegra server processes of
tests/support/aegra_app/ run on a fresh database and one Redis queue (lease 6 s, heartbeat 2 s, reaper 1 s).

Each kill: a finance user asks for a payment (`pay`, reconciled by its key, or `wire`, which nobody can reconcile),
approves it; the server process running the write is SIGKILLed right before or
right after the effect, in a seeded order; the reaper hands the run to the other process; a `wire` whose outcome
is unknown is settled as a person would (done if the effect happened, not done otherwise); then the payments to
that payee are counted (the effects file) and the killed process is started again. Prints each kill, the summary
line (doubles, kills that ended with one payment, how many were reconciled or asked a person, the time from the
kill to the settled thread) and exits 1 if any payee was paid twice or not at all.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from aegra_servers import AEGRA_ENV, REDIS_ENV, TOKENS, Deployment, deployment, wait_until  # noqa: E402
from sample_app import Effects  # noqa: E402

GRAPH = "payments"


@dataclass(frozen=True)
class Kill:
    tool: str
    when: str
    payments: int
    asked_a_person: bool
    recovered_s: float
    victim: str


def client(server: Any) -> Any:
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=server.url, headers={"Authorization": f"Bearer {TOKENS['bo']}"}, timeout=120)


def paid(aegra: Deployment, to: str) -> int:
    return sum(1 for _, args, _ in Effects(aegra.effects).rows() if args["to"] == to)


def one_kill(aegra: Deployment, tool: str, when: str) -> Kill:
    to = f"hold-{when}-{uuid.uuid4().hex[:8]}"
    first = client(aegra[0])
    thread_id = first.threads.create()["thread_id"]
    first.runs.wait(thread_id, GRAPH, input={"messages": [{"role": "user", "content": f"{tool} 70 to {to} as k1"}]})
    run = first.runs.create(thread_id, GRAPH, command={"resume": {"decisions": [{"type": "approve"}]}})
    marker = aegra.control / f"{to}.started"
    wait_until(lambda: marker.exists() and marker.read_text(), 60, "the write to start")
    pid = int(marker.read_text())
    [victim] = [s for s in aegra.servers if s.alive() and s.server_pid() == pid]
    survivor = next(s for s in aegra.servers if s is not victim)
    killed_at = time.monotonic()
    victim.kill_hard()

    sdk = client(survivor)
    wait_until(
        lambda: sdk.runs.get(thread_id, run["run_id"])["status"] not in ("pending", "running"),
        180,
        "the run to finish on the surviving process",
        interval_s=0.25,
    )
    interrupts = sdk.threads.get_state(thread_id).get("interrupts") or []
    asked = bool(interrupts) and interrupts[0]["value"].get("kind") == "unknown_outcome"
    if asked:
        settle = {"type": "done", "result": {"confirmed": True}} if paid(aegra, to) else {"type": "not_done"}
        sdk.runs.wait(thread_id, GRAPH, command={"resume": {"decisions": [settle]}})
    recovered_s = time.monotonic() - killed_at
    status = sdk.threads.get(thread_id)["status"]
    if status != "idle":
        raise AssertionError(f"thread {thread_id} is {status} after the kill")
    victim.start()
    return Kill(tool, when, paid(aegra, to), asked, recovered_s, victim.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the servers' logs and the effects file here")
    args = parser.parse_args(argv)
    missing = [name for name in (AEGRA_ENV, REDIS_ENV, "GATEDLOOP_TEST_PG_URL") if not os.environ.get(name)]
    if missing:
        print(f"set {', '.join(missing)} (see this module's docstring)", file=sys.stderr)
        return 2

    plan = [(tool, when) for tool in ("pay", "wire") for when in ("before", "after")]
    plan = (plan * (args.kills // len(plan) + 1))[: args.kills]
    random.Random(args.seed).shuffle(plan)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="aegra-kills-"))
    workdir.mkdir(parents=True, exist_ok=True)
    kills: list[Kill] = []
    started = time.monotonic()
    try:
        with deployment(
            os.environ[AEGRA_ENV], os.environ["GATEDLOOP_TEST_PG_URL"], os.environ[REDIS_ENV], workdir
        ) as aegra:
            for number, (tool, when) in enumerate(plan, start=1):
                kill = one_kill(aegra, tool, when)
                kills.append(kill)
                print(
                    f"kill {number:2d}: {tool} {when:6s} the effect, process {kill.victim} killed: "
                    f"{kill.payments} payment(s), {'asked a person' if kill.asked_a_person else 'reconciled'}, "
                    f"settled {kill.recovered_s:.1f} s after the kill",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    doubles = sum(1 for k in kills if k.payments > 1)
    lost = sum(1 for k in kills if k.payments == 0)
    times = sorted(k.recovered_s for k in kills)
    print(
        f"aegra kills: {len(kills)} kills, {doubles} doubles, {lost} lost, "
        f"{sum(1 for k in kills if k.payments == 1)} paid once "
        f"({sum(1 for k in kills if not k.asked_a_person)} reconciled, {sum(1 for k in kills if k.asked_a_person)} "
        f"asked a person); kill to settled thread: median {statistics.median(times):.1f} s, max {times[-1]:.1f} s; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    return 1 if doubles or lost else 0


if __name__ == "__main__":
    sys.exit(main())
