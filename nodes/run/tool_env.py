"""One tool run as part of the run it belongs to: its injected arguments and the run's own config.

Tools get what LangGraph's `ToolNode` gives them (`ToolRuntime` with state, context, store, config, stream writer
and call id; `InjectedState`, `InjectedStore`, `InjectedToolCallId`), and run with the config of the task that runs
them, so callbacks and LangSmith traces show each tool run under `execute`, tagged with the call id, its effect,
the decision and the reviewer.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore
from langgraph.types import Command, StreamWriter

from gatedloop.checkpoints.running_step import step_config
from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors
from gatedloop.tools.injection import Injections

COMMAND_RETURNED = (
    "tool {name!r} returned a langgraph Command; gatedloop does not apply Commands from tools (they would write "
    "graph state past validate/approve). Return a value instead."
)


@dataclass(frozen=True)
class ToolEnv:
    """What the `execute` node hands each tool task: the state and runtime the tool may ask for."""

    state: Any
    context: Any
    store: BaseStore | None
    stream_writer: StreamWriter
    tools: tuple[BaseTool, ...] = ()
    tool_wrapper: Any = None
    """The middleware's `checked_tool_wrapper` (nodes/build/middleware.py), or None when no middleware wraps tool
    calls: given the check for each request a middleware hands on, their composed `wrap_tool_call`
    (nodes/run/wrapped_run.py). Held as a function so this module never imports `langchain`."""

    @classmethod
    def of(cls, state: Any, runtime: Runtime, tools: Sequence[BaseTool], middleware: Any = None) -> ToolEnv:
        """With tool wrappers, the state they (and the tools) see is a deep copy: a wrapper that changes it in place
        changes neither the thread nor a plan this turn has still to run."""
        wrapper = middleware.checked_tool_wrapper if middleware is not None and middleware.tool_wrappers else None
        if wrapper is not None:
            state = copy.deepcopy(state)
        return cls(state, runtime.context, runtime.store, runtime.stream_writer, tuple(tools), wrapper)

    def runtime(self, config: RunnableConfig, call_id: str) -> ToolRuntime:
        """The `ToolRuntime` a tool (or a middleware's `wrap_tool_call`) is given, as `ToolNode` builds it."""
        return ToolRuntime(
            state=self.state,
            context=self.context,
            config=config,
            stream_writer=self.stream_writer,
            tool_call_id=call_id,
            store=self.store,
            tools=list(self.tools),
        )


def tool_config(plan: CallPlan) -> RunnableConfig:
    """The calling task's config (callbacks, tracing) plus tags and metadata that say which call this is."""
    decision = plan.get("decision") or ("approve" if "approved_digest" in plan else "auto")
    reviewer = plan.get("decided_by")
    metadata = {
        "gatedloop_tool_call_id": plan["id"],
        "gatedloop_effect": plan["effect"],
        "gatedloop_decision": decision,
        "gatedloop_reviewer": reviewer,
    }
    tags = [f"tool_call_id:{plan['id']}", f"effect:{plan['effect']}", f"decision:{decision}"]
    if reviewer:
        tags.append(f"reviewer:{reviewer}")
    config: dict[str, Any] = {k: v for k, v in step_config().items() if k != "run_id"}  # the task's run id
    config["run_name"] = plan["name"]
    config["tags"] = [*(config.get("tags") or []), *tags]
    config["metadata"] = {**(config.get("metadata") or {}), **metadata}
    return cast(RunnableConfig, config)


def tool_input(
    tool: BaseTool,
    wanted: Injections,
    plan: CallPlan,
    args: dict[str, Any],
    env: ToolEnv | None,
    config: RunnableConfig,
) -> Any:
    """The tool's input: the checked arguments plus what it asks to be injected, as a ToolCall when it wants
    its call id (langchain-core fills `InjectedToolCallId` only then)."""
    if not wanted.any or env is None:
        return args
    injected: dict[str, Any] = {}
    state = env.state if isinstance(env.state, dict) else {}
    for param, field in wanted.args.state.items():
        if field is None:
            injected[param] = env.state
        elif field in state:
            injected[param] = state[field]
        elif param not in wanted.args._optional_state_args:
            raise KeyError(f"tool {tool.name!r} asks for state field {field!r}, which the state does not have")
    if wanted.args.store:
        if env.store is None:
            raise ValueError(f"tool {tool.name!r} needs a store: pass build_graph(..., store=...)")
        injected[wanted.args.store] = env.store
    if wanted.args.runtime:
        injected[wanted.args.runtime] = env.runtime(config, plan["id"])
    full = {**args, **injected}
    if wanted.tool_call_id:
        return {"type": "tool_call", "id": plan["id"], "name": plan["name"], "args": full}
    return full


def tool_output(name: str, output: Any) -> Any:
    """A tool invoked as a ToolCall answers with a ToolMessage: its content is the result. A Command is refused."""
    if isinstance(output, Command) or (isinstance(output, list) and any(isinstance(o, Command) for o in output)):
        raise errors.ToolFailure(COMMAND_RETURNED.format(name=name), error_type="tool_error")
    if isinstance(output, ToolMessage):
        if output.status == "error":
            raise errors.ToolFailure(output.text or "the tool reported an error", error_type="tool_error")
        return output.content
    return output
