"""What running one call produced, in gatedloop's own words: the `Outcome` every path returns (ran, failed,
unknown, recorded earlier) and its constructors. Plain data, so the gate can weigh outcomes without running tools."""

from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict

from gatedloop.checkpoints.ledger import FinishedState
from gatedloop.tools import errors
from gatedloop.tools.results import cap, to_json_text

UnknownReason = Literal["timeout", "connection_lost", "claimant_died", "claimant_running", "ledger_lost"]

OutcomeStatus = Literal["ok", "error", "unknown"]
"""Success and failure in gatedloop's own words (as the model's `{"ok": ...}` body): `ok`, `error`, or `unknown`
for a write that may or may not have happened. Mapped to LangChain's `ToolMessage.status` only in
`answers.tool_message`, and to the ledger's row state only in `finished_state`."""


class Outcome(TypedDict):
    """What running one call produced. Stored as JSON in the checkpoint (task results) and in the ledger row's
    `result`, so its keys and values are kept as written."""

    status: OutcomeStatus
    content: str
    duration_ms: float
    error_type: NotRequired[str]
    unknown: NotRequired[UnknownReason]
    attempts: NotRequired[int]
    reused: NotRequired[bool]


def ok_outcome(result: Any, max_chars: int) -> Outcome:
    """A call that ran and returned `result`: its JSON text, capped."""
    return {"status": "ok", "content": cap(to_json_text(result), max_chars), "duration_ms": 0.0}


def error_outcome(failure: errors.ToolFailure) -> Outcome:
    """A call that failed (or was never run) for a reason the model may read: the failure's JSON and type."""
    return {"status": "error", "content": failure.to_json(), "error_type": failure.error_type, "duration_ms": 0.0}


def finished_state(outcome: Outcome) -> FinishedState:
    """The ledger row state that records an outcome: `done` for `ok`, `failed` otherwise.

    The ledger keeps its own spelling because its rows are persisted (`state` column, checked by the schema);
    `abandoned` is a person's choice, written by `unknown`, never derived from an outcome."""
    return "done" if outcome["status"] == "ok" else "failed"


def unknown(reason: UnknownReason, attempts: int, seconds: float = 0.0) -> Outcome:
    body = errors.error_json("outcome_unknown", f"The outcome of this call is unknown ({reason.replace('_', ' ')}).")
    return {
        "status": "unknown",
        "content": body,
        "unknown": reason,
        "attempts": attempts,
        "error_type": "outcome_unknown",
        "duration_ms": round(seconds * 1000, 3),
    }


def stored_outcome(state: str, result: str | None) -> Outcome:
    """The recorded outcome of a call that already ran: reused, never re-executed."""
    try:
        outcome: Outcome = json.loads(result) if result else unknown("claimant_died", 1)
    except (TypeError, ValueError):
        outcome = unknown("claimant_died", 1)
    if state == "abandoned":
        outcome = error_outcome(errors.ToolFailure(errors.ABANDONED, error_type="outcome_unknown"))
    outcome["reused"] = True
    return outcome
