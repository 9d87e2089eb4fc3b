"""`build_graph`: the five nodes wired on the presence of tool calls, compiled with a checkpointer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.store.base import BaseStore
from pydantic import BaseModel

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.ledger_for import ledger_for
from gatedloop.graph.contexts import unreachable_roles
from gatedloop.graph.gated import GatedGraph
from gatedloop.graph.models import bind_loop_tools
from gatedloop.graph.parts_of import parts_of, remember_parts
from gatedloop.graph.routing import after_approve, after_execute, after_model, after_validate, edge
from gatedloop.graph.telemetry import telemetry_for
from gatedloop.nodes.approve import make_approve_node
from gatedloop.nodes.build.parts import LoopParts, SystemPrompt
from gatedloop.nodes.execute import make_execute_node
from gatedloop.nodes.finalize import make_finalize_node
from gatedloop.nodes.limits import Limits
from gatedloop.nodes.model import make_model_node
from gatedloop.nodes.provider.answer_format import AnswerFormat
from gatedloop.nodes.state import GatedState, InputState, OutputState
from gatedloop.nodes.validate import make_validate_node
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from langchain.agents.structured_output import ToolStrategy  # the optional `middleware` extra


def build_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    policies: Mapping[str, ToolPolicy] | None = None,
    limits: Limits | None = None,
    checkpointer: BaseCheckpointSaver | None = None,
    ledger: Ledger | None = None,
    store: BaseStore | None = None,
    system_prompt: SystemPrompt | None = None,
    response_format: type[BaseModel] | Mapping[str, Any] | ToolStrategy[Any] | None = None,
    name: str = "gatedloop",
    context_schema: type[Any] = CallContext,
    middleware: Sequence[Any] = (),
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile the gated loop.

    The ledger (approvals, claims, audit) must be as durable as the checkpoints: by default it is the one inside
    gatedloop's savers, gatedloop's ledger in a plain `SqliteSaver`'s file, or in memory for an in-memory saver (or
    none, as under `langgraph dev`: pass `ledger=`); another saver is refused (`gatedloop.checkpoints.ledger_for`).
    `system_prompt` (a string, or a function of (state, context)) starts every model call and is never stored;
    `response_format` (a pydantic model or JSON schema, or LangChain's `ToolStrategy` of one) makes the final
    answer a validated `structured_response`;
    `store` is compiled into the graph and handed to tools (`ToolRuntime.store`, `InjectedStore`).
    `context_schema` is the runtime context's type, as in `create_agent` (Studio's context form, `Runtime.context`);
    whatever it is, the caller's identity is read from its `user_id` and `roles` (gatedloop.nodes.wire.identity).
    With a `checkpointer`, a schema without `roles` under policies that name roles is refused (no caller could hold
    one, `unreachable_roles`); a graph built without one (to be served) is not: the server's auth may give roles.
    `middleware` is a list of LangChain v1 `AgentMiddleware`, run where `create_agent` runs them, inside the gate
    (gatedloop.nodes.build.middleware): model hooks in `model` (after_agent in `finalize`), `wrap_tool_call` in
    the tool run after a write's claim; their `state_schema` fields join the state, their `tools` are ordinary
    tools under `policies`. What would walk around the gate (HumanInTheLoopMiddleware, a jump to 'tools') is
    refused here with the reason.
    `tracer_provider` and `meter_provider` (OpenTelemetry's, the `otel` extra) turn on spans and metrics; without
    them the standard `OTEL_*` variables may (gatedloop.graph.telemetry), and with neither nothing of OpenTelemetry
    is loaded.
    """
    limits = limits or Limits()
    stack = _middlewares(middleware)
    registry = ToolRegistry([*tools, *(stack.tools if stack else [])], policies)
    roles_problem = unreachable_roles(context_schema, registry.policies) if checkpointer is not None else None
    if roles_problem is not None:
        raise ValueError(roles_problem)
    if ledger is None:
        ledger = ledger_for(checkpointer)
    if system_prompt is not None and not (isinstance(system_prompt, str) or callable(system_prompt)):
        raise TypeError("system_prompt must be a string or a function of (state, context)")
    answer = AnswerFormat.of(response_format) if response_format is not None else None
    if answer is not None and answer.name in registry:
        raise ValueError(f"response_format's name {answer.name!r} is also a tool's name; give the schema a title")
    bound = (
        bind_loop_tools(model, [*registry.bindable(), answer.tool], tool_choice="any")
        if answer is not None
        else bind_loop_tools(model, registry.bindable())
    )
    parts = LoopParts(
        model=bound,
        registry=registry,
        limits=limits,
        ledger=ledger,
        system_prompt=system_prompt,
        answer_format=answer,
        context_schema=context_schema,
        middleware=stack,
        model_call=stack.model_call(model, answer.tool if answer else None) if stack else None,
        telemetry=telemetry_for(name, tracer_provider, meter_provider),
    )
    return _compile(parts, checkpointer, store, name)


def _middlewares(middleware: Sequence[Any]) -> Any:
    """The checked middleware list, or None. LangChain's agents package is imported only when there is one."""
    if not middleware:
        return None
    from gatedloop.nodes.build.middleware import Middlewares, refusal

    why = refusal(middleware)
    if why is not None:
        raise (TypeError if why.startswith("middleware must be") else ValueError)(why)
    return Middlewares(middleware)


def _compile(
    parts: LoopParts, checkpointer: BaseCheckpointSaver | None, store: BaseStore | None, name: str
) -> CompiledStateGraph[Any, Any, Any, Any]:
    schema = parts.middleware.state_schema(GatedState) if parts.middleware else GatedState
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(
        schema, context_schema=parts.context_schema, input_schema=InputState, output_schema=OutputState
    )
    builder.add_node("model", make_model_node(parts))
    builder.add_node("validate", make_validate_node(parts))
    builder.add_node("approve", make_approve_node(parts))
    builder.add_node("execute", make_execute_node(parts))
    builder.add_node("finalize", make_finalize_node(parts))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", edge(after_model), ["validate", "finalize"])
    builder.add_conditional_edges("validate", edge(after_validate), ["approve", "execute", "model", "finalize"])
    builder.add_conditional_edges("approve", edge(after_approve), ["approve", "execute", "model"])
    builder.add_conditional_edges("execute", edge(after_execute), ["approve", "model", "finalize"])
    builder.add_edge("finalize", END)
    compiled = builder.compile(checkpointer=checkpointer, store=store, name=name)
    graph = GatedGraph(**{k: v for k, v in compiled.__dict__.items() if k != "__orig_class__"})  # as Pregel.copy
    remember_parts(graph, parts)
    # max_concurrency sizes LangGraph's task executor: its default (cores + 4) would run a turn's reads in
    # rounds (8 reads of 200 ms took 450 ms on 2 cores instead of about 240).
    limits = parts.limits
    traced: dict[str, Any] = {"callbacks": [parts.telemetry.handler]} if parts.telemetry is not None else {}
    return graph.with_config(
        recursion_limit=limits.recursion_limit(), max_concurrency=limits.max_concurrency(), **traced
    )


def with_saver(
    graph: CompiledStateGraph[Any, Any, Any, Any], checkpointer: BaseCheckpointSaver
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The same graph (model, tools, policies, limits, prompt, store, name) over `checkpointer`, with the ledger
    that saver's database holds: how the CLI and the inbox run a user's graph on `--db`."""
    parts = parts_of(graph)
    if parts is None:
        raise TypeError(f"{type(graph).__name__} is not a graph from gatedloop.graph.build_graph")
    return _compile(replace(parts, ledger=ledger_for(checkpointer)), checkpointer, graph.store, graph.name)
