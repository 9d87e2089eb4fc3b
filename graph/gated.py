"""The compiled graph `build_graph` returns: LangGraph's own, with identity bound to each act as it enters.

Every way into a run ends in `stream` or `astream` (`invoke`, `ainvoke`, `stream_events`, `astream_events`,
LangGraph Server and Aegra, `gatedloop.graph.runs`), so this is the one place the runtime identity is read
(invariants 10 and 13). Who is calling (the server's authenticated user, else the runtime context) is bound as
data to what the call carries:

- a new human message: the request's `requester`, a state field written with the message (a client's value for
  it is replaced; `update_state` cannot set it: it is one of `OWN_FIELDS`, with the model's kept view);
- an answer (`Command(resume=...)`): its sender, wrapped around the value (nodes/wire/senders.py), stored by
  LangGraph with it before any node reads it;
- the runtime context the tools see: under server auth, its identity fields are the authenticated user's; an
  answer that brings no value for a field of the graph's `context_schema` gets the request's (graph/contexts.py).

And a run is refused (`GraphMismatch`, nothing run) unless this graph, its policies included, is the one that made
the thread (invariant 11, graph/thread_graph.py): so a served graph, which the server runs without `runs.*`, is held
to it too.

The nodes never read who is running the graph; they read these. (With telemetry on, an answer's run is also given
the trace context its question kept, so it continues that trace: graph/resumed_trace.py.)

`OWN_FIELDS` are state fields only gatedloop writes: a client's value for one is dropped from run input, a command's
`update` and every `update_state` (invariants 13 and 18), whatever node it is written as.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import InvalidUpdateError
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, StateUpdate

from gatedloop.graph.contexts import kept_fields, missing_fields, reused_fields
from gatedloop.graph.resumed_trace import aresumed_config, resumed_config
from gatedloop.graph.thread_graph import aledger_of, claim_thread
from gatedloop.nodes.build.parts import ledger_call
from gatedloop.nodes.state import REQUESTER_FIELD
from gatedloop.nodes.wire.identity import authenticated_context, caller_context, stored_identity
from gatedloop.nodes.wire.model_view import MODEL_VIEW_FIELD
from gatedloop.nodes.wire.senders import bind_sender
from gatedloop.tools.policy import CallContext

OWN_FIELDS = frozenset({REQUESTER_FIELD, MODEL_VIEW_FIELD})
"""Who sent a request's message (bound here as it enters) and the view of the thread `model` kept for the model."""


class GatedGraph(CompiledStateGraph):
    """A `CompiledStateGraph` whose entry points bind the caller's identity to the input (see the module)."""

    def stream(
        self, input: Any, config: RunnableConfig | None = None, *, context: Any = None, **kwargs: Any
    ) -> Iterator[Any]:
        thread_id = self._saved_thread(config)
        if thread_id is not None:
            claim_thread(self, thread_id)
        if _carries_no_message(input) and missing_fields(context, self.context_schema):
            context = reused_fields(context, self.context_schema, _kept(self._request_values(config)))
        config = resumed_config(self, thread_id, input, config)
        input, context = self._bound(input, config, context)
        return super().stream(input, config, context=context, **kwargs)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, *, context: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        thread_id = self._saved_thread(config)
        if thread_id is not None:
            await ledger_call(await aledger_of(self), claim_thread, self, thread_id)
        if _carries_no_message(input) and missing_fields(context, self.context_schema):
            context = reused_fields(context, self.context_schema, _kept(await self._arequest_values(config)))
        config = await aresumed_config(self, thread_id, input, config)
        input, context = self._bound(input, config, context)
        async for chunk in super().astream(input, config, context=context, **kwargs):
            yield chunk

    def bulk_update_state(self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]) -> RunnableConfig:
        return super().bulk_update_state(config, _without_own_fields(supersteps))

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        return await super().abulk_update_state(config, _without_own_fields(supersteps))

    def _saved_thread(self, config: RunnableConfig | None) -> str | None:
        """The thread a run over this graph's own checkpointer is for: the one the graph that made it must run."""
        if not isinstance(self.checkpointer, BaseCheckpointSaver):
            return None  # a subgraph, or a graph without memory: no thread of its own
        thread_id = (merge_configs(self.config, config).get("configurable") or {}).get("thread_id")
        return str(thread_id) if thread_id else None

    def _request_values(self, config: RunnableConfig | None) -> Mapping[str, Any]:
        """The thread's state, to reuse its request's context fields; nothing when there is no thread to read."""
        if config is None or not _has_thread(config):
            return {}
        return self.get_state(config).values

    async def _arequest_values(self, config: RunnableConfig | None) -> Mapping[str, Any]:
        if config is None or not _has_thread(config):
            return {}
        return (await self.aget_state(config)).values

    def _bound(self, input: Any, config: RunnableConfig | None, context: Any) -> tuple[Any, Any]:
        merged = merge_configs(self.config, config)
        context = authenticated_context(context, self.context_schema, merged)
        return bound_input(input, caller_context(context, merged), context), context


def bound_input(input: Any, caller: CallContext, context: Any) -> Any:
    """`input` with `caller` bound to the messages and answers it carries (`context`: the run's context, whose
    fields are kept with a new request)."""
    if isinstance(input, Command):
        resume = bind_sender(input.resume, caller) if input.resume is not None else None
        return dataclasses.replace(input, resume=resume, update=_update_with_requester(input, caller, context))
    if isinstance(input, Mapping):
        return _with_requester(input, caller, context)
    return input


def _requester(caller: CallContext, context: Any) -> dict[str, Any]:
    """What a new message's requester holds: the caller's identity and the context fields answers may reuse."""
    return {**stored_identity(caller), "context": kept_fields(context)}


def _with_requester(values: Mapping[str, Any], caller: CallContext, context: Any) -> dict[str, Any]:
    """Values with the requester set when they carry messages (a request's requester is who sent its message),
    and a client's own `OWN_FIELDS` dropped either way."""
    kept = _without_own(values)
    return {**kept, REQUESTER_FIELD: _requester(caller, context)} if kept.get("messages") else kept


def _update_with_requester(command: Command, caller: CallContext, context: Any) -> Any:
    """A command's `update` (a dict, or LangGraph's list of (key, value) pairs) with the requester bound."""
    if command.update is None:
        return None
    if isinstance(command.update, Mapping):
        return _with_requester(command.update, caller, context)
    pairs = _pairs_without_own(command)
    if any(key == "messages" for key, _ in pairs):
        pairs.append((REQUESTER_FIELD, _requester(caller, context)))
    return pairs


def _carries_no_message(input: Any) -> bool:
    """An answer or a plain continuation: a run whose context may lack the request's fields."""
    if input is None:
        return True
    return isinstance(input, Command) and not any(key == "messages" for key, _ in input._update_as_tuples())


def _has_thread(config: RunnableConfig) -> bool:
    return bool((config.get("configurable") or {}).get("thread_id"))


def _kept(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The context fields kept with the pending request's requester."""
    requester = values.get(REQUESTER_FIELD)
    kept = requester.get("context") if isinstance(requester, Mapping) else None
    return kept if isinstance(kept, Mapping) else {}


def _without_own_fields(supersteps: Sequence[Sequence[StateUpdate]]) -> list[list[StateUpdate]]:
    """State updates without `OWN_FIELDS`, in every form a node's output may take (a dict, a `Command`, a list of
    them): only a message entering through `stream` says who asked, and only `model` keeps a view."""
    return [[StateUpdate(_written(values), *where) for values, *where in step] for step in supersteps]


def _written(values: Any) -> Any:
    """One write as LangGraph reads a node's output, without `OWN_FIELDS`; an object it would read by its
    attributes (a dataclass, a pydantic model) that holds one is refused, as it cannot be written without it."""
    if isinstance(values, Mapping):
        return _without_own(values)
    if isinstance(values, Command) and values.update is not None:
        return dataclasses.replace(values, update=_pairs_without_own(values))
    if isinstance(values, list | tuple):
        return [_written(v) for v in values]
    if any(getattr(values, field, None) is not None for field in OWN_FIELDS):
        raise InvalidUpdateError(f"a state write cannot set {', '.join(sorted(OWN_FIELDS))}: only gatedloop does")
    return values


def _without_own(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in OWN_FIELDS}


def _pairs_without_own(command: Command) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in command._update_as_tuples() if key not in OWN_FIELDS]
