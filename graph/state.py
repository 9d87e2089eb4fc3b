"""The graph's state: the conversation, this turn's call plans, this request's counters, and the outcome.

`messages` is a `DeltaChannel`, so a checkpoint stores only what a step added, not the whole history
again; everything else is small and reset per turn or per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast

from langchain_core.messages import AnyMessage, BaseMessage, RemoveMessage, convert_to_messages
from langgraph.channels import DeltaChannel
from langgraph.graph.message import add_messages

Status = Literal[
    "completed",
    "step_limit",
    "budget_exhausted",
    "deadline",
    "cancelled",
    "loop_detected",
    "incomplete",
    "refused",
    "needs_attention",
    "error",
]
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]

Verdict = Literal["run", "ask", "answered"]


class CallPlan(TypedDict):
    """One proposed tool call as it moves through validate -> approve -> execute."""

    id: str
    name: str
    args: dict[str, Any]
    verdict: Verdict
    effect: Literal["read", "write"]
    digest: str
    approved_digest: NotRequired[str]
    decided_by: NotRequired[str]
    decision: NotRequired[str]
    edited: NotRequired[bool]
    repair: NotRequired[str]


class RequestCounters(TypedDict):
    """Counters for the current request (reset by each new user message)."""

    started_at: float
    waited_s: float
    paused_at: float | None
    model_calls: int
    tool_calls: int
    tokens: int
    per_tool: dict[str, int]
    retries: int
    fingerprints: dict[str, list[Any]]


def fold_messages(history: list[BaseMessage] | None, writes: Sequence[Any]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` applied write by write (batching-invariant).

    Messages that arrive without an id get one from their position, so replaying writes from the
    checkpoint rebuilds the same ids every time (add_messages alone would draw fresh uuids).
    """
    merged: list[BaseMessage] = list(history or [])
    position = {m.id: i for i, m in enumerate(merged)}  # built once per batch: replaying N writes stays O(n + N)
    for write in writes:
        incoming = convert_to_messages(write if isinstance(write, list) else [write])
        for offset, message in enumerate(incoming):
            if message.id is None:
                message.id = f"msg-{len(merged) + offset}"
        if any(isinstance(m, RemoveMessage) for m in incoming):
            merged = cast(list[BaseMessage], add_messages(cast(Any, merged), cast(Any, incoming)))
            position = {m.id: i for i, m in enumerate(merged)}
            continue
        for message in incoming:
            if message.id in position:
                merged[position[message.id]] = message
            else:
                position[message.id] = len(merged)
                merged.append(message)
    return merged


class GatedState(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(fold_messages)]
    calls: NotRequired[list[CallPlan]]
    counters: NotRequired[RequestCounters]
    stop: NotRequired[str | None]
    stop_detail: NotRequired[str | None]
    status: NotRequired[Status | None]
    answer: NotRequired[str | None]
    review_error: NotRequired[str | None]
    """Why the last answer to the pending approval request was refused (shown with the request again)."""


class InputState(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(fold_messages)]


class OutputState(TypedDict):
    messages: list[AnyMessage]
    status: NotRequired[Status | None]
    answer: NotRequired[str | None]
    stop_detail: NotRequired[str | None]
