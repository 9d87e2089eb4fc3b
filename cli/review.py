"""Asking a person at the terminal to answer a pending request."""

from __future__ import annotations

import json
from typing import Any

from gatedloop.graph.display import Display

PROMPT = "  {index}. {name}: [a]pprove / [e]dit / [r]eject / re[s]pond? "


def ask_reviewer(request: dict[str, Any], reviewer: str, display: Display) -> dict[str, Any]:
    print(display.approval_table(request))
    if request.get("kind") == "unknown_outcome":
        return {"decisions": [_ask_unknown(i, c) for i, c in enumerate(request["calls"], 1)], "reviewer": reviewer}
    decisions = []
    for index, (action, config) in enumerate(
        zip(request["action_requests"], request["review_configs"], strict=True), 1
    ):
        decision = _ask_one(index, action, config["allowed_decisions"])
        decisions.append({**decision, "tool_call_id": action["tool_call_id"]})
    return {"decisions": decisions, "reviewer": reviewer, "request_id": request.get("request_id")}


def _ask_one(index: int, action: dict[str, Any], allowed: list[str]) -> dict[str, Any]:
    keys = {"a": "approve", "e": "edit", "r": "reject", "s": "respond"}
    while True:
        choice = keys.get(input(PROMPT.format(index=index, name=action["name"])).strip().lower()[:1])
        if choice not in allowed:
            print(f"    choose one of: {', '.join(allowed)}")
            continue
        if choice == "approve":
            return {"type": "approve", "args_digest": action["args_digest"]}
        if choice == "reject":
            return {
                "type": "reject",
                "message": input("    reason (optional): ").strip() or "Rejected by the reviewer.",
            }
        if choice == "respond":
            return {"type": "respond", "message": input("    your answer for the model: ").strip() or "-"}
        try:
            args = json.loads(input(f"    new args as JSON [{json.dumps(action['args'], ensure_ascii=False)}]: "))
        except ValueError as exc:
            print(f"    not JSON: {exc}")
            continue
        return {"type": "edit", "edited_action": {"name": action["name"], "args": args}}


def _ask_unknown(index: int, call: dict[str, Any]) -> dict[str, Any]:
    while True:
        choice = input(f"  {index}. {call['name']}: [d]one / [n]ot done (run it) / [a]bandon? ").strip().lower()[:1]
        if choice == "n":
            return {"type": "not_done"}
        if choice == "a":
            return {"type": "abandon"}
        if choice == "d":
            try:
                return {"type": "done", "result": json.loads(input("    its result as JSON: ") or "{}")}
            except ValueError as exc:
                print(f"    not JSON: {exc}")
