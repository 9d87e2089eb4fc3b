"""The one error vocabulary the model sees, and the exception a tool raises to show a safe message.

Every failure that reaches the model is `{"ok": false, "error": {"type", "message", "retryable"}}`. The
message is always one we wrote or one a tool marked safe by raising `ToolFailure`; any other exception's
text goes to the log only (invariant 5).
"""

from __future__ import annotations

import json
from typing import Any, Literal

ErrorType = Literal[
    "unknown_tool",
    "invalid_arguments",
    "permission_denied",
    "rejected_by_reviewer",
    "timeout",
    "tool_error",
    "budget_exhausted",
    "cancelled",
    "deadline",
    "stopped",
    "outcome_unknown",
    "approval_expired",
    "superseded",
    "tool_changed",
    "call_changed",
    "limit_exceeded",
]

RETRYABLE: dict[str, bool] = {
    "unknown_tool": False,
    "invalid_arguments": True,
    "permission_denied": False,
    "rejected_by_reviewer": False,
    "timeout": True,
    "tool_error": True,
    "budget_exhausted": False,
    "cancelled": False,
    "deadline": False,
    "stopped": False,
    "outcome_unknown": False,
    "approval_expired": False,
    "superseded": False,
    "tool_changed": True,
    "call_changed": False,
    "limit_exceeded": False,
}

UNKNOWN_TOOL = "No tool named {name!r} exists. Available tools: {available}."
INVALID_JSON = "The arguments are not valid JSON: {detail}. Send one JSON object."
SCHEMA_MISMATCH = "The arguments do not match the tool's schema: {detail}"
GENERIC_TOOL_ERROR = "The tool failed while running. The failure was logged; try again or choose another approach."
TIMEOUT = "The tool did not answer within {seconds:g} s."
REJECTED = "A reviewer rejected this call."
BUDGET_EXHAUSTED = "Not run: the {budget} budget is used up."
NOT_RUN_STOPPED = "Not run: the loop stopped ({reason}) before this call."
# A call not run because the request stopped is labelled with the stop's own word where the vocabulary has
# it; `step_limit` spends the model-call budget; any other stop (the status says which) is `stopped`.
NOT_RUN_LABELS: dict[str, ErrorType] = {
    "cancelled": "cancelled",
    "deadline": "deadline",
    "budget_exhausted": "budget_exhausted",
    "step_limit": "budget_exhausted",
}


def not_run_label(stop: str) -> ErrorType:
    """The error type of a call the request's stop (a request status) left unrun."""
    return NOT_RUN_LABELS.get(stop, "stopped")


def stopped_before_run(stop: str, reason: str) -> ToolFailure:
    """The answer to a call the request's stop (`stop`, a status; `reason`, its detail) left unstarted."""
    return ToolFailure(NOT_RUN_STOPPED.format(reason=reason), error_type=not_run_label(stop))


ABANDONED = "A person marked this call abandoned; its outcome is unknown."
SUPERSEDED = "Not run: a new message arrived before this call ran. Propose it again if it is still needed."


class ToolFailure(Exception):
    """A failure whose message is safe for the model to read: the one shape of "a structured error that
    becomes the call's answer".

    A tool raises it; gatedloop returns it as a value wherever a call is refused instead of run (the registry's
    checks, `validate`'s budgets, admission in `approve` and `execute`). Any other exception a tool raises is
    logged and replaced by a generic `tool_error`.
    """

    def __init__(self, message: str, *, error_type: ErrorType = "tool_error", retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        self.error_type: ErrorType = error_type
        self.retryable = RETRYABLE.get(error_type, False) if retryable is None else retryable

    def to_json(self) -> str:
        """The failure as the model receives it (`error_json`)."""
        return error_json(self.error_type, self.message, retryable=self.retryable)


def invalid_arguments(message: str) -> ToolFailure:
    """The refusal of a call whose arguments cannot run as given (unreadable, off-schema, changed, refused)."""
    return ToolFailure(message, error_type="invalid_arguments")


def error_body(error_type: ErrorType, message: str, *, retryable: bool | None = None, **extra: Any) -> dict[str, Any]:
    """The structured body of a failed call, as the model receives it."""
    error: dict[str, Any] = {
        "type": error_type,
        "message": message,
        "retryable": RETRYABLE.get(error_type, False) if retryable is None else retryable,
    }
    error.update(extra)
    return {"ok": False, "error": error}


def error_json(error_type: ErrorType, message: str, **extra: Any) -> str:
    return json.dumps(error_body(error_type, message, **extra), ensure_ascii=False)
