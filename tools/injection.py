"""What LangChain v1 tools ask to be given rather than told: `ToolRuntime`, `InjectedState`, `InjectedStore`,
`InjectedToolCallId`; and the one idiom gatedloop refuses, a tool that returns a LangGraph `Command`.

gatedloop runs tools itself (validated, approved, claimed in the ledger, timed out in a thread), so it cannot hand
them to LangGraph's `ToolNode`; it injects what `ToolNode` injects, found by `ToolNode`'s own analysis of the tool
(`_get_all_injected_args`), and langchain-core fills `InjectedToolCallId` when a tool is invoked as a full ToolCall.
The model never sees these parameters (`tool_call_schema` leaves them out) and cannot supply them (the registry
refuses unknown keys before anything runs).
"""

from __future__ import annotations

import collections.abc
import types
import typing
from dataclasses import dataclass
from typing import Any

from langchain_core.tools import BaseTool, InjectedToolCallId
from langchain_core.tools.base import _is_injected_arg_type, get_all_basemodel_annotations
from langgraph.prebuilt.tool_node import _get_all_injected_args, _InjectedArgs
from langgraph.types import Command

COMMAND_REFUSED = (
    "tool {name!r} is annotated to return only langgraph Commands. gatedloop does not run such tools: a Command "
    "writes graph state and routes the graph, which would bypass validate/approve and could not be recorded in "
    "the execution ledger (a write's outcome must be a value, stored once per call id). Return the result as a "
    "value; keep what later calls need in the store (`runtime.store`, `InjectedStore`)."
)


@dataclass(frozen=True)
class Injections:
    """The parameters of one tool that gatedloop supplies, as LangGraph's ToolNode would."""

    args: _InjectedArgs
    tool_call_id: bool

    @property
    def any(self) -> bool:
        return bool(self.args.all_injected_keys) or self.tool_call_id or self.args.runtime is not None


def injections(tool: BaseTool) -> Injections:
    schema = tool.get_input_schema()
    wants_id = any(
        _is_injected_arg_type(hint, injected_type=InjectedToolCallId)
        for hint in get_all_basemodel_annotations(schema).values()
    )
    return Injections(_get_all_injected_args(tool), wants_id)


def returns_only_commands(tool: BaseTool) -> bool:
    """Whether the tool's function is annotated to return nothing but Commands (one, or a list of them): such a
    tool can never answer with a value. A tool that *may* return one (a union, as langchain-mcp-adapters'
    tools are annotated, though an MCP tool never does) is accepted; a Command it does return is a `tool_error`."""
    func = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    if func is None:
        return False
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: judge by what the tool returns when it runs
        return False
    hint = hints.get("return")
    return hint is not None and _only_commands(hint)


def _only_commands(hint: Any) -> bool:
    if hint is Command or (isinstance(hint, type) and issubclass(hint, Command)) or typing.get_origin(hint) is Command:
        return True
    origin, args = typing.get_origin(hint), [a for a in typing.get_args(hint) if a is not Ellipsis]
    if origin in (list, tuple, collections.abc.Sequence, typing.Union, types.UnionType) and args:
        return all(_only_commands(arg) for arg in args)
    return False
