"""A middleware's `wrap_tool_call` around one tool run, under the gate: after validation, approval and (for a
write) the ledger claim, inside the run's timeout.

The wrapper may retry a read, shape a result, or answer in the tool's place. It may not change the call (name,
arguments at any depth, id, tool: those are what was decided; invariant 16). Each middleware gets its own deep copy
of the call, and every request a middleware hands to its handler is compared with that copy: a change is refused
with an error that names the middleware, nothing runs, and the refusal is the call's answer whatever the wrapper
makes of it. The tool itself never receives the wrapper's arguments: it runs the decided ones, checked again by
digest as it is called (run/decided_args.py). A wrapper cannot run a write twice: the handler runs a write's tool
at most once, and if that one run raised, its exception is the write's outcome whatever the wrapper answers (so a
lost connection stays an unknown outcome, settled as always, never a plain failure the model might retry). A
wrapper's own error answer reaches the model as the generic tool error (invariant 5).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from gatedloop.nodes.run.tool_env import ToolEnv
from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors
from gatedloop.tools.arguments import digest
from gatedloop.tools.results import to_json_text

log = logging.getLogger("gatedloop.execute")

CALL_CHANGED = (
    "Not run: middleware {name!r} changed the call it was given ({what}); gatedloop runs only the call that was "
    "decided."
)
WRITE_ONCE = "a write runs at most once; a middleware asked to run it again"
COMMAND_ANSWER = "a middleware answered with a langgraph Command; gatedloop does not apply Commands"


def run_wrapped(
    env: ToolEnv,
    plan: CallPlan,
    tool: BaseTool,
    shown_args: dict[str, Any],
    config: RunnableConfig,
    run_tool: Callable[[], Any],
) -> Any:
    """`run_tool` (the tool itself, on the decided arguments) as the middleware's composed `wrap_tool_call` lets it
    run; the result."""
    write = plan["effect"] == "write"
    call = {"name": plan["name"], "args": copy.deepcopy(shown_args), "id": plan["id"], "type": "tool_call"}
    given = {key: digest(call[key]) for key in ("name", "args", "id", "type")}
    request = ToolCallRequest(tool_call=call, tool=tool, state=env.state, runtime=env.runtime(config, plan["id"]))  # type: ignore[arg-type]
    runs: list[tuple[bool, Any]] = []
    answers: dict[int, Any] = {}
    refusals: list[errors.ToolFailure] = []

    def handed_on(name: str, req: ToolCallRequest) -> None:
        what = _changed(req, tool, given)
        if what is not None:
            refusal = errors.ToolFailure(CALL_CHANGED.format(name=name, what=what), error_type="call_changed")
            log.warning("tool %s (call %s): %s", plan["name"], plan["id"], refusal.message)
            refusals.append(refusal)
            raise refusal

    def execute(req: ToolCallRequest) -> ToolMessage:
        if write and runs:
            raise errors.ToolFailure(WRITE_ONCE, error_type="tool_error")
        try:
            result = run_tool()
        except BaseException as exc:
            runs.append((False, exc))
            raise
        runs.append((True, result))
        message = ToolMessage(content=to_json_text(result), tool_call_id=plan["id"], name=plan["name"])
        answers[id(message)] = result
        return message

    wrap = env.tool_wrapper(handed_on)
    try:
        answer = wrap(request, execute)
    except BaseException:
        _reraise_write_failure(write, runs)
        _reraise_refusal(refusals, runs)
        raise
    _reraise_write_failure(write, runs)
    _reraise_refusal(refusals, runs)
    if isinstance(answer, ToolMessage) and id(answer) in answers:
        return answers[id(answer)]
    if isinstance(answer, Command):
        raise errors.ToolFailure(COMMAND_ANSWER, error_type="tool_error")
    if not isinstance(answer, ToolMessage):
        raise TypeError(f"wrap_tool_call returned {type(answer).__name__}, not a ToolMessage")
    if answer.status == "error":
        log.warning("tool %s (call %s): a middleware answered an error: %s", plan["name"], plan["id"], answer.text)
        raise errors.ToolFailure(errors.GENERIC_TOOL_ERROR, error_type="tool_error")
    return answer.content


def _changed(request: Any, tool: BaseTool, given: dict[str, str]) -> str | None:
    """What a middleware changed in the call it hands on, or None: the tool, or the call's name, arguments (by
    digest, so a nested change or `1` -> `True` counts), id or type."""
    if not isinstance(request, ToolCallRequest) or request.tool is not tool:
        return "the tool"
    call: Any = request.tool_call
    if not isinstance(call, dict):
        return "the call"
    for key, was in given.items():
        if key not in call or digest(call[key]) != was:
            return "the arguments" if key == "args" else f"the call's {key}"
    return None


def _reraise_write_failure(write: bool, runs: list[tuple[bool, Any]]) -> None:
    """A write's one real run raised: that exception is its outcome, whatever the wrapper made of it."""
    if write and runs and not runs[0][0]:
        raise runs[0][1]


def _reraise_refusal(refusals: list[errors.ToolFailure], runs: list[tuple[bool, Any]]) -> None:
    """A changed call was refused and nothing ran: the refusal is the answer, whatever the wrapper made of it."""
    if refusals and not runs:
        raise refusals[0]
