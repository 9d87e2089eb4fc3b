"""The `execute` node: runs the approved and ungated calls, each as its own LangGraph task.

Consecutive reads run concurrently; a write is a barrier and writes run one at a time in the model's
order. Because each call is a `@task`, a call that finished is not run again when a sibling fails or the
node is resumed (a turn's lone read, which has neither sibling nor settle question, runs in the node itself).
Nothing in the state is trusted about a call: before anything runs, each call is admitted
against the ledger's evidence (nodes/gate/admission.py): the registry's effect, validator and roles on the exact
arguments, and for a gated call the recorded approvals of exactly those arguments. A gated call without them
goes back to `approve`; a call nobody validated, or whose arguments were changed, is answered, never run.
Unknown write outcomes are reconciled here.

A write whose claim could not take its terms (the standing grant that covered it lapsed, a limit that asks would
be gone past: nodes/run/terms.py) goes back to `approve`, and nothing after it runs before a person decides it.

A stop (cancel, deadline) stops work not yet started. A write that already started (it has a ledger entry) is
settled as always, its recorded outcome, reconcile or a person's answer, and never answered "not run"; the time
a person took to answer is then excluded from the deadline, which is weighed again before anything new starts
(see `_Turn.to_run`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langgraph._internal._runnable import RunnableCallable  # as langgraph.prebuilt.ToolNode: sync + async twins
from langgraph.func import task
from langgraph.runtime import Runtime

from gatedloop.checkpoints.evidence import AuditEvent
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.nodes.build.parts import LoopParts
from gatedloop.nodes.gate.admission import ARGS_CHANGED, for_state, with_edited_args
from gatedloop.nodes.gate.answers import error_message, record_answers, result_message, tool_message
from gatedloop.nodes.gate.outcomes import Outcome, error_outcome
from gatedloop.nodes.gate.turn_evidence import admit_turn
from gatedloop.nodes.run.facts import RunFacts
from gatedloop.nodes.run.running import run_read, run_write, started_calls
from gatedloop.nodes.run.terms import SENT_BACK_ERROR
from gatedloop.nodes.run.tool_env import ToolEnv
from gatedloop.nodes.run.unknown import make_settle_task
from gatedloop.nodes.state import CallPlan, GatedState, RequestCounters, SeenRead, Status, Verdict
from gatedloop.tools import errors
from gatedloop.tools.arguments import digest, fingerprint
from gatedloop.tools.registry import ToolRegistry
from gatedloop.tools.results import edited_result

log = logging.getLogger("gatedloop.execute")

LOOP_DETAIL = (
    "the model called {tool!r} {times} times in a row with the same arguments and got the same result each time; "
    "stopped as a loop (each call was answered with its result)"
)


@dataclass(frozen=True)
class CallRun:
    """What a tool task needs beside its call: the gate's registry and ledger, the result cap and the tool's
    `ToolEnv`, handed over as data, so the tasks are module-level functions (below)."""

    registry: ToolRegistry
    ledger: Ledger
    max_chars: int
    env: ToolEnv
    facts: RunFacts


def read_call(plan: CallPlan, run: CallRun) -> Outcome:
    """One read, with the arguments it runs with (a recorded edit's, see `with_edited_args`)."""
    actual = with_edited_args(run.registry, run.ledger, run.facts.thread_id, plan)
    if actual is None:
        return _not_run(ARGS_CHANGED)
    return _reported(run.facts, plan, lambda: run_read(run.registry, actual, run.max_chars, run.env))


def write_call(thread_id: str, plan: CallPlan, run: CallRun) -> Outcome:
    """One write, claimed and recorded in the ledger, with the arguments it runs with (a recorded edit's)."""
    actual = with_edited_args(run.registry, run.ledger, thread_id, plan)
    if actual is None:
        return _not_run(ARGS_CHANGED)
    return _reported(
        run.facts, plan, lambda: run_write(run.registry, run.ledger, thread_id, actual, run.max_chars, run.env)
    )


# One LangGraph task per call: a finished call's result is kept in the checkpoint and never re-run. Module-level,
# because LangGraph builds a task's runnable once for a function it can find by name, and anew on every call for
# a closure (langgraph/pregel/_call.py, `get_runnable_for_task`). (cast: langgraph's `task` overloads do not
# type-check a plain sync function under mypy.)
read_task: Any = task(name="tool_read")(cast(Any, read_call))
write_task: Any = task(name="tool_write")(cast(Any, write_call))


def make_execute_node(parts: LoopParts) -> RunnableCallable:
    """Sync and async twins (as LangGraph's ToolNode): under `ainvoke` the node awaits its tasks instead of
    holding an executor thread while they wait for one, which deadlocks once enough threads run at once."""
    settle_task = make_settle_task(parts)

    def shown(plan: CallPlan) -> CallPlan:
        """A task's input is reported by LangGraph (`tasks`, `debug` streams): the plan as the state holds it."""
        return for_state(parts.registry, plan)

    def execute(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        turn = _Turn(parts, state, runtime)
        if turn.early is not None:
            return turn.early
        for step in turn.steps():
            if isinstance(step, list):  # reads, at once
                if turn.lone_read(step):
                    turn.outcomes[step[0]["id"]] = read_call(shown(step[0]), turn.run)
                    continue
                futures = [(plan, read_task(shown(plan), turn.run)) for plan in step]
                turn.outcomes.update({plan["id"]: future.result() for plan, future in futures})
                continue
            masked = shown(step)
            outcome = write_task(turn.thread_id, masked, turn.run).result()
            settled = (
                settle_task(turn.thread_id, masked, outcome, True, turn.env).result() if _unknown(outcome) else None
            )
            turn.record_write(step, outcome, settled)
        return turn.update()

    async def aexecute(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        # The turn's admission and its answers use the ledger: in place or on a thread (`ledger_call`).
        turn = await parts.ledger_call(_Turn, parts, state, runtime)
        if turn.early is not None:
            return turn.early
        for step in turn.steps():
            if isinstance(step, list):  # reads, at once
                if turn.lone_read(step):
                    turn.outcomes[step[0]["id"]] = await asyncio.to_thread(read_call, shown(step[0]), turn.run)
                    continue
                results = await asyncio.gather(*(read_task(shown(plan), turn.run) for plan in step))
                turn.outcomes.update({plan["id"]: result for plan, result in zip(step, results, strict=True)})
                continue
            masked = shown(step)
            outcome = await write_task(turn.thread_id, masked, turn.run)
            settled = await settle_task(turn.thread_id, masked, outcome, True, turn.env) if _unknown(outcome) else None
            turn.record_write(step, outcome, settled)
        return await parts.ledger_call(turn.update)

    return RunnableCallable(execute, aexecute, name="execute", trace=False)  # traced once, by LangGraph (gate_node)


class _Turn:
    """One `execute` step: what may run, the outcomes in the model's order, and the resulting update.

    Consecutive reads run concurrently; a write is a barrier and runs alone, and an unknown write outcome is
    settled before the next write starts, so writes happen in the model's order even after a crash.

    The stop checks (cancel, deadline) cost nothing extra per step: only when one fires is the ledger read, for
    writes of this turn that already started, which are then settled before the stop answers the rest.
    """

    def __init__(self, parts: LoopParts, state: GatedState, runtime: Runtime):
        self.parts = parts
        self.facts = RunFacts.of(runtime)
        self.thread_id = self.facts.thread_id
        self.counters: RequestCounters = {**state["counters"]}
        self.seen_reads = state.get("seen_reads") or {}
        self.outcomes: dict[str, Outcome] = {}
        self.unsettled: list[str] = []
        self.waited_s = 0.0
        self.not_run: list[CallPlan] = []
        self.sent_back: str | None = None  # a write whose claim could not take its terms: back to a person
        self.calls, self.runnable = self._admitted(state.get("calls") or [])
        self.stop: tuple[Status, str] | None = None
        self.settle_first = 0
        self.early = self._early_exit()
        self.env = ToolEnv.of(state, runtime, parts.registry.bindable(), parts.middleware)
        self.run = CallRun(parts.registry, parts.ledger, parts.limits.max_result_chars, self.env, self.facts)

    def _admitted(self, calls: list[CallPlan]) -> tuple[list[CallPlan], list[CallPlan]]:
        """Each call the state marks runnable, admitted again from the evidence (see module docstring and
        nodes/gate/turn_evidence.py for why `approve` admitting it is not enough)."""
        turn = admit_turn(self.parts.registry, self.parts.ledger, self.thread_id, calls, "run")
        self.refused: list[ToolMessage] = turn.refused
        admitted: list[CallPlan] = []
        runnable: list[CallPlan] = []
        for plan, admission in turn.admissions:
            if admission is None:
                admitted.append(plan)
            elif admission.action in ("answered", "refuse"):
                admitted.append({**plan, "verdict": "answered"})
            elif admission.action == "ask":
                admitted.append(for_state(self.parts.registry, {**admission.plan, "verdict": "ask"}))
            else:
                admitted.append(for_state(self.parts.registry, admission.plan))
                runnable.append(admission.plan)
        return admitted, runnable

    def _early_exit(self) -> dict[str, Any] | None:
        if any(c["verdict"] == "ask" for c in self.calls):
            return {"calls": self.calls, **self._answers(self.refused)}
        self.stop = self.parts.stop_before_work(self.thread_id, self.counters, tokens=False)
        if self.stop is not None:
            self.settle_first = self._through_last_started_write()
        return None

    def _through_last_started_write(self) -> int:
        """How many runnable calls to take through the usual path under a stop: up to the last write that already
        started (reads before it ran before it, and replay from their tasks), so that each started write reaches
        the same settle task, with the same question and answer, as it would without the stop."""
        started = started_calls(self.parts.ledger, self.thread_id)
        hits = [i + 1 for i, plan in enumerate(self.runnable) if plan["effect"] == "write" and plan["id"] in started]
        return hits[-1] if hits else 0

    def lone_read(self, batch: list[CallPlan]) -> bool:
        """The turn runs one call, a read: it runs in the node itself, not as a task. A task keeps a finished
        call from running again when a sibling fails or the node re-runs after a settle question; a lone read has
        neither, and a task's thread hand-off and stored result were a fifth of a read round's time."""
        return len(batch) == 1 and len(self.runnable) == 1

    def steps(self) -> Iterator[list[CallPlan] | CallPlan]:
        """The one schedule the sync and the async driver follow: consecutive reads as one batch (a list), each
        write alone, in the model's order. The next step is taken only once the driver has recorded the last
        one's outcomes, so a stop is weighed again with what has run (`to_run`)."""
        batch: list[CallPlan] = []
        for plan in self.to_run():
            if plan["effect"] == "read":
                batch.append(plan)
                continue
            if batch:
                yield batch
                batch = []
            yield plan
        if batch:
            yield batch

    def to_run(self) -> Iterator[CallPlan]:
        """The calls to run, in the model's order. Under a stop, the started writes (`settle_first`) are settled
        first; then the stop is weighed again, the deadline without the time their settling waited for a person,
        and if it still holds, the calls not yet started are answered "not run" (`not_run`)."""
        for index, plan in enumerate(self.runnable):
            if self.sent_back is not None:
                return
            if self.stop is not None and index == self.settle_first and self._still_stopped(index):
                return
            yield plan
        if self.stop is not None and len(self.runnable) == self.settle_first:
            self._still_stopped(len(self.runnable))

    def _still_stopped(self, index: int) -> bool:
        if self.stop is not None and self.stop[0] == "deadline":
            self.stop = self.parts.past_deadline(self.counters, self.waited_s)
        if self.stop is not None:
            self.runnable, self.not_run = self.runnable[:index], self.runnable[index:]
        return self.stop is not None

    def _answers(self, messages: list[ToolMessage], events: Sequence[AuditEvent] = ()) -> dict[str, Any]:
        return record_answers(self.parts.ledger, self.thread_id, messages, "execute", events)

    def record_write(self, plan: CallPlan, outcome: Outcome, settled: dict[str, Any] | None) -> None:
        if outcome.get("error_type") == SENT_BACK_ERROR:
            self.sent_back = plan["id"]
            return
        if settled is not None:
            outcome = settled["outcome"]
            self.waited_s += settled.get("waited_s", 0.0)  # absent from a task result stored by an older version
            if settled["left_open"]:
                self.unsettled.append(plan["id"])
        self.outcomes[plan["id"]] = outcome

    def _held_back(self) -> dict[str, Verdict]:
        """The call sent back to a person (`ask`) and the calls after it, not run (`run`: admitted again after her
        decision); taken out of `runnable`, which keeps the calls that ran."""
        if self.sent_back is None:
            return {}
        index = next(i for i, plan in enumerate(self.runnable) if plan["id"] == self.sent_back)
        waiting, self.runnable = self.runnable[index:], self.runnable[:index]
        return {plan["id"]: "ask" if plan["id"] == self.sent_back else "run" for plan in waiting}

    def update(self) -> dict[str, Any]:
        counters = self.counters
        held = self._held_back()
        if held:
            counters["paused_at"] = self.parts.clock()  # a person's time is not the request's (as after validate)
        answers: list[ToolMessage] = []
        events: list[AuditEvent] = []
        looped: CallPlan | None = None
        seen: dict[str, SeenRead] = {}
        per_tool = dict(counters["per_tool"])
        for place, plan in enumerate(self.runnable, start=counters["tool_calls"]):
            outcome = self.outcomes[plan["id"]]
            per_tool[plan["name"]] = per_tool.get(plan["name"], 0) + 1
            content = outcome["content"]
            if _in_a_row(self.seen_reads, seen, plan, outcome, place) >= self.parts.limits.max_identical_reads:
                looped = looped or plan
            shown = self.parts.registry.policy(plan["name"]).masked(plan["args"])
            answers.append(_message(plan, shown, outcome, content))
            events.append(AuditEvent(plan["id"], "executed", _audit(plan, shown, outcome)))
            if outcome.get("error_type") == "call_changed":
                events.append(AuditEvent(plan["id"], "call_changed", {"tool": plan["name"], "refusal": content}))
        counters["tool_calls"] += len(self.runnable)
        counters["per_tool"] = per_tool
        counters["waited_s"] += self.waited_s
        update: dict[str, Any] = {
            "calls": _answered(self.calls, held),
            "counters": counters,
            **self._answers([*self.refused, *answers, *self._stopped_answers()], events),
        }
        if seen:
            update["seen_reads"] = seen
        if self.unsettled:
            update.update(stop="needs_attention", stop_detail="a write's outcome is unknown and was left to a person")
        elif self.stop is not None:
            update.update(stop=self.stop[0], stop_detail=self.stop[1])
        elif looped is not None:
            update.update(
                stop="loop_detected",
                stop_detail=LOOP_DETAIL.format(tool=looped["name"], times=self.parts.limits.max_identical_reads),
            )
        return update

    def _stopped_answers(self) -> list[ToolMessage]:
        """The calls a stop left unstarted, each answered "not run" with the stop's name."""
        if self.stop is None:
            return []
        failure = errors.stopped_before_run(*self.stop)
        return [error_message(c["id"], c["name"], failure) for c in self.not_run]


def _not_run(reason: str) -> Outcome:
    return error_outcome(errors.invalid_arguments(reason))


def _unknown(outcome: Outcome) -> bool:
    return outcome["status"] == "unknown"


def _reported(facts: RunFacts, plan: CallPlan, run: Callable[[], Outcome]) -> Outcome:
    """Custom stream events around one call, for live progress (`stream_mode="custom"`)."""
    write = facts.write
    write({"event": "tool_started", "tool_call_id": plan["id"], "tool": plan["name"], "effect": plan["effect"]})
    outcome = run()
    log.info(
        "tool call thread=%s call=%s tool=%s decision=%s outcome=%s duration_ms=%.1f",
        facts.thread_id,
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


def _in_a_row(
    before: dict[str, SeenRead], seen: dict[str, SeenRead], plan: CallPlan, outcome: Outcome, place: int
) -> int:
    """How many times in a row, this one included, this read ran with these arguments and returned this result.

    The articles' loop: the same tool, the same arguments, one call right after the other, the same result. "In a
    row" means no other call ran in between in this request (`place` is this call's place among them), so a read
    repeated after a write, or after another read, starts again at 1: what ran in between may have changed its
    result, and the model asked again for a reason. Only a successful read counts: a failure is no result to
    repeat, and the step budgets bound a failing tool; a write keeps its own protection (its approval, at most once
    per call id). `before` is what the request's earlier steps stored; `seen` collects this step's entries (the
    only thing the step stores), so a later call of the same step sees an earlier one.
    """
    if outcome["status"] != "ok" or plan["effect"] != "read":
        return 0
    key = fingerprint(plan["name"], plan["args"])
    result = digest(outcome["content"])
    previous = seen.get(key) or before.get(key)
    repeats = 0
    if previous is not None and previous.get("at") == place - 1 and previous["result"] == result:
        repeats = previous["repeats"] + 1
    seen[key] = {"result": result, "repeats": repeats, "at": place}
    return repeats + 1


def _message(plan: CallPlan, shown_args: dict[str, Any], outcome: Outcome, content: str) -> ToolMessage:
    """The call's answer; an edited call says what it ran with, secret arguments masked (the model, the history
    and every stream carry this message)."""
    if outcome["status"] != "ok":
        return tool_message(plan["id"], plan["name"], outcome["status"], content)
    if plan.get("edited"):
        content = edited_result(content, shown_args)
    return result_message(plan["id"], plan["name"], content)


def _answered(calls: list[CallPlan], held: dict[str, Verdict]) -> list[CallPlan]:
    """Every call this step ran or answered; those `held` back wait with their verdict."""
    return [{**c, "verdict": held.get(c["id"], "answered")} if c["verdict"] == "run" else c for c in calls]


def _audit(plan: CallPlan, shown_args: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    return {
        "tool": plan["name"],
        "args": shown_args,
        "outcome": outcome["status"],
        "error_type": outcome.get("error_type"),
        "duration_ms": outcome["duration_ms"],
        "result_chars": len(outcome["content"]),
        "reused": outcome.get("reused", False),
    }
