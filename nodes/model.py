"""The `model` node: one model request with the tools bound, accepted only if the response is complete.

A response whose provider did not say it finished (a stream cut short, `length`, `content_filter`), a
refusal, or a tool call without an id or with a reused id is never a tool request: it is not added to
the conversation, the model is asked again per `Limits.model_retries`, then the loop stops honestly.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.exceptions import ModelConnectionError
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall, invalid_tool_call
from langgraph._internal._runnable import RunnableCallable  # as langgraph.prebuilt.ToolNode: sync + async twins
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime
from langgraph.types import Overwrite

from gatedloop.nodes.build.parts import LoopParts, fresh_counters
from gatedloop.nodes.gate.answers import record_answers
from gatedloop.nodes.gate.call_arguments import entry_plan
from gatedloop.nodes.gate.open_calls import close_open_calls
from gatedloop.nodes.gate.proposals import record_proposals
from gatedloop.nodes.gate.views import keep_view, kept_view
from gatedloop.nodes.provider.finish import finish_status, no_status_detail, refusal_text, unfinished_detail
from gatedloop.nodes.provider.streamed_args import ainvoke_capturing, invoke_capturing
from gatedloop.nodes.run.facts import RunFacts
from gatedloop.nodes.run.unknown import make_settle_task
from gatedloop.nodes.state import PROTECTED_KEYS, CallPlan, GatedState, ModelView, RequestCounters, changes
from gatedloop.nodes.wire.model_view import MODEL_VIEW_FIELD, view_of, view_record
from gatedloop.tools.arguments import MAX_DEPTH, argument_problem, safe_text, storable_text
from gatedloop.tools.registry import ToolRegistry

log = logging.getLogger("gatedloop.model")


class ResponseProblem(Exception):
    """Why a whole response cannot be acted on: `kind` is the stop status it ends in if no retry succeeds
    (`incomplete`, `refused`, `error`, `invalid_answer`).

    Not a `ToolFailure`: that is one call's answer, read by the model; a response with a problem never enters
    the history, so no call of it is answered, and the problem becomes the request's status, read by the caller.
    """

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


REUSED_ID = (
    "the call id {call_id!r} was used by an earlier call of this thread: call ids must be unique across the whole "
    "thread, also when a middleware shortened what the model was sent (a scripted model that numbers its calls by "
    "the messages it is sent repeats them; leave the id out of call() and one is made unique)"
)


def check_response(message: BaseMessage, earlier_ids: set[str]) -> AIMessage:
    """Return the response as an AIMessage if it may be acted on; raise ResponseProblem otherwise."""
    if not isinstance(message, AIMessage):
        raise ResponseProblem("incomplete", f"the model returned a {type(message).__name__}, not an AI message")
    finish = finish_status(message)
    refusal = refusal_text(message)
    if refusal is not None:
        raise ResponseProblem("refused", f"the model refused: {refusal[:200]!r}")
    if finish is not None and finish.meaning == "refused":
        raise ResponseProblem("refused", f"the model refused ({finish.describe()})")
    if finish is None:
        raise ResponseProblem("incomplete", no_status_detail(message))
    if finish.meaning != "finished":
        raise ResponseProblem("incomplete", unfinished_detail(finish))
    if not message.tool_calls and not message.invalid_tool_calls and not _has_text(message):
        raise ResponseProblem("incomplete", "the response has neither text nor tool calls")
    if isinstance(message, AIMessageChunk):
        message = AIMessage(**message.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))
    message = _storable(message)
    seen: set[str] = set()
    for call in [*message.tool_calls, *message.invalid_tool_calls]:
        call_id = call.get("id")
        if not call_id or not isinstance(call_id, str):
            raise ResponseProblem("incomplete", f"a call to {call.get('name')!r} has no id")
        if call_id in seen:
            raise ResponseProblem("incomplete", f"the call id {call_id!r} is used twice")
        if call_id in earlier_ids:
            raise ResponseProblem("incomplete", REUSED_ID.format(call_id=call_id))
        seen.add(call_id)
    return message


def _storable(message: AIMessage) -> AIMessage:
    """The response as a checkpoint can store it exactly, and as `validate` can refuse it without raising.

    A call whose arguments are not exact JSON data (`argument_problem`: NaN, infinities, nesting past the cap,
    lone surrogates, integers beyond 64 bits; provider clients parse with Python's lenient json.loads before we
    see them) becomes an invalid call whose text is ASCII-escaped JSON or a short stand-in (`storable_text`).
    Names, ids and text that UTF-8 cannot encode are escaped: the checkpoint would otherwise store `?`."""
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in message.tool_calls:
        problem = argument_problem(call["args"])
        if problem is None:
            valid.append({**call, "name": safe_text(call["name"]), "id": _safe_id(call["id"])})
            continue
        invalid.append(
            invalid_tool_call(
                name=safe_text(call["name"]), args=storable_text(call["args"]), id=_safe_id(call["id"]), error=problem
            )
        )
    for bad in message.invalid_tool_calls:
        invalid.append(
            invalid_tool_call(
                name=_safe_optional(bad.get("name")),
                args=_safe_optional(bad.get("args")),
                id=_safe_id(bad.get("id")),
                error=_safe_optional(bad.get("error")),
            )
        )
    content = message.content
    update: dict[str, Any] = {"tool_calls": valid, "invalid_tool_calls": invalid}
    if isinstance(content, str):
        update["content"] = safe_text(content)
    elif argument_problem(content, max_depth=MAX_DEPTH * 2) is not None:
        update["content"] = storable_text(content)
    return message.model_copy(update=update)


def _safe_id(call_id: str | None) -> str | None:
    return safe_text(call_id) if isinstance(call_id, str) else call_id


def _safe_optional(text: Any) -> str | None:
    return None if text is None else safe_text(text if isinstance(text, str) else storable_text(text))


def _has_text(message: AIMessage) -> bool:
    content = message.content
    return bool(content.strip()) if isinstance(content, str) else bool(content)


def initial_plans(message: AIMessage, registry: ToolRegistry) -> list[CallPlan]:
    """Every proposed call, readable or not, enters the turn as an open plan, its arguments read once here
    (nodes/gate/call_arguments.py); `validate` decides."""
    plans: list[CallPlan] = []
    for call in message.tool_calls:
        plans.append(entry_plan(registry, call["id"] or "", call["name"], call["args"]))
    for bad in message.invalid_tool_calls:
        plans.append(entry_plan(registry, bad.get("id") or "", bad.get("name") or "", bad.get("args")))
    return plans


def make_model_node(parts: LoopParts) -> RunnableCallable:
    """Sync and async twins: under `ainvoke`/`astream` the model is awaited (`ainvoke`), never run in a thread.
    Both drive one schedule, `_ModelTurn.steps`, and differ only in `await`."""
    settle_task = make_settle_task(parts)

    def model(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        turn = _ModelTurn(parts, settle_task, state, runtime)
        steps, result = turn.steps(), None
        while (step := _advance(steps, result)) is not None:
            result = step.run(turn, runtime)
        return changes(state, turn.update())

    async def amodel(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        # Closing open calls and the cancel flag use the ledger: in place or on a thread (`ledger_call`).
        turn = await parts.ledger_call(_ModelTurn, parts, settle_task, state, runtime)
        steps, result = turn.steps(), None
        while (step := _advance(steps, result)) is not None:
            result = await step.arun(turn, runtime)
        return changes(state, turn.update())

    return RunnableCallable(model, amodel, name="model", trace=False)  # traced once, by LangGraph (gate_node)


def _advance(steps: Generator[_Step, Any, None], result: Any) -> _Step | None:
    """The schedule's next step, given the last one's result; None when it is done."""
    try:
        return steps.send(result)
    except StopIteration:
        return None


@dataclass(frozen=True)
class _Hooks:
    """Middleware hooks to run on the turn's hook state (`before_agent`, `before_model`, `after_model`)."""

    hooks: Sequence[Any]
    name: str

    def run(self, turn: _ModelTurn, runtime: Runtime) -> None:
        assert turn.hooks is not None
        turn.hooks.run(self.hooks, self.name, runtime)

    async def arun(self, turn: _ModelTurn, runtime: Runtime) -> None:
        assert turn.hooks is not None
        await turn.hooks.arun(self.hooks, self.name, runtime)


@dataclass(frozen=True)
class _Call:
    """One model call; its result is the raw response, or the exception it raised (an interrupt propagates)."""

    request: Any

    def run(self, turn: _ModelTurn, runtime: Runtime) -> BaseMessage | Exception:
        try:
            if turn.call is None:
                return invoke_capturing(turn.parts.model, self.request)
            return turn.call.invoke(turn.wrapped())
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return exc

    async def arun(self, turn: _ModelTurn, runtime: Runtime) -> BaseMessage | Exception:
        try:
            if turn.call is None:
                return await ainvoke_capturing(turn.parts.model, self.request)
            return await turn.call.ainvoke(turn.wrapped())
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return exc


@dataclass(frozen=True)
class _Accept:
    """A response taken into the turn: its proposals and answers are recorded in the ledger (blocking SQLite)."""

    response: AIMessage

    def run(self, turn: _ModelTurn, runtime: Runtime) -> None:
        turn.accept(self.response)

    async def arun(self, turn: _ModelTurn, runtime: Runtime) -> None:
        await turn.parts.ledger_call(turn.accept, self.response)


@dataclass(frozen=True)
class _KeepView:
    """A view the hooks made, recorded by the gate before the state keeps it (blocking SQLite): only a view so
    recorded is shown again (nodes/gate/views.py)."""

    view: ModelView

    def run(self, turn: _ModelTurn, runtime: Runtime) -> None:
        keep_view(turn.parts.ledger, turn.thread_id, self.view)

    async def arun(self, turn: _ModelTurn, runtime: Runtime) -> None:
        await turn.parts.ledger_call(keep_view, turn.parts.ledger, turn.thread_id, self.view)


_Step = _Hooks | _Call | _Accept | _KeepView


class _ModelTurn:
    """One `model` step: the attempts (retries included) and the update they lead to, shared by both twins.

    A response that cannot be acted on never enters the history; the next attempt is asked again (with the
    reason, when the problem is the answer's format, as messages sent with that attempt only).
    """

    def __init__(self, parts: LoopParts, settle_task: Any, state: GatedState, runtime: Runtime):
        self.parts = parts
        self.thread_id = RunFacts.of(runtime).thread_id
        self.closed = close_open_calls(parts.histories, parts.ledger, settle_task, self.thread_id, state["messages"])
        messages = self.closed.view
        counters: RequestCounters | None = state.get("counters")
        self.reset: dict[str, Any] = {"messages": self.closed.update} if self.closed.update else {}
        fresh = counters is None or bool(messages and isinstance(messages[-1], HumanMessage))
        if counters is None or fresh:
            counters = fresh_counters(parts.clock())
            parts.clear_cancel(self.thread_id)
            self.reset.update(status=None, answer=None, stop_detail=None, review_error=None, structured_response=None)
            if state.get("seen_reads"):
                self.reset["seen_reads"] = Overwrite({})  # repeats are counted per request
        else:
            counters = {**counters, "waited_s": counters["waited_s"] + self.closed.waited_s}
        self.counters = counters
        self.messages = messages
        self.earlier = self.closed.proposed
        self.feedback: list[BaseMessage] = []
        self.attempts_left = parts.limits.model_retries + 1
        self.problem = ResponseProblem("error", "no model call was made")
        self.result: dict[str, Any] | None = None
        stop = parts.stop_before_work(self.thread_id, counters)
        if self.closed.left_open:
            detail = "a write's outcome is unknown and was left to a person"
            self.result = {**self.reset, **_stop(counters, "needs_attention", detail)}
        elif stop:
            self.result = {**self.reset, **_stop(counters, *stop)}
        else:
            self.prompt = parts.prompt(state, runtime.context)
        self.fresh = fresh
        self.runtime = runtime
        mw = parts.middleware
        self.stored_view = state.get(MODEL_VIEW_FIELD)
        self.kept_view = kept_view(parts.ledger, self.thread_id, self.stored_view) if mw is not None else None
        self.new_view: ModelView | None = None
        shown = view_of(messages, self.kept_view)
        self.hooks = mw.hook_state(state, shown, PROTECTED_KEYS) if mw is not None else None
        self.call = parts.model_call

    def hooked(self) -> None:
        """After the before-hooks: the model is shown their view; a jump to the end stops here, with the answer
        the hook left (`ModelCallLimitMiddleware`'s message) or as a step limit."""
        assert self.hooks is not None
        self.messages = self.hooks.messages
        if not _pairs_intact(self.messages):
            detail = "a middleware separated a tool call from its answer in what the model would be sent"
            self.result = {**self.reset, **_stop(self.counters, "error", detail)}
            return
        record = view_record(self.closed.view, self.messages)
        if record != self.kept_view:
            self.new_view = record
        if record != self.stored_view:
            self.reset[MODEL_VIEW_FIELD] = record
        if not self.hooks.jumped_to_end:
            return
        reply = self.hooks.final_reply({m.id for m in self.closed.view})
        if reply is None:
            self.result = {**self.reset, **_stop(self.counters, "step_limit", "a middleware ended the request")}
            return
        reply = _storable(reply)
        self.result = {
            **self.reset,
            "messages": [*self.closed.update, reply],
            "calls": [],
            "counters": self.counters,
            "stop": None,
        }

    def wrapped(self) -> Any:
        """This attempt's request as the middleware see it (`ModelRequest`)."""
        assert self.call is not None and self.hooks is not None
        tools = self.parts.registry.bindable()
        return self.call.request(tools, self.prompt, [*self.messages, *self.feedback], self.hooks, self.runtime)

    def rewritten(self, response: AIMessage) -> AIMessage | None:
        """The response after the `after_model` hooks (a hook may replace it by its id), checked again: what it
        proposes now is what `validate` judges."""
        assert self.hooks is not None
        found = [m for m in self.hooks.messages if m.id == response.id]
        if not found:
            self._discard(ResponseProblem("error", "a middleware removed the model's response"))
            return None
        if found[-1] is response:
            return response
        try:
            return check_response(found[-1], self.earlier)
        except ResponseProblem as exc:
            self._discard(exc)
            return None

    def next_request(self) -> list[BaseMessage] | None:
        """The messages for the next attempt, or None when this step is decided."""
        if self.result is not None:
            return None
        limit = self.parts.limits.max_model_calls
        if self.attempts_left == 0:
            self.result = {**self.reset, **_stop(self.counters, self.problem.kind, self.problem.detail)}
            return None
        if self.counters["model_calls"] >= limit:
            self.result = {**self.reset, **_stop(self.counters, "step_limit", f"{limit} model calls made")}
            return None
        self.attempts_left -= 1
        self.counters["model_calls"] += 1
        return [*self.prompt, *self.messages, *self.feedback]

    def steps(self) -> Generator[_Step, Any, None]:
        """The turn's schedule: the hooks before the first attempt, then each attempt (a model call, its check, the
        `after_model` hooks, the response accepted) until one is accepted or the retries run out."""
        mw = self.parts.middleware
        if mw is not None and self.hooks is not None and self.result is None:
            if self.fresh:
                yield _Hooks(mw.before_agent, "before_agent")
            yield _Hooks(mw.before_model, "before_model")
            self.hooked()
            if self.new_view is not None:
                yield _KeepView(self.new_view)
        while (request := self.next_request()) is not None:
            raw = yield _Call(request)
            if isinstance(raw, Exception):
                self.failed(raw)
                continue
            response = self.checked(raw)
            if response is not None and mw is not None and self.hooks is not None:
                self.hooks.state["messages"] = [*self.messages, response]  # this attempt's response only
                yield _Hooks(mw.after_model, "after_model")
                response = self.rewritten(response)
            if response is not None:
                yield _Accept(response)

    def failed(self, exc: Exception) -> None:
        log.warning("thread %s: model call failed: %s", self.thread_id, type(exc).__name__, exc_info=exc)
        if _never_connected(exc):
            self.problem = ResponseProblem("error", f"the model server could not be reached ({type(exc).__name__})")
        else:
            kind = "incomplete" if _connection_lost(exc) else "error"
            self.problem = ResponseProblem(kind, f"the model call failed ({type(exc).__name__})")
        self.counters["retries"] += 1

    def checked(self, raw: BaseMessage) -> AIMessage | None:
        """The response if it may be acted on (with an id, so an `after_model` hook can replace it); else None."""
        self.counters["tokens"] += _tokens(raw)
        try:
            response = check_response(raw, self.earlier)
        except ResponseProblem as exc:
            self._discard(exc)
            return None
        if response.id is None and self.hooks is not None:
            response = response.model_copy(update={"id": f"run-{uuid.uuid4()}"})
        return response

    def _discard(self, exc: ResponseProblem) -> None:
        log.warning("thread %s: discarded model response: %s", self.thread_id, exc.detail)
        self.problem = exc
        self.counters["retries"] += 1

    def accept(self, response: AIMessage) -> None:
        """A checked response enters the turn: a validated final answer, or calls for `validate`."""
        judged = self.parts.answer_format.judge(response) if self.parts.answer_format else None
        if judged is not None and judged.problem is not None:
            log.warning("thread %s: discarded final answer: %s", self.thread_id, judged.problem)
            self.problem = ResponseProblem("invalid_answer", judged.problem)
            self.feedback = list(judged.feedback)
            self.counters["retries"] += 1
            return
        done = {**self.reset, "counters": self.counters, "stop": None}
        if judged is not None:
            final, ack = judged.feedback  # the answer-tool call and gatedloop's answer to it, recorded as any answer
            record_answers(self.parts.ledger, self.thread_id, [cast(ToolMessage, ack)], "structured_response")
            messages = [*self.closed.update, final, ack]
            self.result = {**done, "messages": messages, "calls": [], "structured_response": judged.value}
        else:
            plans = initial_plans(response, self.parts.registry)
            record_proposals(self.parts.ledger, self.thread_id, plans)
            messages = [*self.closed.update, response]
            self.result = {**done, "messages": messages, "calls": plans}

    def update(self) -> dict[str, Any]:
        assert self.result is not None
        return {**self.hooks.stored, **self.result} if self.hooks is not None else self.result


# What a response cut off in transit raises, by client: openai/anthropic APIConnectionError; httpx (Anthropic and
# Ollama streams) RemoteProtocolError/ReadError; urllib3 under botocore (Bedrock) ProtocolError.
CUT_IN_TRANSIT = frozenset({"APIConnectionError", "RemoteProtocolError", "ReadError", "ProtocolError"})


def _connection_lost(exc: BaseException) -> bool:
    """A response cut mid-way surfaces as its client's connection or protocol error, not as a finish status."""
    if isinstance(exc, ModelConnectionError | ConnectionError):
        return True
    return any(cls.__name__ in CUT_IN_TRANSIT for cls in type(exc).__mro__)


def _never_connected(exc: BaseException) -> bool:
    """No connection was made (refused, unresolvable host, connect timeout): the call failed, nothing was cut off.

    httpx raises `ConnectError`/`ConnectTimeout`, which the OpenAI client wraps in `APIConnectionError`."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or type(seen).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _pairs_intact(messages: list[BaseMessage]) -> bool:
    """Every call in `messages` answered after it, every answer after its call: what a hook (a summarization, a
    context edit) left the model is still a history a provider accepts and the gate's pairing holds in."""
    open_ids: set[str] = set()
    for message in messages:
        if isinstance(message, AIMessage):
            if open_ids:
                return False
            open_ids = {str(c.get("id")) for c in [*message.tool_calls, *message.invalid_tool_calls] if c.get("id")}
        elif isinstance(message, ToolMessage):
            if message.tool_call_id not in open_ids:
                return False
            open_ids.discard(message.tool_call_id)
    return not open_ids


def _tokens(message: BaseMessage) -> int:
    usage = getattr(message, "usage_metadata", None) or {}
    return int(usage.get("total_tokens") or 0)


def _stop(counters: RequestCounters, status: str, detail: str) -> dict[str, Any]:
    return {"calls": [], "counters": counters, "stop": status, "stop_detail": detail}
