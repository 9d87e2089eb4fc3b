"""LangChain v1 `AgentMiddleware` inside the gated loop: the hooks `create_agent` runs, in its order, in our nodes.

Model side (`before_agent`, `before_model`, `wrap_model_call`, `after_model`) runs inside `model`, `after_agent`
inside `finalize`. A hook's change to `messages` shapes what the model is sent (summarization, context editing,
redaction), never the stored thread: the thread is the gate's evidence (every call paired with its recorded
answer), so `show` and the checkpoints keep it whole. A rewrite of the thread's start (a summary) is kept as the
state's `model_view`, so the next request's hooks start from it as they would from `create_agent`'s rewritten
thread (nodes/wire/model_view.py). The one exception is the response itself: an `after_model`
hook may rewrite it (same id), and what it proposes then is what `validate` and the gate judge. Other state keys a
hook writes (`state_schema` extensions) are stored. Tool side (`wrap_tool_call`) runs under the gate, in
nodes/run/wrapped_run.py. What would walk around the gate is refused at `build_graph` (`refusal`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

# create_agent's own composition and schema merging, reused so the order rules are LangChain's (private names:
# pinned by `langchain>=1.2,<2`, and tests/test_middleware.py compares every behaviour with create_agent).
from langchain.agents.factory import (
    _chain_async_model_call_handlers,
    _chain_model_call_handlers,
    _chain_tool_call_wrappers,
    _get_can_jump_to,
    _resolve_schemas,
)
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.graph.message import add_messages
from langgraph.prebuilt.tool_node import ToolCallRequest

from gatedloop.nodes.provider.streamed_args import ainvoke_capturing, invoke_capturing

log = logging.getLogger("gatedloop.middleware")

HOOKS = ("before_agent", "before_model", "after_model", "after_agent")
HITL_REFUSED = (
    "HumanInTheLoopMiddleware: gatedloop's gate replaces it; "
    "use policies={'<tool>': ToolPolicy(effect='write', approval='always')} instead"
)
JUMP_REFUSED = (
    "{name}.{hook} can jump_to {where}: only 'end' is allowed (a jump to 'tools' or 'model' would skip validate "
    "or the checked response)"
)
ASYNC_ONLY_TOOL_WRAP = (
    "{name} has only awrap_tool_call: gatedloop runs tools in threads under the gate; give it a sync wrap_tool_call"
)


def _overrides(middleware: AgentMiddleware, hook: str) -> bool:
    """Whether the middleware implements `hook` (sync or async), as `create_agent` tells it (hand-written: there
    the test is inlined in `create_agent`'s body)."""
    cls = type(middleware)
    return getattr(cls, hook) is not getattr(AgentMiddleware, hook) or getattr(cls, f"a{hook}") is not getattr(
        AgentMiddleware, f"a{hook}"
    )


def refusal(middleware: Sequence[Any]) -> str | None:
    """Why this middleware list cannot run inside the gate, in one line; None if it can."""
    names = [getattr(m, "name", None) for m in middleware]
    if len(set(names)) != len(names):
        return "two middleware share a name; pass each middleware once"
    for m in middleware:
        if not isinstance(m, AgentMiddleware):
            return f"middleware must be LangChain AgentMiddleware instances, got {type(m).__name__}"
        if isinstance(m, HumanInTheLoopMiddleware):
            return HITL_REFUSED
        for hook in HOOKS:
            where = [j for j in _get_can_jump_to(m, hook) if j != "end"] if _overrides(m, hook) else []
            if where:
                return JUMP_REFUSED.format(name=m.name, hook=hook, where=" or ".join(repr(w) for w in where))
        cls = type(m)
        if cls.awrap_tool_call is not AgentMiddleware.awrap_tool_call and (
            cls.wrap_tool_call is AgentMiddleware.wrap_tool_call
        ):
            return ASYNC_ONLY_TOOL_WRAP.format(name=m.name)
    return None


AsyncModelWrap = Callable[[ModelRequest, Callable[[ModelRequest], Awaitable[ModelResponse]]], Awaitable[Any]]


def async_model_wrap(middleware: AgentMiddleware) -> AsyncModelWrap:
    """The middleware's `awrap_model_call`, or, for one with only the sync `wrap_model_call` (most are written so),
    that one run in a worker thread, the `handler` it calls awaiting the rest of the chain (the async model call)
    back on the event loop, as LangChain's async tool node runs a sync-only tool. LangChain's default
    `awrap_model_call` raises NotImplementedError, so under a server (which runs the graph async) every model call
    failed, naming no middleware. The thread runs in the caller's context (`asyncio.to_thread` copies it) and the
    handler in the thread's (a callback scheduled from a thread runs in that thread's context), so tracing and
    streaming callbacks still belong to the run."""
    if type(middleware).awrap_model_call is not AgentMiddleware.awrap_model_call:
        return middleware.awrap_model_call
    wrap = middleware.wrap_model_call

    async def off_the_loop(request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> Any:
        loop = asyncio.get_running_loop()

        def on_the_loop(handed: ModelRequest) -> ModelResponse:
            async def rest_of_the_chain() -> ModelResponse:
                return await handler(handed)

            return asyncio.run_coroutine_threadsafe(rest_of_the_chain(), loop).result()

        return await asyncio.to_thread(wrap, request, on_the_loop)

    return off_the_loop


class Middlewares:
    """A checked middleware list: its hooks in `create_agent`'s order and its composed wrappers (LangChain's own
    composition functions, so the first middleware is the outermost exactly as there)."""

    def __init__(self, middleware: Sequence[AgentMiddleware]):
        self.items = list(middleware)
        self.before_agent = [m for m in self.items if _overrides(m, "before_agent")]
        self.before_model = [m for m in self.items if _overrides(m, "before_model")]
        # create_agent chains after_model and after_agent nodes from the last middleware to the first.
        self.after_model = [m for m in reversed(self.items) if _overrides(m, "after_model")]
        self.after_agent = [m for m in reversed(self.items) if _overrides(m, "after_agent")]
        wrapping = [m for m in self.items if _overrides(m, "wrap_model_call")]
        self.wrap_model_call = _chain_model_call_handlers([m.wrap_model_call for m in wrapping])
        self.awrap_model_call = _chain_async_model_call_handlers([async_model_wrap(m) for m in wrapping])
        self.tool_wrappers = tuple((m.name, m.wrap_tool_call) for m in self.items if _overrides(m, "wrap_tool_call"))

    def checked_tool_wrapper(self, handed_on: HandedOn) -> ToolWrapper:
        """The composed `wrap_tool_call`, checking every request a middleware hands on (nodes/run/wrapped_run.py)."""
        return chain_checked_tool_wrappers(self.tool_wrappers, handed_on)

    @property
    def tools(self) -> list[BaseTool]:
        return [t for m in self.items for t in getattr(m, "tools", ())]

    def model_call(self, model: BaseChatModel, answer_tool: dict[str, Any] | None) -> ModelCall:
        return ModelCall(self, model, answer_tool)

    def hook_state(self, state: Any, messages: list[BaseMessage], protected: frozenset[str]) -> HookState:
        return HookState(state, messages, protected)

    def state_schema(self, base: type) -> type:
        """`base` with every middleware's `state_schema` fields, `base` winning a clash (as `create_agent`)."""
        return _resolve_schemas([*(m.state_schema for m in self.items), base])[0]


class HookState:
    """The state the hooks of one node see, as they would in `create_agent`'s separate nodes: each hook's update
    applied before the next runs (hand-written: create_agent makes each hook a graph node, which would put hooks
    between `model` and `validate`; here they run inside the node, so LangGraph's channels do not apply them).
    `messages` changes stay here (the model's view); other keys are also kept in `stored`, the node's update
    (a key with a reducer receives the node's last write, once). The hooks get a deep copy: a hook (or a
    `wrap_model_call`, handed these messages) that changes a message or a plan in place changes neither the stored
    thread nor the gate's state."""

    def __init__(self, state: Any, messages: list[BaseMessage], protected: frozenset[str]):
        self.protected = protected
        self.state: dict[str, Any] = copy.deepcopy({**state, "messages": list(messages)})
        self.stored: dict[str, Any] = {}
        self.jumped_to_end = False

    @property
    def messages(self) -> list[BaseMessage]:
        return cast(list[BaseMessage], self.state["messages"])

    def final_reply(self, existing_ids: set[str | None]) -> AIMessage | None:
        """After a hook jumped to the end before the model was called: the answer it left (a new AI message
        without tool calls, as `ModelCallLimitMiddleware` writes), or None."""
        last = self.messages[-1] if self.messages else None
        new = isinstance(last, AIMessage) and (last.id is None or last.id not in existing_ids)
        if new and isinstance(last, AIMessage) and not last.tool_calls and not last.invalid_tool_calls:
            return last
        return None

    def run(self, hooks: Sequence[AgentMiddleware], name: str, runtime: Any) -> None:
        """Run `name` of each middleware in turn, until one jumps to the end."""
        for m in hooks:
            if self.jumped_to_end:
                return
            if getattr(type(m), name) is getattr(AgentMiddleware, name):
                raise TypeError(f"{m.name} has only a{name}: run the graph with ainvoke/astream")
            self.apply(m.name, getattr(m, name)(self.state, runtime))

    async def arun(self, hooks: Sequence[AgentMiddleware], name: str, runtime: Any) -> None:
        """As `run`, awaiting each async hook; a sync-only hook runs in a thread (as `create_agent`'s nodes)."""
        for m in hooks:
            if self.jumped_to_end:
                return
            if getattr(type(m), f"a{name}") is getattr(AgentMiddleware, f"a{name}"):
                self.apply(m.name, await asyncio.to_thread(getattr(m, name), self.state, runtime))
            else:
                self.apply(m.name, await getattr(m, f"a{name}")(self.state, runtime))

    def apply(self, source: str, update: dict[str, Any] | None) -> None:
        if not update:
            return
        update = dict(update)
        if update.pop("jump_to", None) == "end":
            self.jumped_to_end = True
        if "messages" in update:
            self.state["messages"] = _messages_after(self.messages, update.pop("messages"))
        for key in set(update) & self.protected:
            log.warning("%s wrote gatedloop's own state key %r: not applied", source, key)
            update.pop(key)
        self.state.update(update)
        self.stored.update(update)


def _messages_after(messages: list[BaseMessage], written: Any) -> list[BaseMessage]:
    """`add_messages` as the messages channel would apply the write (RemoveMessage included)."""
    items = written if isinstance(written, list) else [written]
    if not items:
        return messages
    return cast(list[BaseMessage], add_messages(cast(Any, messages), cast(Any, items)))


class ModelCall:
    """One model request through the composed `wrap_model_call` handlers; the innermost handler binds the tools
    the request names (a middleware may narrow them: the model can still only propose, `validate` decides)."""

    def __init__(self, middlewares: Middlewares, model: BaseChatModel, answer_tool: dict[str, Any] | None):
        self.middlewares = middlewares
        self.model = model
        self.answer_tool = answer_tool

    def request(
        self,
        tools: Sequence[BaseTool],
        prompt: list[BaseMessage],
        messages: list[BaseMessage],
        hooks: HookState,
        runtime: Any,
    ) -> ModelRequest:
        system = prompt[0] if prompt and isinstance(prompt[0], SystemMessage) else None
        return ModelRequest(
            model=self.model,
            messages=cast(Any, list(messages)),
            system_message=system,
            tools=list(tools),
            state=cast(Any, hooks.state),
            runtime=runtime,
        )

    def _bound(self, request: ModelRequest) -> tuple[Any, list[BaseMessage]]:
        tools: list[Any] = list(request.tools)
        kwargs: dict[str, Any] = dict(request.model_settings)
        if self.answer_tool is not None:
            tools.append(self.answer_tool)
            kwargs["tool_choice"] = "any"
        elif request.tool_choice is not None:
            kwargs["tool_choice"] = request.tool_choice
        bound = request.model.bind_tools(tools, **kwargs) if tools else request.model.bind(**kwargs)
        messages: list[BaseMessage] = [*request.messages]
        if request.system_message is not None:
            messages.insert(0, request.system_message)
        return bound, messages

    def _execute(self, request: ModelRequest) -> ModelResponse:
        bound, messages = self._bound(request)
        return ModelResponse(result=[invoke_capturing(bound, messages)])

    async def _aexecute(self, request: ModelRequest) -> ModelResponse:
        bound, messages = self._bound(request)
        return ModelResponse(result=[await ainvoke_capturing(bound, messages)])

    def invoke(self, request: ModelRequest) -> BaseMessage:
        handler = self.middlewares.wrap_model_call
        return _reply(handler(request, self._execute) if handler else self._execute(request))

    async def ainvoke(self, request: ModelRequest) -> BaseMessage:
        handler = self.middlewares.awrap_model_call
        return _reply(await handler(request, self._aexecute) if handler else await self._aexecute(request))


def _reply(result: Any) -> BaseMessage:
    """The one message a wrapped call answered with. A `Command` from `wrap_model_call` would write state past the
    checks, so it fails the attempt like a model error."""
    if getattr(result, "commands", None):
        raise TypeError("a wrap_model_call returned a Command; gatedloop does not apply them")
    response = getattr(result, "model_response", result)
    messages = [m for m in response.result if isinstance(m, AIMessage)]
    if len(messages) != 1:
        raise TypeError(f"a wrap_model_call answered with {len(messages)} AI messages, not one")
    return messages[0]


ToolWrapper = Callable[[ToolCallRequest, Callable[[ToolCallRequest], Any]], Any]
HandedOn = Callable[[str, ToolCallRequest], None]


def chain_checked_tool_wrappers(wrappers: Sequence[tuple[str, ToolWrapper]], handed_on: HandedOn) -> ToolWrapper:
    """The middleware's `wrap_tool_call`s composed as `create_agent` composes them (the first is the outermost),
    with `handed_on(name, request)` called on every request a middleware hands to its handler, so a change to the
    call is refused and blamed on the middleware that made it (nodes/run/wrapped_run.py)."""

    def checked(name: str, wrap: ToolWrapper) -> ToolWrapper:
        def layer(request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]) -> Any:
            def handed(req: ToolCallRequest) -> Any:
                handed_on(name, req)
                return handler(req)

            return wrap(request, handed)

        return layer

    composed = _chain_tool_call_wrappers([checked(name, wrap) for name, wrap in wrappers])
    if composed is None:
        raise ValueError("no wrap_tool_call to chain")
    return composed
