"""Routers: small pure functions over the state, as LangGraph conditional edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NotRequired, TypedDict

from langgraph._internal._runnable import RunnableCallable  # as langgraph.prebuilt.ToolNode: sync + async twins

from gatedloop.nodes.state import CallPlan, Status

Next = Literal["model", "validate", "approve", "execute", "finalize"]


class RouteState(TypedDict):
    """What the routers read. LangGraph reads a conditional edge's input schema from its annotation, and
    only these channels are copied and brought up to date for it: routing never folds the history."""

    calls: NotRequired[list[CallPlan]]
    stop: NotRequired[Status | None]


def _verdicts(state: RouteState) -> set[str]:
    return {c["verdict"] for c in state.get("calls") or []}


def after_model(state: RouteState) -> Next:
    """Tool calls present -> validate; none (or a stop) -> finalize."""
    if state.get("stop") or not state.get("calls"):
        return "finalize"
    return "validate"


def after_validate(state: RouteState) -> Next:
    if state.get("stop"):
        return "finalize"
    verdicts = _verdicts(state)
    if "ask" in verdicts:
        return "approve"
    return "execute" if "run" in verdicts else "model"


def after_approve(state: RouteState) -> Next:
    """Ask again while any gated call still waits (a refused answer, or a quorum not yet reached); then run."""
    verdicts = _verdicts(state)
    if "ask" in verdicts:
        return "approve"
    return "execute" if "run" in verdicts else "model"


def after_execute(state: RouteState) -> Next:
    if state.get("stop"):
        return "finalize"
    return "approve" if "ask" in _verdicts(state) else "model"


def edge(router: Callable[[RouteState], Next]) -> RunnableCallable:
    """`router` as a conditional edge that runs where the step runs. LangGraph sends a plain sync router to a
    thread under `ainvoke` (five hand-offs per approval turn); a router computes nothing that could block."""

    async def on_the_loop(state: RouteState) -> Next:
        return router(state)

    # name=None: the edge keeps the router's name, as LangGraph names a plain function's edge
    return RunnableCallable(router, on_the_loop, name=None, trace=True)
