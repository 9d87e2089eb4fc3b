"""The `execute` node: runs the approved and ungated calls, each as its own LangGraph task.

Consecutive reads run concurrently; a write is a barrier and writes run one at a time in the model's
order. Because each call is a `@task`, a call that finished is not run again when a sibling fails or the
node is resumed. Before anything runs, each gated call's arguments are checked against the digest the
reviewer approved; a mismatch goes back to `approve`. Unknown write outcomes are reconciled here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langgraph.config import get_stream_writer
from langgraph.func import task
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from gatedloop.checkpoints.ledger import claimant_alive, current_claimant
from gatedloop.graph.state import CallPlan, GatedState, RequestCounters
from gatedloop.nodes.hitl import InvalidDecision
from gatedloop.nodes.parts import (
    LoopParts,
    call_context,
    current_thread_id,
    error_message,
    result_message,
)
from gatedloop.nodes.running import Outcome, run_read, run_write, start_write, still_running_here, stored_outcome
from gatedloop.nodes.unknown import (
    CANNOT_TELL,
    check_unknown_answer,
    reconcile,
    reconciled_outcome,
    unknown_request,
)
from gatedloop.tools import errors
from gatedloop.tools.arguments import args_digest, digest, fingerprint

log = logging.getLogger("gatedloop.execute")


def make_execute_node(parts: LoopParts):
    max_chars = parts.limits.max_result_chars

    def read(plan: CallPlan) -> Outcome:
        return _reported(plan, lambda: run_read(parts.registry, plan, max_chars))

    def write(thread_id: str, plan: CallPlan) -> Outcome:
        return _reported(plan, lambda: run_write(parts.registry, parts.ledger, thread_id, plan, max_chars))

    def rerun(thread_id: str, plan: CallPlan, attempts: int) -> Outcome | None:
        """Run again a write known not to have happened; its recorded outcome if it finished meanwhile;
        None if another process took it first."""
        if not parts.ledger.reclaim(thread_id, plan["id"], attempts):
            entry = parts.ledger.get(thread_id, plan["id"])
            return stored_outcome(entry.state, entry.result) if entry and entry.state != "claimed" else None
        parts.ledger.record(thread_id, plan["id"], f"rerun_{attempts + 1}", {"attempt": attempts + 1})
        return start_write(parts.registry, parts.ledger, thread_id, plan, max_chars, attempts + 1)

    # One LangGraph task per call: a finished call's result is kept in the checkpoint and never re-run.
    # (cast: langgraph's `task` overloads do not type-check a plain sync function under mypy.)
    read_task: Any = task(name="tool_read")(cast(Any, read))
    write_task: Any = task(name="tool_write")(cast(Any, write))
    rerun_task: Any = task(name="tool_write_retry")(cast(Any, rerun))

    def execute(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        thread_id = current_thread_id()
        calls = state.get("calls") or []
        counters: RequestCounters = {**state["counters"]}
        context = call_context(runtime.context)
        runnable = [c for c in calls if c["verdict"] == "run"]
        stale = {c["id"] for c in runnable if not _still_approved(parts, c, context)}
        if stale:
            return {"calls": [{**c, "verdict": "ask"} if c["id"] in stale else c for c in calls]}
        stop = parts.stop_before_work(thread_id, counters, tokens=False)
        if stop:
            reason = errors.NOT_RUN_STOPPED.format(reason=stop[1])
            not_run = [error_message(c["id"], c["name"], "budget_exhausted", reason) for c in runnable]
            return {"messages": not_run, "calls": _answered(calls), "stop": stop[0], "stop_detail": stop[1]}

        outcomes = _run_in_order(runnable, read_task, lambda plan: write_task(thread_id, plan))
        pending = [(p, outcomes[p["id"]]) for p in runnable if outcomes[p["id"]]["status"] == "unknown"]
        abandoned = _resolve_unknown(parts, thread_id, pending, outcomes, rerun_task)

        answers: list[ToolMessage] = []
        loop_hit = False
        fingerprints = {k: list(v) for k, v in counters["fingerprints"].items()}
        per_tool = dict(counters["per_tool"])
        for plan in runnable:
            outcome = outcomes[plan["id"]]
            per_tool[plan["name"]] = per_tool.get(plan["name"], 0) + 1
            content = outcome["content"]
            if outcome["status"] == "ok" and plan["effect"] == "read":
                repeat = _repeat_count(fingerprints, plan, content)
                if repeat >= 1:
                    content = errors.error_json("duplicate_call", errors.DUPLICATE_CALL)
                    outcome = {**outcome, "status": "error", "error_type": "duplicate_call"}
                    loop_hit = loop_hit or repeat >= 2
            answers.append(_message(plan, outcome, content))
            parts.ledger.record(thread_id, plan["id"], "executed", _audit(plan, outcome))
        counters["tool_calls"] += len(runnable)
        counters["per_tool"] = per_tool
        counters["fingerprints"] = fingerprints
        update: dict[str, Any] = {"messages": answers, "calls": _answered(calls), "counters": counters}
        if abandoned:
            update.update(stop="needs_attention", stop_detail="a write's outcome is unknown and was left to a person")
        elif loop_hit:
            update.update(stop="loop_detected", stop_detail="the model repeated the same call with the same result")
        return update

    return execute


def _reported(plan: CallPlan, run: Callable[[], Outcome]) -> Outcome:
    """Custom stream events around one call, for live progress (`stream_mode="custom"`)."""
    write = get_stream_writer()
    write({"event": "tool_started", "tool_call_id": plan["id"], "tool": plan["name"], "effect": plan["effect"]})
    outcome = run()
    log.info(
        "tool call thread=%s call=%s tool=%s decision=%s outcome=%s duration_ms=%.1f",
        current_thread_id(),
        plan["id"],
        plan["name"],
        plan.get("decision", "auto"),
        outcome["status"],
        outcome["duration_ms"],
    )
    write(
        {
            "event": "tool_finished",
            "tool_call_id": plan["id"],
            "tool": plan["name"],
            "outcome": outcome["status"],
            "error_type": outcome.get("error_type"),
            "duration_ms": outcome["duration_ms"],
            "reused": outcome.get("reused", False),
        }
    )
    return outcome


def _still_approved(parts: LoopParts, plan: CallPlan, context: Any) -> bool:
    """What is about to run must be exactly what was validated and, if gated, approved."""
    current = args_digest(plan["name"], plan["args"])
    if "approved_digest" in plan:
        return current == plan["approved_digest"]
    return current == plan["digest"] and not parts.registry.policy(plan["name"]).needs_approval(plan["args"], context)


def _run_in_order(runnable: list[CallPlan], read_task: Any, write_task: Any) -> dict[str, Outcome]:
    """Consecutive reads concurrently; each write alone, in the model's order."""
    outcomes: dict[str, Outcome] = {}
    batch: list[CallPlan] = []

    def flush() -> None:
        futures = [(plan, read_task(plan)) for plan in batch]
        for plan, future in futures:
            outcomes[plan["id"]] = future.result()
        batch.clear()

    for plan in runnable:
        if plan["effect"] == "read":
            batch.append(plan)
            continue
        flush()
        outcomes[plan["id"]] = write_task(plan).result()
    flush()
    return outcomes


def _resolve_unknown(
    parts: LoopParts,
    thread_id: str,
    pending: list[tuple[CallPlan, Outcome]],
    outcomes: dict[str, Outcome],
    rerun_task: Any,
) -> bool:
    """Reconcile each unknown write; what the system cannot tell goes to a person. True if any abandoned."""
    for_person: list[tuple[CallPlan, Outcome]] = []
    for plan, outcome in pending:
        entry = parts.ledger.get(thread_id, plan["id"])
        if entry is not None and entry.state != "claimed":
            outcomes[plan["id"]] = stored_outcome(entry.state, entry.result)
            continue
        answer = reconcile(parts, thread_id, plan)
        if answer is CANNOT_TELL:
            for_person.append((plan, outcome))
        elif answer is not None:
            outcomes[plan["id"]] = _settle(parts, thread_id, plan, reconciled_outcome(parts, answer), "reconciled")
        elif outcome.get("unknown") == "claimant_died":
            rerun = rerun_task(thread_id, plan, outcome.get("attempts", 1)).result()
            if rerun is None:
                for_person.append((plan, outcome))
            else:
                outcomes[plan["id"]] = rerun
        else:
            for_person.append((plan, outcome))
    if not for_person:
        return False
    request = unknown_request(thread_id, for_person)
    error: str | None = None
    while True:
        answer = interrupt(request if error is None else {**request, "error": error})
        try:
            decisions = check_unknown_answer(answer, len(for_person))
            for (plan, _), decision in zip(for_person, decisions, strict=True):
                if decision["type"] == "not_done":
                    _check_rerunnable(parts, thread_id, plan)
            break
        except InvalidDecision as exc:
            error = str(exc)
    abandoned = False
    for (plan, outcome), decision in zip(for_person, decisions, strict=True):
        who = decision["reviewer"]
        if decision["type"] == "done":
            settled = reconciled_outcome(parts, decision["result"])
            outcomes[plan["id"]] = _settle(parts, thread_id, plan, settled, "marked done", who)
        elif decision["type"] == "not_done":
            rerun = rerun_task(thread_id, plan, outcome.get("attempts", 1)).result()
            outcomes[plan["id"]] = rerun if rerun is not None else outcome
        else:
            parts.ledger.finish(thread_id, plan["id"], "abandoned", outcome)
            outcomes[plan["id"]] = {**outcome, "status": "error"}
            abandoned = True
        parts.ledger.record(thread_id, plan["id"], "unknown_outcome_decision", {"decision": decision["type"]}, who)
    return abandoned


def _check_rerunnable(parts: LoopParts, thread_id: str, plan: CallPlan) -> None:
    """`not_done` may start the write again only if no attempt of it can still be running."""
    entry = parts.ledger.get(thread_id, plan["id"])
    if entry is None or entry.state != "claimed":
        return
    if still_running_here(thread_id, plan["id"]):
        raise InvalidDecision(
            f"the first attempt of {plan['name']} is still running in this process; answer done or abandon, "
            "or resume again once it returns"
        )
    if entry.claimant != current_claimant() and claimant_alive(entry.claimant):
        raise InvalidDecision(f"{plan['name']} is held by another live process ({entry.claimant}); it may be running")


def _settle(
    parts: LoopParts, thread_id: str, plan: CallPlan, outcome: Outcome, how: str, who: str | None = None
) -> Outcome:
    parts.ledger.finish(thread_id, plan["id"], "done", outcome)
    parts.ledger.record(thread_id, plan["id"], how, {"result_chars": len(outcome["content"])}, who)
    return outcome


def _repeat_count(fingerprints: dict[str, list[Any]], plan: CallPlan, content: str) -> int:
    """How many times in a row this read returned the same result for the same arguments before."""
    key = fingerprint(plan["name"], plan["args"])
    result = digest(content)
    previous = fingerprints.get(key)
    repeats = previous[0] + 1 if previous and previous[1] == result else 0
    fingerprints[key] = [repeats, result]
    return repeats


def _message(plan: CallPlan, outcome: Outcome, content: str) -> ToolMessage:
    if outcome["status"] != "ok":
        return ToolMessage(
            content=content, tool_call_id=plan["id"], name=plan["name"], status="error", id=f"tool-{plan['id']}"
        )
    if plan.get("edited"):
        content = json.dumps(
            {
                "ok": True,
                "note": "a reviewer edited this call before it ran",
                "ran_with": plan["args"],
                "result": _loads(content),
            },
            ensure_ascii=False,
        )
    return result_message(plan["id"], plan["name"], content)


def _loads(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


def _answered(calls: list[CallPlan]) -> list[CallPlan]:
    return [{**c, "verdict": "answered"} if c["verdict"] == "run" else c for c in calls]


def _audit(plan: CallPlan, outcome: Outcome) -> dict[str, Any]:
    return {
        "tool": plan["name"],
        "args": plan["args"],
        "outcome": outcome["status"],
        "error_type": outcome.get("error_type"),
        "duration_ms": outcome["duration_ms"],
        "result_chars": len(outcome["content"]),
        "reused": outcome.get("reused", False),
    }
