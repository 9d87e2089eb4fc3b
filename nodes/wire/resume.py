"""The one check of an answer before it resumes a thread: storable exactly, then right for the request's kind.

LangGraph stores the resume value in the checkpoint before any node sees it, so `graph.runs` checks here first
and nothing is stored for an answer that fails; the nodes check again when they read it (the answer may have come
another way, such as LangGraph Server's API), with the same functions.
"""

from __future__ import annotations

from typing import Any

from gatedloop.nodes.wire.hitl import InvalidDecision, check_decisions, check_unknown_answer
from gatedloop.tools.arguments import ANSWER_DEPTH, argument_problem


def check_answer(request: dict[str, Any], answer: Any) -> None:
    """Raise InvalidDecision if `answer` cannot be applied to `request`; nothing is applied either way."""
    problem = argument_problem(answer, max_depth=ANSWER_DEPTH)
    if problem:
        # A value LangGraph cannot store exactly (a lone surrogate becomes "?", a huge integer fails) never reaches it.
        raise InvalidDecision(f"the answer cannot be used: {problem}")
    if request.get("kind") == "unknown_outcome":
        check_unknown_answer(answer, len(request.get("calls", [])))
    else:
        check_decisions(request, answer)
