"""Asking a person at the terminal to answer a pending request (the operator layer, gatedloop.graph.pending, reads
it and builds the answer)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from gatedloop.graph import pending as decide
from gatedloop.graph.display import Display
from gatedloop.graph.pending import PendingCall, PendingRequest

PROMPT = "  {index}. {name}: [a]pprove / [e]dit / [r]eject / re[s]pond? "


def ask_reviewer(request: dict[str, Any], reviewer: str, roles: Iterable[str], display: Display) -> dict[str, Any]:
    """Ask at the terminal about the calls this reviewer's roles may decide (all, if none), one by one."""
    print(display.approval_table(request))
    asked = PendingRequest.parse(request)
    ask = _ask_unknown if asked.kind == "unknown_outcome" else _ask_one
    mine = asked.mine(roles, time.time())
    return asked.answer([ask(call) for call in mine], reviewer, calls=mine)


def _ask_one(call: PendingCall) -> dict[str, Any]:
    keys = {"a": "approve", "e": "edit", "r": "reject", "s": "respond"}
    while True:
        choice = keys.get(input(PROMPT.format(index=call.index + 1, name=call.name)).strip().lower()[:1])
        if choice not in call.allowed:
            print(f"    choose one of: {', '.join(call.allowed)}")
            continue
        if choice == "approve":
            return decide.approve(call)
        if choice == "reject":
            return decide.reject(call, input("    reason (optional): ").strip())
        if choice == "respond":
            return decide.respond(call, input("    your answer for the model: ").strip() or "-")
        try:
            args = json.loads(input(f"    new args as JSON [{json.dumps(call.args, ensure_ascii=False)}]: "))
        except ValueError as exc:
            print(f"    not JSON: {exc}")
            continue
        return decide.edit(call, args)


def _ask_unknown(call: PendingCall) -> dict[str, Any]:
    while True:
        choice = (
            input(f"  {call.index + 1}. {call.name}: [d]one / [n]ot done (run it) / [a]bandon? ").strip().lower()[:1]
        )
        if choice == "n":
            return decide.not_done()
        if choice == "a":
            return decide.abandon()
        if choice == "d":
            try:
                return decide.done(json.loads(input("    its result as JSON: ") or "{}"))
            except ValueError as exc:
                print(f"    not JSON: {exc}")
