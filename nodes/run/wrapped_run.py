"""A middleware's `wrap_tool_call` around one tool run, under the gate: after validation, approval and (for a
write) the ledger claim, inside the run's timeout.

The wrapper may retry a read, shape a result, or answer in the tool's place. It may not change the call (name,
arguments, id: those are what was validated and approved), and it cannot run a write twice: the handler it is
given runs a write's tool at most once, and if that one run raised, its exception is the write's outcome whatever
the wrapper answers (so a lost connection stays an unknown outcome, settled as always, never a plain failure the
model might retry). A wrapper's own error answer reaches the model as the generic tool error (invariant 5).
"""

from __future__ import annotations

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
from gatedloop.tools.results import to_json_text

log = logging.getLogger("gatedloop.execute")

CALL_CHANGED = "a middleware changed the call it was given; gatedloop runs only the call that was validated"
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
    """`run_tool` (the tool itself) as the middleware's composed `wrap_tool_call` lets it run; the result."""
    write = plan["effect"] == "write"
    call = {"name": plan["name"], "args": dict(shown_args), "id": plan["id"], "type": "tool_call"}
    request = ToolCallRequest(tool_call=call, tool=tool, state=env.state, runtime=env.runtime(config, plan["id"]))  # type: ignore[arg-type]
    runs: list[tuple[bool, Any]] = []
    answers: dict[int, Any] = {}

    def execute(req: ToolCallRequest) -> ToolMessage:
        if req.tool is not tool or dict(req.tool_call) != call:
            raise errors.ToolFailure(CALL_CHANGED, error_type="tool_error")
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

    try:
        answer = env.wrap_tool_call(request, execute)
    except BaseException:
        _reraise_write_failure(write, runs)
        raise
    _reraise_write_failure(write, runs)
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


def _reraise_write_failure(write: bool, runs: list[tuple[bool, Any]]) -> None:
    """A write's one real run raised: that exception is its outcome, whatever the wrapper made of it."""
    if write and runs and not runs[0][0]:
        raise runs[0][1]
