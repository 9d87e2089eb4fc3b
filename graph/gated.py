"""The compiled graph `build_graph` returns: LangGraph's own, with identity bound to each act as it enters.

Every way into a run ends in `stream` or `astream` (`invoke`, `ainvoke`, `stream_events`, `astream_events`,
LangGraph Server and Aegra, `gatedloop.graph.runs`), so this is the one place the runtime identity is read
(invariants 10 and 13). Who is calling (the server's authenticated user, else the runtime context) is bound as
data to what the call carries:

- a new human message: the request's `requester`, a state field written with the message (a client's value for
  it is replaced; `update_state` cannot set it);
- an answer (`Command(resume=...)`): its sender, wrapped around the value (nodes/gate/senders.py), stored by
  LangGraph with it before any node reads it;
- the runtime context the tools see: under server auth, its identity fields are the authenticated user's.

The nodes never read who is running the graph; they read these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, StateUpdate

from gatedloop.nodes.gate.identity import authenticated_context, caller_context, stored_identity
from gatedloop.nodes.gate.senders import bind_sender
from gatedloop.nodes.state import REQUESTER_FIELD
from gatedloop.tools.policy import CallContext


class GatedGraph(CompiledStateGraph):
    """A `CompiledStateGraph` whose entry points bind the caller's identity to the input (see the module)."""

    def stream(
        self, input: Any, config: RunnableConfig | None = None, *, context: Any = None, **kwargs: Any
    ) -> Iterator[Any]:
        input, context = self._bound(input, config, context)
        return super().stream(input, config, context=context, **kwargs)

    def astream(
        self, input: Any, config: RunnableConfig | None = None, *, context: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        input, context = self._bound(input, config, context)
        return super().astream(input, config, context=context, **kwargs)

    def bulk_update_state(self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]) -> RunnableConfig:
        return super().bulk_update_state(config, _without_requester(supersteps))

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        return await super().abulk_update_state(config, _without_requester(supersteps))

    def _bound(self, input: Any, config: RunnableConfig | None, context: Any) -> tuple[Any, Any]:
        merged = merge_configs(self.config, config)
        context = authenticated_context(context, self.context_schema, merged)
        return bound_input(input, caller_context(context, merged)), context


def bound_input(input: Any, caller: CallContext) -> Any:
    """`input` with `caller` bound to the messages and answers it carries."""
    if isinstance(input, Command):
        resume = bind_sender(input.resume, caller) if input.resume is not None else None
        update = _update_with_requester(input, caller)
        return dataclasses.replace(input, resume=resume, update=update)
    if isinstance(input, Mapping):
        return _with_requester(input, caller)
    return input


def _with_requester(values: Mapping[str, Any], caller: CallContext) -> dict[str, Any]:
    """Values with the requester set when they carry messages (a request's requester is who sent its message),
    and a client's own `requester` dropped either way."""
    kept = {k: v for k, v in values.items() if k != REQUESTER_FIELD}
    return {**kept, REQUESTER_FIELD: stored_identity(caller)} if kept.get("messages") else kept


def _update_with_requester(command: Command, caller: CallContext) -> Any:
    """A command's `update` (a dict, or LangGraph's list of (key, value) pairs) with the requester bound."""
    if command.update is None:
        return None
    if isinstance(command.update, Mapping):
        return _with_requester(command.update, caller)
    pairs = [(key, value) for key, value in command._update_as_tuples() if key != REQUESTER_FIELD]
    if any(key == "messages" for key, _ in pairs):
        pairs.append((REQUESTER_FIELD, stored_identity(caller)))
    return pairs


def _without_requester(supersteps: Sequence[Sequence[StateUpdate]]) -> list[list[StateUpdate]]:
    """State updates without `requester`: only a message entering through `stream` says who asked."""
    cleaned: list[list[StateUpdate]] = []
    for step in supersteps:
        updates: list[StateUpdate] = []
        for values, *where in step:
            if isinstance(values, Mapping) and REQUESTER_FIELD in values:
                values = {k: v for k, v in values.items() if k != REQUESTER_FIELD}
            updates.append(StateUpdate(values, *where))
        cleaned.append(updates)
    return cleaned
