"""Writes whose outcome is unknown: ask the authoritative system, and if it cannot tell, ask a person.

Never replayed blindly. `reconcile(args, idempotency_key)` returns the result if the write happened,
None if it did not, and raises if it cannot tell. A person answers `done` (with a result), `not_done`
(run it now; or, for a write a new user message superseded, leave it unrun) or `abandon` (the loop stops
with `needs_attention`).

Waiting for that person is not work: the request's deadline excludes it, as it excludes waiting for an approval.
A node cannot update its counters before an `interrupt()`, so the settle task records when it put its question
(`ASKED_EVENT`, once, with the loop's clock) and returns how long the answer took (`Settlement.waited_s`); the node
that gets the answer adds it to `waited_s` in its update, and weighs its deadline with it (nodes/execute.py,
nodes/gate/open_calls.py). Nothing is read for this on the common path: only a question put to a person reads its
event. The question is reminded and escalated as an approval request is (the tool's `remind_after_s`,
`escalate_after_s`), counted from its first asking: past `escalate_after_s`, a `backup_approvers` role may answer it.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, cast

from langgraph.errors import GraphInterrupt
from langgraph.func import task
from langgraph.types import interrupt

from gatedloop.checkpoints.running_step import task_namespace
from gatedloop.nodes.build.parts import LoopParts
from gatedloop.nodes.gate.admission import with_edited_args
from gatedloop.nodes.gate.outcomes import Outcome, error_outcome, finished_state, ok_outcome, stored_outcome
from gatedloop.nodes.gate.settling import CANNOT_TELL, answered_step, settle_step
from gatedloop.nodes.run.notices import queue_unknown_notice
from gatedloop.nodes.run.observed import report_settlement
from gatedloop.nodes.run.running import (
    attempt_here,
    key_of_record,
    reconcile,
    start_write,
    still_running_here,
)
from gatedloop.nodes.run.tool_env import ToolEnv
from gatedloop.nodes.state import CallPlan
from gatedloop.nodes.wire.hitl import (
    ANONYMOUS,
    UNKNOWN_DECISIONS,
    InvalidDecision,
    UnknownOutcomeRequest,
    check_unknown_answer,
    decider,
    ladder_steps,
)
from gatedloop.nodes.wire.senders import received
from gatedloop.tools import errors
from gatedloop.tools.arguments import digest, storable_text
from gatedloop.tools.registry import ToolRegistry

log = logging.getLogger("gatedloop.reconcile")

REFUSED_EVENT = "unknown_answer_refused"
ASKED_EVENT = "unknown_outcome_asked"
"""`unknown_outcome_asked:<task>`, recorded once when a settle task first asks a person, `{"asked_at": clock}`."""


class Settlement(NamedTuple):
    """A settled unknown outcome: what to answer, whether it is still left to a person, and how long a person was
    waited for (excluded from the deadline by the node that receives it)."""

    outcome: Outcome
    left_open: bool
    waited_s: float = 0.0


def reconciled_outcome(parts: LoopParts, result: Any) -> Outcome:
    return ok_outcome(result, parts.limits.max_result_chars)


def unknown_request(
    registry: ToolRegistry, pending: list[tuple[CallPlan, Outcome, str]], asked_at: float
) -> UnknownOutcomeRequest:
    """The question for a person, first asked at `asked_at`; each call with the idempotency key its write was
    started with, its arguments as a reviewer sees them (`secret_args` masked), and when it is reminded and
    escalated (`ladder_steps`, as an approval request)."""
    return {
        "kind": "unknown_outcome",
        "calls": [
            {
                "tool_call_id": plan["id"],
                "name": plan["name"],
                "args": registry.policy(plan["name"]).masked(plan["args"]),
                "idempotency_key": key,
                "reason": str(outcome.get("unknown", "unknown")),
                **ladder_steps(registry.policy(plan["name"]), asked_at),
            }
            for plan, outcome, key in pending
        ],
        "allowed_decisions": list(UNKNOWN_DECISIONS),
    }


def make_settle_task(parts: LoopParts) -> Any:
    """Settling an unknown outcome may ask a person. As its own LangGraph task, its interrupts and their answers
    belong to that one call, and once settled it is not re-decided when the node runs again: an answer can never
    be applied to another call's question, whatever the ledger says by then."""

    def settle(
        thread_id: str, plan: CallPlan, outcome: Outcome, rerun: bool, env: ToolEnv | None = None
    ) -> dict[str, Any]:
        actual = with_edited_args(parts.registry, parts.ledger, thread_id, plan)
        if actual is None:  # the edit it ran with is not recorded: never re-run a masked value; a person decides
            return {"outcome": {**outcome, "status": "error"}, "left_open": True}
        settled = settle_unknown(parts, thread_id, actual, outcome, rerun=rerun, env=env)
        return {"outcome": settled.outcome, "left_open": settled.left_open, "waited_s": settled.waited_s}

    # (cast: langgraph's `task` overloads do not type-check a plain sync function under mypy.)
    return task(name="settle_unknown_write")(cast(Any, settle))


def settle_unknown(
    parts: LoopParts,
    thread_id: str,
    plan: CallPlan,
    outcome: Outcome,
    *,
    rerun: bool = True,
    env: ToolEnv | None = None,
) -> Settlement:
    """The outcome to report for a write whose outcome was unknown, and whether it is still left open.

    The facts are gathered here and the step is the gate's settle table (`settle_step`, nodes/gate/settling.py):
    recorded, reconciled, rerun, superseded (`rerun=False`: a new message superseded the call), or ask a person.
    Re-runs call the tool directly, not as a LangGraph task: the ledger decides who may start it, and a node
    re-run must not depend on how many tasks ran before.
    """
    entry = parts.ledger.get(thread_id, plan["id"])
    recorded = entry is not None and entry.state != "claimed"
    key = key_of_record(entry, thread_id, plan["id"])
    answer = CANNOT_TELL if recorded else reconcile(parts.registry, plan, key)  # the tool is asked only if needed
    due = entry is not None and answer is None  # only then does a live attempt matter (it costs a claimant check)
    may_be_running = not due or _may_be_running(parts, thread_id, plan, entry.claimant if entry else "")
    step = settle_step(
        recorded=recorded, reconciled=answer, claimed=entry is not None, may_be_running=may_be_running, rerun=rerun
    )
    if step == "recorded" and entry is not None:
        return Settlement(stored_outcome(entry.state, entry.result), entry.state == "abandoned")
    if step == "reconciled":
        return Settlement(_settle(parts, thread_id, plan, reconciled_outcome(parts, answer), "reconciled"), False)
    if step == "superseded":
        return Settlement(_superseded(parts, thread_id, plan, "reconciled: not done"), False)
    if step == "rerun" and entry is not None:
        rerun_outcome = _rerun(parts, thread_id, plan, entry.attempts, env)
        if rerun_outcome is not None:
            return Settlement(rerun_outcome, False)
    return _ask_person(parts, thread_id, plan, outcome, rerun=rerun, env=env)


def _superseded(parts: LoopParts, thread_id: str, plan: CallPlan, how: str, who: str | None = None) -> Outcome:
    """A write known not to have happened, that nobody will run now: closed in the ledger as not run."""
    outcome = error_outcome(errors.ToolFailure(errors.SUPERSEDED, error_type="superseded"))
    with parts.ledger.one_commit() as ledger:
        ledger.finish(thread_id, plan["id"], finished_state(outcome), outcome)
        ledger.record(thread_id, plan["id"], "superseded", {"how": how}, who)
    return outcome


def _may_be_running(parts: LoopParts, thread_id: str, plan: CallPlan, claimant: str) -> bool:
    if still_running_here(thread_id, plan["id"]):
        return True
    return claimant != parts.ledger.claimant and parts.ledger.claimant_alive(claimant)


def _rerun(parts: LoopParts, thread_id: str, plan: CallPlan, attempts: int, env: ToolEnv | None) -> Outcome | None:
    """Start again a write known not to have happened; its recorded outcome if it finished meanwhile; None if
    another resumer took it first."""
    with attempt_here(thread_id, plan["id"]):
        won = parts.ledger.reclaim(thread_id, plan["id"], attempts)
        entry = parts.ledger.get(thread_id, plan["id"])
        if not won or entry is None:
            return stored_outcome(entry.state, entry.result) if entry and entry.state != "claimed" else None
        parts.ledger.record(thread_id, plan["id"], f"rerun_{attempts + 1}", {"attempt": attempts + 1})
        return start_write(parts.registry, parts.ledger, thread_id, plan, parts.limits.max_result_chars, entry, env)


def _ask_person(
    parts: LoopParts, thread_id: str, plan: CallPlan, outcome: Outcome, *, rerun: bool, env: ToolEnv | None
) -> Settlement:
    """Interrupt until a valid answer from someone the tool's policy lets decide: done (with its result),
    not_done (run it now) or abandon. Who answers is the answer's sender, bound to it when it entered (invariant
    10), never the identity of whoever runs the task when LangGraph hands it back nor a name written in the
    answer; a refused answer changes nothing but the audit trail, and stays refused however often this task is
    handed it again (see `_refused_before`). A `backup_approvers` role may answer once the question has waited
    `escalate_after_s` since it was first asked (`ASKED_EVENT`), as the question's `escalates_at` shows."""
    key = key_of_record(parts.ledger.get(thread_id, plan["id"]), thread_id, plan["id"])
    policy = parts.registry.policy(plan["name"])
    requester = _requester(parts, thread_id, plan)
    error: str | None = None
    question = 0
    asked = f"{ASKED_EVENT}:{_task_key()}"
    while True:
        first = _asked_at(parts, thread_id, plan, asked, answered=question > 0)
        request = unknown_request(parts.registry, [(plan, outcome, key)], first)
        try:
            answer, reviewer, arrival = received(interrupt(request if error is None else {**request, "error": error}))
        except GraphInterrupt:  # the question is put to a person now (a replayed answer returns instead)
            parts.ledger.record(thread_id, plan["id"], asked, {"asked_at": first})  # kept once: the first question
            queue_unknown_notice(parts, thread_id, request, requester, first)  # queued once, like the event
            raise
        attempt = _attempt_key(question, answer, arrival)
        question += 1
        error = _refused_before(parts, thread_id, plan, attempt)
        if error is not None:
            continue
        try:
            [decision] = check_unknown_answer(answer, 1)
            waited = _waited_s(parts, thread_id, plan, asked)
            who = decider(policy, reviewer, requester, f"{plan['name']} ({plan['id']})", waited)
            claimant = _claimant(parts, thread_id, plan)
            if decision["type"] == "not_done" and _may_be_running(parts, thread_id, plan, claimant):
                raise InvalidDecision(
                    f"an attempt of {plan['name']} may still be running; answer done or abandon, or resume again "
                    "once it has returned"
                )
            break
        except InvalidDecision as exc:
            error = str(exc)
            detail = {"kind": "unknown_outcome", "error": error, "roles": sorted(reviewer.roles)}
            actor = reviewer.user_id or ANONYMOUS
            parts.ledger.record(thread_id, plan["id"], f"{REFUSED_EVENT}:{attempt}", detail, actor)
    detail = {"decision": decision["type"], **({"note": decision["note"]} if decision.get("note") else {})}
    if decision.get("justification"):
        detail["justification"] = decision["justification"]
    entry = parts.ledger.get(thread_id, plan["id"])
    finished = entry is not None and entry.state != "claimed"
    step = answered_step(decision["type"], recorded=finished, rerun=rerun)
    if step == "rerun":  # the re-claim is conditional (one resumer wins): a commit of its own, after the decision
        parts.ledger.record(thread_id, plan["id"], "unknown_outcome_decision", detail, who)
        report_settlement(parts, thread_id, request, requester, reviewer, decision["type"], first)
        again = _rerun(parts, thread_id, plan, entry.attempts if entry else 1, env)
        return Settlement(again, False, waited) if again is not None else Settlement(outcome, True, waited)
    with parts.one_commit() as deciding:  # the decision and the outcome it records: one commit
        deciding.ledger.record(thread_id, plan["id"], "unknown_outcome_decision", detail, who)
        if step == "marked_done":
            done = reconciled_outcome(parts, decision["result"])
            settled = _settle(deciding, thread_id, plan, done, "marked done", who)
        elif step == "abandoned":
            deciding.ledger.finish(thread_id, plan["id"], "abandoned", outcome)
            settled = {**outcome, "status": "error"}
        elif step == "recorded" and entry is not None:
            settled = stored_outcome(entry.state, entry.result)
        else:
            settled = _superseded(deciding, thread_id, plan, "marked not done", who)
    report_settlement(parts, thread_id, request, requester, reviewer, decision["type"], first)
    return Settlement(settled, step == "abandoned", waited)


def _requester(parts: LoopParts, thread_id: str, plan: CallPlan) -> str | None:
    record = parts.ledger.calls(thread_id, [plan["id"]]).get(plan["id"])
    return record.requester.user_id if record is not None else None


def _attempt_key(question: int, answer: Any, arrival: str) -> str:
    """One answer however often LangGraph hands it back: by its arrival (nodes/wire/senders.py), which stays the
    same when LangGraph hands one answer to this task at a later position too (an unanswered re-run takes the
    stored answer again); an answer with no arrival (stored by an older version) by (task, position, answer)."""
    if arrival:
        return digest([arrival, storable_text(answer)])[:12]
    return digest([task_namespace(), question, storable_text(answer)])[:12]


def _task_key() -> str:
    """This settle task, the same each time it replays (a call settled twice, by `execute` and later by `model`,
    has two questions, each timed on its own)."""
    return digest([task_namespace()])[:12]


def _waited_s(parts: LoopParts, thread_id: str, plan: CallPlan, asked: str) -> float:
    """How long the question has waited, from this task's first question to the answer being applied now: the
    time excluded from the deadline, and what the escalation to `backup_approvers` is judged by."""
    return max(0.0, parts.clock() - _asked_at(parts, thread_id, plan, asked, answered=True))


def _asked_at(parts: LoopParts, thread_id: str, plan: CallPlan, asked: str, *, answered: bool) -> float:
    """When this task first put its question: its `ASKED_EVENT`; with none, now if no answer was taken yet (the
    question is first put now), else `_asked_before_events`."""
    for row in parts.ledger.audit(thread_id):
        if row["call_id"] == plan["id"] and row["event"] == asked:
            return float(row["detail"]["asked_at"])
    return _asked_before_events(parts, thread_id, plan) if answered else parts.clock()


def _asked_before_events(parts: LoopParts, thread_id: str, plan: CallPlan) -> float:
    """When a question with no `ASKED_EVENT` was put: by an older version, which did not record it (its answer is
    replayed before any question of this version). It was put right after the write's attempt returned, so the
    attempt's claim stands in for it (the ledger's wall clock, the loop's default clock); that counts the attempt
    itself as waiting, at most its timeout."""
    entry = parts.ledger.get(thread_id, plan["id"])
    return entry.claimed_at if entry is not None else parts.clock()


def _refused_before(parts: LoopParts, thread_id: str, plan: CallPlan, attempt: str) -> str | None:
    """Why this answer was refused when it was given, if it was. A replayed answer is judged as it was then,
    never again under the identity of whoever resumes now (else a refused answer would count once an
    authorized reviewer resumes the same task)."""
    event = f"{REFUSED_EVENT}:{attempt}"
    for row in parts.ledger.audit(thread_id):
        if row["call_id"] == plan["id"] and row["event"] == event:
            return str(row["detail"].get("error") or "refused")
    return None


def _claimant(parts: LoopParts, thread_id: str, plan: CallPlan) -> str:
    entry = parts.ledger.get(thread_id, plan["id"])
    return entry.claimant if entry is not None and entry.state == "claimed" else parts.ledger.claimant


def _settle(
    parts: LoopParts, thread_id: str, plan: CallPlan, outcome: Outcome, how: str, who: str | None = None
) -> Outcome:
    with parts.ledger.one_commit() as ledger:  # a no-op view inside another's: its writes join that commit
        ledger.finish(thread_id, plan["id"], finished_state(outcome), outcome)
        ledger.record(thread_id, plan["id"], how, {"result_chars": len(outcome["content"])}, who)
    return outcome
