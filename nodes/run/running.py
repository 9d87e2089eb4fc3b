"""Running one tool call: a read with a timeout, or a write guarded by the execution ledger.

Each returns an `Outcome` (plain JSON, since LangGraph stores task results in the checkpoint). A write
is claimed in the ledger before it starts and finished after; whoever does not win the claim never
starts it. A write that timed out, lost its connection or whose claimant died is `unknown`, not an error.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp

from gatedloop.checkpoints.grants import ClaimRefused
from gatedloop.checkpoints.ledger import Claims, Ledger, LedgerEntry, idempotency_key
from gatedloop.nodes.gate.outcomes import (
    Outcome,
    UnknownReason,
    error_outcome,
    finished_state,
    ok_outcome,
    stored_outcome,
    unknown,
)
from gatedloop.nodes.gate.settling import CANNOT_TELL
from gatedloop.nodes.run.decided_args import DecidedArgs
from gatedloop.nodes.run.masked_trace import run_masked
from gatedloop.nodes.run.terms import claim_refused, terms_of
from gatedloop.nodes.run.tool_env import ToolEnv, tool_config, tool_input, tool_output
from gatedloop.nodes.run.wrapped_run import run_wrapped
from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors
from gatedloop.tools.registry import ToolRegistry

log = logging.getLogger("gatedloop.execute")

# Threads, not processes: tools are mostly I/O. A timed-out call keeps its thread until it returns.
_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="gatedloop-tool")

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    httpx.TransportError,  # an HTTP tool or MCP server over HTTP that went away mid-call
    anyio.ClosedResourceError,  # an MCP stdio/HTTP stream closed under the call
    anyio.BrokenResourceError,
    anyio.EndOfStream,
)
MCP_CONNECTION_CLOSED = -32000
"""`mcp.types.CONNECTION_CLOSED`: the code of the `McpError` an MCP client raises when its server dies mid-call
(the `mcp` package is optional, so it is matched by code, not imported)."""


def lost_connection(exc: BaseException) -> bool:
    """Whether a write's failure means its connection was lost, so it may or may not have happened (an unknown
    outcome, never a failure the model might retry): the exception, its causes, and an exception group's members."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CONNECTION_ERRORS):
            return True
        if type(current).__name__ == "McpError" and getattr(getattr(current, "error", None), "code", None) == (
            MCP_CONNECTION_CLOSED
        ):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


# Writes of this process that timed out but have not returned yet, so nobody starts them a second time.
_IN_FLIGHT: dict[tuple[str, str], Future[Any]] = {}

# This process's attempts of a write, from just before its claim to its outcome. A claim naming this process is
# one of these, a timed-out one (`_IN_FLIGHT`), or dead: another run of the same thread in this process (a
# server running two answers at once, with no lease) must not take a live one for dead and start it again.
_ATTEMPTS_HERE: Counter[tuple[str, str]] = Counter()
_ATTEMPTS_LOCK = threading.Lock()


@contextmanager
def attempt_here(thread_id: str, call_id: str) -> Iterator[None]:
    """Mark an attempt of this call as under way in this process for the block (a claim or re-claim, the run)."""
    key = (thread_id, call_id)
    with _ATTEMPTS_LOCK:
        _ATTEMPTS_HERE[key] += 1
    try:
        yield
    finally:
        with _ATTEMPTS_LOCK:
            _ATTEMPTS_HERE[key] -= 1
            if not _ATTEMPTS_HERE[key]:
                del _ATTEMPTS_HERE[key]


def invoke_tool(
    registry: ToolRegistry, plan: CallPlan, decided: DecidedArgs, env: ToolEnv | None, config: RunnableConfig
) -> Any:
    """Run the tool on exactly the decided arguments (checked as it is called), plus what it asks to be injected;
    with `secret_args`, callbacks see only the masked arguments (run/masked_trace.py)."""
    tool = registry.tools[plan["name"]]
    policy = registry.policy(plan["name"])

    def run(config: RunnableConfig) -> Any:
        prepared = tool_input(tool, registry.injections[plan["name"]], plan, decided.checked(), env, config)
        if getattr(tool, "func", None) is None and getattr(tool, "coroutine", None) is not None:
            return asyncio.run(tool.ainvoke(prepared, config))
        return tool.invoke(prepared, config)

    if not policy.secret_args:
        return tool_output(tool.name, run(config))
    return tool_output(tool.name, run_masked(tool, policy.masked(decided.args), config, run))


def submit(registry: ToolRegistry, plan: CallPlan, env: ToolEnv | None, injected_key: str | None = None) -> Future[Any]:
    """Start the tool in the pool with the run's config, in a copy of this context (so `get_config`,
    `get_stream_writer` and `get_store` work inside the tool as they do in a node). A middleware's
    `wrap_tool_call` gets its own copy of the call; the tool gets the decided arguments (invariant 16)."""
    config = tool_config(plan)
    decided = DecidedArgs.of(plan, injected_key)
    run = functools.partial(invoke_tool, registry, plan, decided, env, config)
    if env is not None and env.tool_wrapper is not None:
        policy = registry.policy(plan["name"])
        visible = policy.masked(decided.args) if policy.secret_args else decided.args
        tool = registry.tools[plan["name"]]
        return _POOL.submit(contextvars.copy_context().run, run_wrapped, env, plan, tool, visible, config, run)
    return _POOL.submit(contextvars.copy_context().run, run)


def _failure(exc: BaseException, name: str, call_id: str) -> Outcome:
    if isinstance(exc, errors.ToolFailure):
        return error_outcome(exc)
    log.error("tool %s (call %s) raised %s", name, call_id, type(exc).__name__, exc_info=exc)
    return error_outcome(errors.ToolFailure(errors.GENERIC_TOOL_ERROR, error_type="tool_error"))


def run_read(registry: ToolRegistry, plan: CallPlan, max_chars: int, env: ToolEnv | None = None) -> Outcome:
    """A read: safe to repeat, so a timeout is simply a `timeout` error."""
    policy = registry.policy(plan["name"])
    started = time.monotonic()
    future = submit(registry, plan, env)
    finished, result, exc = _wait(future, policy.timeout_s, plan)
    if not finished:
        outcome = error_outcome(
            errors.ToolFailure(errors.TIMEOUT.format(seconds=policy.timeout_s), error_type="timeout")
        )
    elif exc is not None:
        outcome = _failure(exc, plan["name"], plan["id"])
    else:
        outcome = ok_outcome(result, max_chars)
    outcome["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
    return outcome


class ToolAborted(BaseException):
    """A tool raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt, GeneratorExit...).

    It stops the run as the original would (a BaseException, so `except Exception` does not swallow it), but
    carries only the tool's name and the exception's type: LangGraph stores a task's error in the checkpoint,
    and the original's text may hold secrets. The original, with its traceback, goes to the log."""


def _wait(future: Future[Any], timeout_s: float, plan: CallPlan) -> tuple[bool, Any, BaseException | None]:
    """(finished, result, exception). Not finished means our timeout passed; a TimeoutError the tool raised
    itself is its exception (on 3.11+ the two are the same class, so `future.done()` tells them apart).
    A BaseException that is not an Exception stops the run as `ToolAborted`, and the thread resumes from its
    checkpoint, a write's claim settled through reconciliation."""
    try:
        return True, future.result(timeout=timeout_s), None
    except GraphBubbleUp:
        raise
    except FutureTimeout as exc:
        return (True, None, exc) if future.done() else (False, None, None)
    except Exception as exc:
        return True, None, exc
    except BaseException as exc:
        aborted = type(exc).__name__
        log.error("tool %s (call %s) raised %s; the run stops", plan["name"], plan["id"], aborted, exc_info=exc)
    # Raised outside the handler, so the original is neither its cause nor its context.
    raise ToolAborted(f"tool {plan['name']} (call {plan['id']}) raised {aborted}; the run stopped (details in the log)")


def key_of_record(entry: LedgerEntry | None, thread_id: str, call_id: str) -> str:
    """The idempotency key a write was (or will be) started with: its ledger row's, else the thread's own.

    They differ only in a copied thread (`copy_thread`), whose rows keep the key the source started the
    write with: asking the system about, or re-running, a write begun before the copy must use that key."""
    return entry.idempotency_key if entry is not None else idempotency_key(thread_id, call_id)


def reconcile(registry: ToolRegistry, plan: CallPlan, key: str) -> Any:
    """The tool's own answer to 'did this write happen?': a result, None, or CANNOT_TELL."""
    policy = registry.policy(plan["name"])
    if policy.reconcile is None:
        return CANNOT_TELL
    try:
        return policy.reconcile(dict(plan["args"]), key)
    except Exception:
        log.warning("reconcile for %s (call %s) could not tell", plan["name"], plan["id"], exc_info=True)
        return CANNOT_TELL


def run_write(
    registry: ToolRegistry, ledger: Ledger, thread_id: str, plan: CallPlan, max_chars: int, env: ToolEnv | None = None
) -> Outcome:
    """A write: claim, run once, record. A lost claim returns the stored result or `unknown`.

    After the ledger was lost and recreated, even a won claim may be a write that already happened, so the
    tool's system is asked first (`reconcile`); if it cannot tell, the outcome is unknown (a person decides)."""
    with attempt_here(thread_id, plan["id"]):
        return _claimed_run(registry, ledger, thread_id, plan, max_chars, env)


def _claimed_run(
    registry: ToolRegistry, ledger: Ledger, thread_id: str, plan: CallPlan, max_chars: int, env: ToolEnv | None
) -> Outcome:
    try:  # a grant's use and the limits' charges are taken with the claim, or nothing is (nodes/run/terms.py)
        won, entry = ledger.claim(thread_id, plan["id"], plan["name"], plan["digest"], terms_of(plan))
    except ClaimRefused as refused:
        return claim_refused(ledger, thread_id, plan, refused)
    if not won:
        if entry.state != "claimed":
            return stored_outcome(entry.state, entry.result)
        reason: UnknownReason = "claimant_running" if ledger.claimant_alive(entry.claimant) else "claimant_died"
        return unknown(reason, entry.attempts)
    if ledger.recreated:
        known = reconcile(registry, plan, entry.idempotency_key)
        if known is CANNOT_TELL:
            return unknown("ledger_lost", entry.attempts)
        if known is not None:
            outcome = ok_outcome(known, max_chars)
            ledger.finish(thread_id, plan["id"], finished_state(outcome), outcome)
            return outcome
    return start_write(registry, ledger, thread_id, plan, max_chars, entry, env)


def start_write(
    registry: ToolRegistry,
    ledger: Ledger,
    thread_id: str,
    plan: CallPlan,
    max_chars: int,
    entry: LedgerEntry,
    env: ToolEnv | None = None,
) -> Outcome:
    """Run a write this process holds the claim (`entry`) for, and record its outcome in the ledger."""
    policy = registry.policy(plan["name"])
    attempts = entry.attempts
    key = entry.idempotency_key if registry.takes_idempotency_key(plan["name"]) else None
    started = time.monotonic()
    future = submit(registry, plan, env, key)
    finished, result, exc = _wait(future, policy.timeout_s, plan)
    if not finished:
        _IN_FLIGHT[(thread_id, plan["id"])] = future
        future.add_done_callback(lambda f: _record_late(ledger, thread_id, plan, f, max_chars))
        return unknown("timeout", attempts, time.monotonic() - started)
    if exc is not None and lost_connection(exc):
        log.warning("write %s (call %s) lost its connection: %s", plan["name"], plan["id"], type(exc).__name__)
        return unknown("connection_lost", attempts, time.monotonic() - started)
    outcome = _failure(exc, plan["name"], plan["id"]) if exc is not None else ok_outcome(result, max_chars)
    outcome["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
    ledger.finish(thread_id, plan["id"], finished_state(outcome), outcome)
    return outcome


def _record_late(ledger: Ledger, thread_id: str, plan: CallPlan, future: Future[Any], max_chars: int) -> None:
    """A timed-out write that finishes later still records what it did, for reconciliation."""
    _IN_FLIGHT.pop((thread_id, plan["id"]), None)
    exc = future.exception()
    outcome = _failure(exc, plan["name"], plan["id"]) if exc else ok_outcome(future.result(), max_chars)
    ledger.finish(thread_id, plan["id"], finished_state(outcome), outcome)


def still_running_here(thread_id: str, call_id: str) -> bool:
    """True while an attempt of the call in this process is under way (`attempt_here`), or timed out and has not
    returned."""
    with _ATTEMPTS_LOCK:
        if (thread_id, call_id) in _ATTEMPTS_HERE:
            return True
    future = _IN_FLIGHT.get((thread_id, call_id))
    return future is not None and not future.done()


def started_calls(claims: Claims, thread_id: str) -> set[str]:
    """The calls of the thread whose write was ever claimed (started), finished or not."""
    return {entry.call_id for entry in claims.entries(thread_id)}
