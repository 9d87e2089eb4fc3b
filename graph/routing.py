"""Routers: small pure functions over the state, as LangGraph conditional edges."""

from __future__ import annotations

from typing import Literal

from gatedloop.graph.state import GatedState

Next = Literal["model", "validate", "approve", "execute", "finalize"]


def _verdicts(state: GatedState) -> set[str]:
    return {c["verdict"] for c in state.get("calls") or []}


def after_model(state: GatedState) -> Next:
    """Tool calls present -> validate; none (or a stop) -> finalize."""
    if state.get("stop") or not state.get("calls"):
        return "finalize"
    return "validate"


def after_validate(state: GatedState) -> Next:
    if state.get("stop"):
        return "finalize"
    verdicts = _verdicts(state)
    if "ask" in verdicts:
        return "approve"
    return "execute" if "run" in verdicts else "model"


def after_approve(state: GatedState) -> Next:
    """Ask again while any gated call still waits (a refused answer, or a quorum not yet reached); then run."""
    verdicts = _verdicts(state)
    if "ask" in verdicts:
        return "approve"
    return "execute" if "run" in verdicts else "model"


def after_execute(state: GatedState) -> Next:
    if state.get("stop"):
        return "finalize"
    return "approve" if "ask" in _verdicts(state) else "model"
