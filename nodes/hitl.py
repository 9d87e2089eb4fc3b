"""The approval wire format: LangChain v1's batched `HITLRequest`, so existing clients work unchanged.

Agent Chat UI and code written for `HumanInTheLoopMiddleware` read `action_requests`/`review_configs` and
answer `{"decisions": [...]}`. We add `tool_call_id` and `args_digest` per action, and accept an optional
`reviewer` (top level or per decision) and `args_digest` per decision, which binds the answer to the
exact arguments the reviewer saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

from gatedloop.tools.policy import ALL_DECISIONS

# Mirrors of langchain.agents.middleware.human_in_the_loop's TypedDicts (same keys), declared here so the
# runtime does not need the `langchain` package for five dict shapes.


class ActionRequest(TypedDict):
    name: str
    args: dict[str, Any]
    description: NotRequired[str]


class ReviewConfig(TypedDict):
    action_name: str
    allowed_decisions: list[str]


class GatedActionRequest(ActionRequest):
    tool_call_id: str
    args_digest: str


class GatedHITLRequest(TypedDict):
    kind: Literal["approval"]
    action_requests: list[GatedActionRequest]
    review_configs: list[ReviewConfig]
    error: NotRequired[str]


class InvalidDecision(ValueError):
    """A reviewer's answer that cannot be applied; nothing was changed and the request is still pending."""


class Decision(TypedDict):
    type: str
    message: NotRequired[str]
    edited_action: NotRequired[dict[str, Any]]
    reviewer: NotRequired[str]
    args_digest: NotRequired[str]


def check_decisions(
    answer: Any, actions: Sequence[GatedActionRequest], configs: Sequence[ReviewConfig]
) -> list[Decision]:
    """Exact count and type checks, as LangChain's middleware does; raise InvalidDecision with the reason."""
    if not isinstance(answer, dict):
        raise InvalidDecision(f'the answer must be an object like {{"decisions": [...]}}, not {type(answer).__name__}')
    decisions = answer.get("decisions")
    if not isinstance(decisions, list):
        raise InvalidDecision('the answer needs a "decisions" list, one decision per action')
    if len(decisions) != len(actions):
        raise InvalidDecision(f"expected {len(actions)} decision(s), one per action, got {len(decisions)}")
    reviewer = answer.get("reviewer")
    if reviewer is not None and not isinstance(reviewer, str):
        raise InvalidDecision('"reviewer" must be a string')
    checked: list[Decision] = []
    for index, (decision, action, config) in enumerate(zip(decisions, actions, configs, strict=True)):
        checked.append(_check_one(index, decision, action, config, reviewer))
    return checked


def _check_one(
    index: int, decision: Any, action: GatedActionRequest, config: ReviewConfig, reviewer: str | None
) -> Decision:
    where = f"decision {index} ({action['name']})"
    if not isinstance(decision, dict):
        raise InvalidDecision(f"{where} must be an object, not {type(decision).__name__}")
    kind = decision.get("type")
    if kind not in ALL_DECISIONS:
        raise InvalidDecision(f"{where}: unknown type {kind!r}; expected one of {list(ALL_DECISIONS)}")
    if kind not in config["allowed_decisions"]:
        raise InvalidDecision(f"{where}: {kind!r} is not allowed here; allowed: {config['allowed_decisions']}")
    seen_digest = decision.get("args_digest")
    if seen_digest is not None and seen_digest != action["args_digest"]:
        raise InvalidDecision(f"{where}: it answers different arguments than the ones now pending")
    message = decision.get("message")
    if message is not None and not isinstance(message, str):
        raise InvalidDecision(f"{where}: message must be a string")
    if kind == "respond" and not message:
        raise InvalidDecision(f"{where}: respond needs a message")
    if kind == "edit":
        edited = decision.get("edited_action")
        if not isinstance(edited, dict) or not isinstance(edited.get("args"), dict):
            raise InvalidDecision(f'{where}: edit needs "edited_action": {{"name", "args": {{...}}}}')
        if edited.get("name", action["name"]) != action["name"]:
            raise InvalidDecision(f"{where}: an edit cannot change the tool ({edited.get('name')!r})")
    who = decision.get("reviewer", reviewer)
    result: Decision = {"type": kind, "reviewer": who if isinstance(who, str) else "unknown"}
    if message:
        result["message"] = message
    if kind == "edit":
        result["edited_action"] = decision["edited_action"]
    return result
