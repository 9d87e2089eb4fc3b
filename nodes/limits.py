"""Budgets that make the loop end: every one has a safe default and its own stop status."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Per-request budgets. A request starts with each new user message and ends at a final status."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # `default=` by keyword: a type checker without pydantic's plugin takes only that for a default, and would
    # reject `Limits(max_model_calls=8)` for the fields left out (tests/test_doc_types.py)

    max_model_calls: int = Field(default=12, ge=1, description="model requests, retries included -> step_limit")
    max_tool_calls: int = Field(default=40, ge=0, description="tool calls run in total -> budget_exhausted")
    max_calls_per_turn: int = Field(
        default=16, ge=1, description="calls one model turn may propose; the rest are refused"
    )
    max_tokens: int = Field(default=200_000, ge=1, description="total tokens from the model's usage metadata")
    deadline_s: float = Field(
        default=600.0, gt=0, description="wall clock per request, time waiting for a person excluded"
    )
    model_retries: int = Field(default=1, ge=0, description="extra tries after an incomplete or failed model response")
    max_result_chars: int = Field(default=4000, ge=200, description="a longer tool result is cut with a marker")
    max_identical_reads: int = Field(
        default=3,
        ge=2,
        description="the same read, same arguments, same result, this many times in a row -> loop_detected",
    )

    def max_concurrency(self) -> int:
        """Threads for one turn's tool tasks: every call a turn may propose can run at once."""
        return max(16, self.max_calls_per_turn * 2)

    def recursion_limit(self) -> int:
        """A superstep ceiling derived from the budgets, so LangGraph's own guard never fires first."""
        return self.max_model_calls * 6 + 20
