"""A real child process for crash tests, and the parent side that kills it.

Run as a script (`python tests/support/crash_child.py --db ... --effects ... --thread ...`, with tests/ on
PYTHONPATH), it opens the checkpointer (`--db`: a SQLite file, a Postgres URL, or `env` for the test server's URL;
see `backends.open_checkpointer`), builds the sample app and drives one thread until it reaches a
final status: it starts the thread if no checkpoint exists yet, approves every pending approval, resumes a
thread stopped mid-run with `runs.resume(graph, tid)` (no answer), and answers unknown-outcome requests as
`--unknown` says. It prints one marker per line (flushed) so a parent can SIGKILL it at a chosen moment:

    driver on_loop|awaited   with --on-loop: the saver runs SQLite on the event loop, or awaits Postgres there (before
                             `ready`)
    ready <pid>              graph built, nothing done yet
    step <action>            about to start / approve <n> / answer <decisions> / resume
    write_begin <key>        a write started (the effect is not recorded yet)
    hold_before <key>        waiting on the gate file before recording the effect (--hold before)
    effect <key> <seq>       the effect is committed in effects.sqlite (the ledger does not know yet)
    hold_after <key>         waiting on the gate file after the effect (--hold after)
    hold_ckpt <step>         waiting on the gate file before the checkpoint of a step (--hold ckpt)
    ckpt <n> / ckpt_done <n> a checkpoint is being written / was written
    writes <n> / writes_done <n>  pending writes (task results) are being written / were written
    answer_sent <decision>   about to send one answer (--answer), as --reviewer, and do nothing else
    resume_stored <task>     LangGraph stored an answer (a RESUME write; `null`: a positional answer)
    hold_resume              with --hold resume: the answer is stored and nothing after it will be (the child
                             waits on the gate file; every later checkpoint and ledger write waits too)
    answered <outcome>       the answer's invoke returned: `asked_again` (a request is pending) or the status
    busy                     `ThreadBusy`: another process holds the thread's lease (exit 3)
    waiting <kind>           left for a person (exit 4)
    final <status>           the thread ended (exit 0)

With `--answer DECISION` the child does not drive the thread: it sends that one answer to the pending request
(`none`: no answer, `invoke(None)`) as `--reviewer`, through `graph.invoke` as a client would, and exits. The
answer trials of tests/support/answer_crash.py kill it while it does.

Imported, it offers the parent side: `run_child` (spawn, kill on a marker or after a delay), the seeded
crash trial (`plan_trial`, `run_trial`) and its invariant checks (`inspect_thread`), shared by
tests/test_crash.py and bench/crash_trials.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent
CHILD_TIMEOUT_S = 120.0

EXIT_FINAL, EXIT_BUSY, EXIT_WAITING = 0, 3, 4

_print_lock = threading.Lock()


def mark(*parts: Any) -> None:
    line = " ".join(str(p) for p in parts)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------------------------- child side


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.005)


def _marked_effects(path: str, args: argparse.Namespace) -> Any:
    from sample_app import Effects

    from gatedloop.checkpoints.ledger import idempotency_key

    held = {idempotency_key(args.thread, cid) for cid in args.hold_call} if args.hold_call else None

    class MarkedEffects(Effects):
        """Effects that say when a write starts and when its effect is committed, and can pause there."""

        def add(self, tool: str, args_: dict[str, Any], key: str | None) -> int:
            mark("write_begin", key)
            holding = args.hold != "none" and args.gate and (held is None or key in held)
            if args.delay_before:
                time.sleep(args.delay_before)
            if holding and args.hold == "before":
                mark("hold_before", key)
                _wait_for(args.gate)
            seq = super().add(tool, args_, key)
            mark("effect", key, seq)
            if holding and args.hold == "after":
                mark("hold_after", key)
                _wait_for(args.gate)
            if args.delay_after:
                time.sleep(args.delay_after)
            return seq

    return MarkedEffects(path)


def _mark_checkpoint_writes(saver: Any, args: argparse.Namespace) -> None:
    """Wrap this saver's put/put_writes so a parent can kill the child while checkpoints are written.

    With `--hold ckpt --hold-step N` the checkpoint of step N waits on the gate file before it is written:
    the step's task writes are saved, its checkpoint is not.
    """
    counts = Counter[str]()
    writes_in_flight = [0]
    for name, label in (("put", "ckpt"), ("put_writes", "writes")):
        original = getattr(saver, name)

        def wrapped(*a: Any, _original: Any = original, _label: str = label, **kw: Any) -> Any:
            with _print_lock:
                counts[_label] += 1
                n = counts[_label]
                writes_in_flight[0] += _label == "writes"
            mark(_label, n)
            if _label == "ckpt" and args.hold == "ckpt" and args.gate and a[2].get("step") == args.hold_step:
                # LangGraph saves task writes from a background thread: let those of this step land first,
                # so the kill falls exactly between a step's saved writes and its checkpoint.
                while writes_in_flight[0]:
                    time.sleep(0.005)
                mark("hold_ckpt", args.hold_step)
                _wait_for(args.gate)
            try:
                return _original(*a, **kw)
            finally:
                with _print_lock:
                    writes_in_flight[0] -= _label == "writes"
                mark(f"{_label}_done", n)

        setattr(saver, name, wrapped)


def _mark_async_checkpoint_writes(saver: Any) -> None:
    """`_mark_checkpoint_writes`' markers for an async saver whose `aput`/`aput_writes` do not call the sync ones
    (`open_async_postgres`); no holds."""
    counts = Counter[str]()
    for name, label in (("aput", "ckpt"), ("aput_writes", "writes")):
        original = getattr(saver, name)

        async def wrapped(*a: Any, _original: Any = original, _label: str = label, **kw: Any) -> Any:
            counts[_label] += 1
            n = counts[_label]
            mark(_label, n)
            try:
                return await _original(*a, **kw)
            finally:
                mark(f"{_label}_done", n)

        setattr(saver, name, wrapped)


def _mark_resume_writes(saver: Any, args: argparse.Namespace) -> threading.Event:
    """Say when LangGraph has stored an answer (a put_writes with a RESUME channel), and with `--hold resume`
    stop the process there: once the returned event is set, every other checkpoint write and every ledger write
    waits on the gate file, and once the answer is stored the child prints `hold_resume` and waits too. A kill on
    that marker lands where issue 29's finding 2 did: the answer stored, nothing the node made of it. The event
    is set when the answer's write begins, or earlier by `answer_once` (see there)."""
    from langgraph._internal._constants import NULL_TASK_ID, RESUME

    holding = args.hold == "resume" and bool(args.gate)
    frozen = threading.Event()

    def wait_if_frozen() -> None:
        if holding and frozen.is_set():
            _wait_for(args.gate)

    for name in ("put", "put_writes"):
        original = getattr(saver, name)

        def wrapped(*a: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            resume = _name == "put_writes" and any(channel == RESUME for channel, _ in a[1])
            if not resume:
                wait_if_frozen()
                return _original(*a, **kw)
            if holding:
                frozen.set()
            result = _original(*a, **kw)
            mark("resume_stored", "null" if a[2] == NULL_TASK_ID else "task")
            if holding:
                mark("hold_resume")
                _wait_for(args.gate)
            return result

        setattr(saver, name, wrapped)
    ledger = getattr(saver, "ledger", None)
    begin = getattr(ledger, "_begin", None)
    if holding and begin is not None:  # SQLite: every ledger write transaction starts here

        def held_begin(*a: Any, **kw: Any) -> Any:
            wait_if_frozen()
            return begin(*a, **kw)

        ledger._begin = held_begin
    return frozen


def answer_once(graph: Any, args: argparse.Namespace, frozen: threading.Event) -> int:
    """Send one answer (`--answer`; `none`: `invoke(None)`) to the pending request as `--reviewer`, positional
    or keyed by the interrupt's id (`--answer-form`), and report what came back.

    With `--hold resume`, a positional answer freezes every write but its own from the moment it is sent:
    LangGraph stores it before any node runs, so nothing that follows it can land first (a node that reads it
    runs in this thread while the write is made in another). A keyed answer is stored by the node that reads it,
    after the ledger writes that node makes before its interrupt, so its own write begins the freeze."""
    from langgraph.types import Command

    from gatedloop.graph import runs

    config = runs.config_for(args.thread)
    payload = None
    if args.answer != "none":
        value: Any = {"decisions": [{"type": args.answer}]}
        if args.answer_form == "keyed":
            [pending] = graph.get_state(config).interrupts
            value = {pending.id: value}
        payload = Command(resume=value)
    if args.hold == "resume" and args.answer_form == "positional" and payload is not None:
        frozen.set()
    mark("answer_sent", args.answer)
    out = graph.invoke(payload, config, context=_reviewer(args), durability=args.durability)
    mark("answered", "asked_again" if out.get("__interrupt__") else out.get("status"))
    return EXIT_FINAL


def _reviewer(args: argparse.Namespace) -> Any:
    from gatedloop.tools import CallContext

    name, _, roles = (args.reviewer or "").partition(":")
    return CallContext(user_id=name or None, roles=frozenset(filter(None, roles.split(","))))


def _raise_cannot_tell(args: dict[str, Any], key: str) -> Any:
    raise ConnectionError("the booking system cannot be reached")


def operator_answer(effects: Any, request: dict[str, Any], policy: str) -> dict[str, Any]:
    """A person answering an unknown-outcome request: `truthful` looks the key up in the effects file."""
    decisions = []
    for item in request["calls"]:
        if policy == "truthful":
            found = effects.find(item["idempotency_key"])
            decisions.append({"type": "done", "result": found} if found else {"type": "not_done"})
        else:
            decisions.append({"type": policy})
    return {"decisions": decisions, "reviewer": "crash-child"}


@dataclass
class SyncCalls:
    """The gatedloop calls `drive` makes, through the sync API (`runs.*`, `graph.invoke`)."""

    graph: Any
    args: argparse.Namespace

    @property
    def config(self) -> Any:
        return {"configurable": {"thread_id": self.args.thread}}

    async def state(self) -> Any:
        return self.graph.get_state(self.config)

    async def pending(self) -> dict[str, Any] | None:
        from gatedloop.graph import runs

        return runs.pending_request(self.graph, self.args.thread)

    async def start(self, requester: Any) -> None:
        from gatedloop.graph import runs

        runs.start(self.graph, self.args.thread, self.args.text, context=requester)

    async def resume(self, answer: Any, reviewer: Any) -> None:
        from langgraph.types import Command

        from gatedloop.graph import runs

        if self.args.bypass_lease:
            payload = Command(resume=answer) if answer is not None else None
            self.graph.invoke(payload, self.config, context=reviewer, durability="sync")
        else:
            runs.resume(self.graph, self.args.thread, answer, context=reviewer)


class AsyncCalls(SyncCalls):
    """The same calls through the async API (`runs.a*`, `graph.ainvoke`), as a server makes them."""

    async def state(self) -> Any:
        return await self.graph.aget_state(self.config)

    async def pending(self) -> dict[str, Any] | None:
        from gatedloop.graph import runs

        return await runs.apending_request(self.graph, self.args.thread)

    async def start(self, requester: Any) -> None:
        from gatedloop.graph import runs

        await runs.astart(self.graph, self.args.thread, self.args.text, context=requester)

    async def resume(self, answer: Any, reviewer: Any) -> None:
        from langgraph.types import Command

        from gatedloop.graph import runs

        if self.args.bypass_lease:
            payload = Command(resume=answer) if answer is not None else None
            await self.graph.ainvoke(payload, self.config, context=reviewer, durability="sync")
        else:
            await runs.aresume(self.graph, self.args.thread, answer, context=reviewer)


def drive(graph: Any, effects: Any, args: argparse.Namespace, emit: Any = mark) -> int:
    """Take the thread to a final status (or to a person), one gatedloop call at a time."""
    return asyncio.run(adrive(SyncCalls(graph, args), effects, args, emit))


async def adrive(calls: SyncCalls, effects: Any, args: argparse.Namespace, emit: Any = mark) -> int:
    """`drive` through `calls`: the sync API's or the async one's."""
    from gatedloop.checkpoints.lease import ThreadBusy
    from gatedloop.tools import CallContext

    requester = CallContext(user_id=args.requester)
    reviewer = _reviewer(args)
    try:
        for _ in range(args.max_steps):
            snapshot = await calls.state()
            request = await calls.pending()
            if not snapshot.values and not snapshot.next:
                if not args.text:
                    emit("error no_thread")
                    return 2
                emit("step start")
                await calls.start(requester)
            elif request is not None and request.get("kind") == "unknown_outcome":
                if args.unknown == "wait":
                    emit("waiting unknown_outcome")
                    return EXIT_WAITING
                answer = operator_answer(effects, request, args.unknown)
                emit("step answer", ",".join(d["type"] for d in answer["decisions"]))
                await calls.resume(answer, reviewer)
            elif request is not None:
                count = len(request["action_requests"])
                emit("step approve", count)
                await calls.resume({"decisions": [{"type": "approve"}] * count}, reviewer)
            elif snapshot.values.get("status") and not snapshot.next:
                emit("final", snapshot.values["status"])
                return EXIT_FINAL
            else:
                # Stopped mid-run. `next` may be empty even so: when a node's writes were saved but the
                # process died before the step's checkpoint, LangGraph's snapshot shows no next node.
                emit("step resume", ",".join(snapshot.next) or "-")
                await calls.resume(None, reviewer)
            if args.once:
                emit("once")
                return EXIT_FINAL
    except ThreadBusy:
        emit("busy")
        return EXIT_BUSY
    emit("error too_many_steps")
    return 2


def child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--text", default=None, help="the request, used only if the thread has no checkpoint yet")
    parser.add_argument("--reconcile", choices=["effects", "absent", "raises"], default="effects")
    parser.add_argument("--unknown", choices=["truthful", "done", "not_done", "abandon", "wait"], default="truthful")
    parser.add_argument("--delay-before", type=float, default=0.0, help="seconds inside a write, before the effect")
    parser.add_argument("--delay-after", type=float, default=0.0, help="seconds after the effect, before returning")
    parser.add_argument("--hold", choices=["none", "before", "after", "ckpt", "resume"], default="none")
    parser.add_argument("--hold-step", type=int, default=None, help="with --hold ckpt: the step whose checkpoint waits")
    parser.add_argument("--hold-call", action="append", default=[], help="hold only these call ids (default: all)")
    parser.add_argument("--gate", default=None, help="file whose existence releases a held write")
    parser.add_argument("--barrier", default=None, help="directory: write ready.<pid>, then wait for <dir>/go")
    parser.add_argument("--bypass-lease", action="store_true", help="graph.invoke directly instead of runs.resume")
    parser.add_argument("--approvers", action="append", default=None, help="roles that may decide `book` calls")
    parser.add_argument("--requester", default=None, help="the user id that starts the thread")
    parser.add_argument("--reviewer", default=None, help="USER:ROLE,ROLE: the identity every answer is sent as")
    parser.add_argument("--once", action="store_true", help="do one step only")
    parser.add_argument(
        "--answer",
        choices=["approve", "reject", "not_done", "abandon", "none"],
        default=None,
        help="only send this answer to the pending request, as --reviewer (none: invoke(None)), then exit",
    )
    parser.add_argument("--answer-form", choices=["positional", "keyed"], default="positional")
    parser.add_argument("--durability", choices=["async", "sync", "exit"], default="async", help="with --answer")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--middleware", action="store_true", help="build with a LangChain middleware list")
    parser.add_argument(
        "--on-loop", action="store_true", help="drive through the async API on open_async_sqlite's on-loop saver"
    )
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"approvers": frozenset(args.approvers)} if args.approvers else {}
    if args.reconcile == "absent":
        overrides["reconcile"] = None
    if args.reconcile == "raises":
        overrides["reconcile"] = _raise_cannot_tell
    if args.middleware:  # tests/test_middleware.py: a kill mid-write under a retrying middleware
        from langchain.agents.middleware import ModelCallLimitMiddleware, ToolRetryMiddleware

        overrides["middleware"] = [
            ModelCallLimitMiddleware(thread_limit=50),
            ToolRetryMiddleware(max_retries=3, initial_delay=0, jitter=False),
        ]
    return overrides


def child_main(argv: list[str] | None = None) -> int:
    args = child_parser().parse_args(argv)

    from backends import open_checkpointer
    from sample_app import build

    effects = _marked_effects(args.effects, args)
    overrides = _overrides(args)
    if args.on_loop:
        return asyncio.run(_drive_on_loop(args, effects, overrides))
    with open_checkpointer(args.db) as saver:
        _mark_checkpoint_writes(saver, args)
        frozen = _mark_resume_writes(saver, args)
        graph = build(saver, effects, **overrides)
        mark("ready", os.getpid())
        if args.barrier:
            Path(args.barrier, f"ready.{os.getpid()}").touch()
            _wait_for(os.path.join(args.barrier, "go"))
        if args.answer is not None:
            return answer_once(graph, args, frozen)
        return drive(graph, effects, args)


async def _drive_on_loop(args: argparse.Namespace, effects: Any, overrides: dict[str, Any]) -> int:
    """The child's drive under asyncio, the gate's nodes on the event loop: on SQLite `open_async_sqlite`'s default
    saver (checkpoints and ledger there too; the markers of checkpoint writes come from its sync methods, which it
    calls), on Postgres `open_async_postgres` (each ledger statement awaited on the loop)."""
    from backends import open_async_checkpointer
    from sample_app import build

    async with open_async_checkpointer(args.db) as saver:
        if saver.ledger.postgres:
            _mark_async_checkpoint_writes(saver)
        else:
            _mark_checkpoint_writes(saver, args)
        graph = build(saver, effects, **overrides)
        mark("driver", "on_loop" if saver.ledger.on_loop else "awaited" if saver.ledger.postgres else "threads")
        mark("ready", os.getpid())
        return await adrive(AsyncCalls(graph, args), effects, args)


def drive_here(argv: list[str]) -> ChildRun:
    """`drive` in this process (same options as the script; no markers from writes or checkpoints)."""
    from backends import open_checkpointer
    from sample_app import Effects, build

    args = child_parser().parse_args(argv)
    lines: list[str] = []
    effects = Effects(args.effects)
    with open_checkpointer(args.db) as saver:
        graph = build(saver, effects, **_overrides(args))
        code = drive(graph, effects, args, emit=lambda *parts: lines.append(" ".join(map(str, parts))))
    return ChildRun(code, lines, killed=False, stderr="")


# --------------------------------------------------------------------------------------------- parent side


@dataclass
class KillPlan:
    """When to SIGKILL a child: on the n-th line starting with `marker` (then after `delay_s`), or `delay_s`
    after `ready` if `marker` is None. A child that ends first is not killed."""

    marker: str | None
    occurrence: int = 1
    delay_s: float = 0.0

    def describe(self) -> str:
        if self.marker is None:
            return f"{self.delay_s * 1000:.0f}ms after ready"
        return f"{self.marker}#{self.occurrence}+{self.delay_s * 1000:.0f}ms"


@dataclass
class ChildRun:
    returncode: int
    lines: list[str]
    killed: bool
    stderr: str

    def markers(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.split(" ", 1)[0] == prefix]

    def last(self) -> str:
        return self.lines[-1] if self.lines else ""


def child_command(db: str, effects: str, thread: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(SUPPORT / "crash_child.py"),
        "--db",
        db,
        "--effects",
        effects,
        "--thread",
        thread,
        *extra,
    ]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPPORT), env.get("PYTHONPATH", "")) if p)
    return env


class Child:
    """A running child process whose marker lines arrive on a queue. It is forked from the preloaded server
    (tests/support/preloaded.py: the third-party imports done once) unless `fresh`: a new interpreter, a child of
    this process (left a zombie until `wait`)."""

    def __init__(self, cmd: list[str], stderr_path: Path, fresh: bool = False):
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")  # noqa: SIM115 - closed in wait()
        if fresh:
            self.proc: Any = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1, env=child_env()
            )
        else:
            from preloaded import spawn

            self.proc = spawn(cmd, child_env(), self._stderr)
        self.lines: list[str] = []
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.killed = False
        self.ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def next_line(self, deadline: float) -> str | None:
        """The next marker line; None at end of output. Raises TimeoutError at the deadline."""
        if self.ended:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            line = self.queue.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError from None
        if line is None:
            self.ended = True
        else:
            self.lines.append(line)
        return line

    def wait_for(
        self, prefix: str | tuple[str, ...], occurrence: int = 1, timeout_s: float = CHILD_TIMEOUT_S
    ) -> str | None:
        """Read lines until the `occurrence`-th one starting with `prefix` (or one of several); None if the
        child ended first."""
        prefixes = (prefix,) if isinstance(prefix, str) else prefix
        deadline = time.monotonic() + timeout_s
        seen = [line for line in self.lines if line.split(" ", 1)[0] in prefixes]
        while len(seen) < occurrence:
            line = self.next_line(deadline)
            if line is None:
                return None
            if line.split(" ", 1)[0] in prefixes:
                seen.append(line)
        return seen[occurrence - 1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.killed = True

    def wait(self, timeout_s: float = CHILD_TIMEOUT_S) -> ChildRun:
        deadline = time.monotonic() + timeout_s
        try:
            while self.next_line(deadline) is not None:
                pass
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            self.kill()
            self.proc.wait()
            raise TimeoutError(f"child {self.proc.pid} did not finish: {self.lines[-5:]}") from None
        finally:
            self._stderr.close()
        self._reader.join()
        stderr = self.stderr_path.read_text(errors="replace")
        # killed only if the signal actually ended it (it may have exited just before the kill)
        killed = self.killed and self.proc.returncode == -signal.SIGKILL
        return ChildRun(self.proc.returncode, self.lines, killed, stderr)


def run_child(cmd: list[str], stderr_path: Path, plan: KillPlan | None = None) -> ChildRun:
    """Run a child to its end, or SIGKILL it as `plan` says."""
    child = Child(cmd, stderr_path)
    if plan is not None:
        if plan.marker is None:
            if child.wait_for("ready") is not None:
                time.sleep(plan.delay_s)
                child.kill()
        elif child.wait_for(plan.marker, plan.occurrence) is not None:
            if plan.delay_s:
                time.sleep(plan.delay_s)
            child.kill()
    return child.wait()


# ------------------------------------------------------------------------------------------------ trials

ITEMS = ["a", "b", "c", "d"]
KILL_MARKERS = ["step", "write_begin", "effect", "ckpt", "ckpt_done", "writes", "writes_done"]


@dataclass
class TrialPlan:
    seed: int
    writes: int
    reconcile: str
    unknown: str
    delay_before: float
    delay_after: float
    kills: list[KillPlan]
    on_loop: bool = False
    """The killed children drive through the async API on the on-loop saver (the last resume is sync)."""

    @property
    def text(self) -> str:
        return "book " + ", ".join(f"{i + 1} {ITEMS[i]}" for i in range(self.writes))

    def describe(self) -> str:
        kills = " then ".join(k.describe() for k in self.kills)
        return (
            f"seed={self.seed} writes={self.writes} reconcile={self.reconcile} unknown={self.unknown} "
            f"delays={self.delay_before * 1000:.0f}/{self.delay_after * 1000:.0f}ms kills: {kills}"
            + (" (async, on the loop)" if self.on_loop else "")
        )


def _kill_plan(rng: random.Random, writes: int, delay_before: float, delay_after: float) -> KillPlan:
    if rng.random() < 0.35:
        span = 0.25 + writes * (delay_before + delay_after)
        return KillPlan(None, delay_s=rng.uniform(0.0, span))
    marker = rng.choice(KILL_MARKERS)
    most = {"step": 3, "write_begin": writes, "effect": writes}.get(marker, 2 + 2 * writes)
    extra = rng.choice([0.0, 0.0, rng.uniform(0.0, max(delay_before, delay_after, 0.01))])
    return KillPlan(marker, rng.randint(1, most), extra)


def plan_trial(seed: int, on_loop: bool = False) -> TrialPlan:
    """A seeded trial: 2-4 approved writes, how unknown outcomes are settled, and one or two kills."""
    rng = random.Random(seed)
    writes = rng.choice([2, 3, 3, 4])
    reconcile = rng.choices(["effects", "absent", "raises"], weights=[6, 2, 2])[0]
    unknown = "truthful" if reconcile == "effects" else rng.choices(["truthful", "abandon", "wait"], [6, 2, 2])[0]
    delay_before = rng.uniform(0.01, 0.08)
    delay_after = rng.choice([0.0, rng.uniform(0.0, 0.04)])
    kills = [_kill_plan(rng, writes, delay_before, delay_after)]
    if rng.random() < 0.5:
        kills.append(_kill_plan(rng, writes, delay_before, delay_after))
    return TrialPlan(seed, writes, reconcile, unknown, delay_before, delay_after, kills, on_loop)


@dataclass
class ThreadReport:
    """What a thread looks like after a trial, and which invariants it breaks (`problems`)."""

    status: str
    effects_per_call: dict[str, int]
    double_effects: list[str]
    missing_effects: list[str]
    unanswered: list[str]
    ledger: dict[str, tuple[str, int]]
    problems: list[str] = field(default_factory=list)


def inspect_thread(db: str, effects_path: str, thread_id: str, call_ids: list[str]) -> ThreadReport:
    """Check the crash invariants on a thread that no process is running any more.

    - each approved write's effect happened at most once, and exactly once unless a person abandoned it or
      is still being asked (then zero or one, never two);
    - every tool call is answered by exactly one ToolMessage (if the thread is not waiting for a person);
    - the thread is at a final status, or waiting for a person on an unknown outcome;
    - one ledger row per call, none left `claimed` once the thread ended;
    - the result the model saw for a completed write is the effect that really happened.
    """
    from backends import open_checkpointer
    from invariants import assert_each_call_answered_once
    from langchain_core.messages import AIMessage, ToolMessage
    from sample_app import Effects, build

    from gatedloop.checkpoints.ledger import idempotency_key
    from gatedloop.graph import runs

    effects = Effects(effects_path)
    keys = {cid: idempotency_key(thread_id, cid) for cid in call_ids}
    counts = Counter(key for _, _, key in effects.rows("book"))
    per_call = {cid: counts[key] for cid, key in keys.items()}
    problems: list[str] = []
    strangers = set(counts) - set(keys.values())
    if strangers:
        problems.append(f"effects with keys of no call: {sorted(strangers)}")

    with open_checkpointer(db) as saver:
        rows = [(e.call_id, e.state, e.attempts) for e in saver.ledger.entries(thread_id)]
        graph = build(saver, effects)
        snapshot = graph.get_state(runs.config_for(thread_id))
        request = runs.pending_request(graph, thread_id)
    ledger = {cid: (state, attempts) for cid, state, attempts in rows}
    if len(ledger) != len(rows):
        problems.append(f"duplicate ledger rows: {rows}")
    if set(ledger) - set(call_ids):
        problems.append(f"ledger rows for unknown calls: {sorted(set(ledger) - set(call_ids))}")
    values = snapshot.values or {}
    messages = values.get("messages", [])
    waiting_on: set[str] = set()
    not_yet: set[str] = set()
    if request is not None and request.get("kind") == "unknown_outcome":
        status = "waiting_for_person"
        waiting_on = {c["tool_call_id"] for c in request["calls"]}
        # Writes run in the model's order: those after the one waiting for a person have not started yet.
        first = min(call_ids.index(cid) for cid in waiting_on if cid in call_ids)
        not_yet = set(call_ids[first + 1 :])
    elif request is not None:
        status = "waiting_for_approval"
    elif snapshot.next or not values.get("status"):
        status = "stopped_mid_run"
    else:
        status = str(values["status"])

    unanswered: list[str] = []
    if status != "waiting_for_person":
        try:
            assert_each_call_answered_once(messages)
        except AssertionError as exc:
            unanswered.append(str(exc))
    if status not in ("completed", "needs_attention", "waiting_for_person"):
        problems.append(f"thread ended at {status!r}")

    double = [cid for cid, n in per_call.items() if n > 1]
    abandoned = {cid for cid, (state, _) in ledger.items() if state == "abandoned"}
    missing = [cid for cid, n in per_call.items() if n == 0 and cid not in abandoned | waiting_on | not_yet]
    started_early = [cid for cid in not_yet if per_call.get(cid)]
    if started_early:
        problems.append(f"writes ran before an earlier write was settled: {started_early}")
    if status == "needs_attention" and not abandoned:
        problems.append("needs_attention but no write was abandoned")
    if status in ("completed", "needs_attention"):
        unresolved = [cid for cid, (state, _) in ledger.items() if state == "claimed"]
        if unresolved:
            problems.append(f"ledger claims left without an outcome: {unresolved}")
        answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
        for cid, key in keys.items():
            message = answers.get(cid)
            if per_call[cid] == 1 and cid not in abandoned and message is not None:
                found = effects.find(key)
                body = json.loads(str(message.content))
                if message.status != "success" or body.get("booking") != (found or {}).get("booking"):
                    problems.append(f"{cid}: the model was told {message.content!r}, the effect is {found}")
        proposed = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        if sorted(proposed) != sorted(call_ids):
            problems.append(f"calls proposed {proposed}, expected {call_ids}")
    if double:
        problems.append(f"effects more than once: {double} ({per_call})")
    if missing:
        problems.append(f"approved writes that never happened: {missing} (ledger {ledger})")
    problems.extend(unanswered)
    return ThreadReport(status, per_call, double, missing, unanswered, ledger, problems)


def effects_per_call(effects_path: str, thread_id: str, call_ids: list[str]) -> dict[str, int]:
    """How many times each call's write really happened (effects recorded under its idempotency key)."""
    from sample_app import Effects

    from gatedloop.checkpoints.ledger import idempotency_key

    counts = Counter(key for _, _, key in Effects(effects_path).rows("book"))
    return {cid: counts[idempotency_key(thread_id, cid)] for cid in call_ids}


def assert_completed_once(db: str, effects_path: str, thread_id: str, call_ids: list[str]) -> ThreadReport:
    """The thread completed with no broken invariant (`inspect_thread`), each write happened exactly once,
    and the ledger shows each one done."""
    report = inspect_thread(db, effects_path, thread_id, call_ids)
    assert report.problems == [] and report.status == "completed", report
    assert report.effects_per_call == dict.fromkeys(call_ids, 1), report
    assert {state for state, _ in report.ledger.values()} == {"done"} and set(report.ledger) == set(call_ids)
    return report


@dataclass
class TrialResult:
    plan: TrialPlan
    kills: int
    runs: list[ChildRun]
    report: ThreadReport
    unrecorded_restarts: int

    @property
    def ok(self) -> bool:
        return not self.report.problems

    def explain(self) -> str:
        lines = [self.plan.describe(), f"status={self.report.status} problems={self.report.problems}"]
        for index, child in enumerate(self.runs):
            lines.append(f"  child {index}: rc={child.returncode} killed={child.killed} lines={child.lines[-12:]}")
            if child.stderr.strip() and not child.killed:
                lines.append("    stderr: " + child.stderr.strip()[-1500:])
        return "\n".join(lines)


def run_trial(plan: TrialPlan, workdir: Path, db: str | None = None, thread_id: str | None = None) -> TrialResult:
    """Child 1 starts and approves the thread, each later kill lands in a fresh process resuming by thread
    id, and this process resumes last, without a kill. Then the invariants are checked. `db`: a SQLite file
    in `workdir` unless given (`env`: the Postgres test server, with a `thread_id` no other trial uses)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db, effects = db or str(workdir / "runs.sqlite"), str(workdir / "effects.sqlite")
    thread_id = thread_id or f"trial-{plan.seed}"
    options = [
        "--text",
        plan.text,
        "--reconcile",
        plan.reconcile,
        "--unknown",
        plan.unknown,
        "--delay-before",
        f"{plan.delay_before:.4f}",
        "--delay-after",
        f"{plan.delay_after:.4f}",
    ]
    cmd = child_command(db, effects, thread_id, *options)
    killed_cmd = [*cmd, "--on-loop"] if plan.on_loop else cmd
    children = [run_child(killed_cmd, workdir / f"child{i}.stderr", kill) for i, kill in enumerate(plan.kills)]
    # the last resume, without a kill, runs here: this process has not touched the thread either
    children.append(drive_here(cmd[2:]))
    unrecorded = sum(1 for child in children[1:] if "step start" in child.lines)
    call_ids = [f"c1_{i}" for i in range(plan.writes)]
    report = inspect_thread(db, effects, thread_id, call_ids)
    last = children[-1]
    if last.killed or last.returncode not in (EXIT_FINAL, EXIT_WAITING):
        report.problems.append(f"the last resume failed: rc={last.returncode}")
    if last.returncode == EXIT_WAITING and plan.unknown != "wait":
        report.problems.append("left waiting although the operator answers")
    return TrialResult(plan, sum(c.killed for c in children), children, report, unrecorded)


if __name__ == "__main__":
    sys.exit(child_main())
