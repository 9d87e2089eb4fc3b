"""Checkpointers that refuse to store a resume value they could not store exactly.

LangGraph writes a `Command(resume=...)` value into the checkpoint before any node sees it, and its serializer
stores a lone surrogate as "?" (ormsgpack's OPT_REPLACE_SURROGATES). So a reviewer's edit `x\\ud800y`, refused
by `approve` on first sight, came back from the checkpoint on the next resume as a valid-looking `x?y` and ran.
`runs.resume` checks answers first; this guard covers every other way in (`graph.invoke(Command(resume=...))`,
LangGraph Server, Studio): the write is refused with a clear error and the thread is left as it was.
Hand-written: LangGraph has no hook to validate a resume value before it is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import RESUME

from gatedloop.tools.arguments import ANSWER_DEPTH, argument_problem


class InexactResume(ValueError):
    """A resume value the checkpoint could not store exactly; nothing was stored."""


def check_resume_writes(writes: Sequence[tuple[str, Any]]) -> None:
    for channel, value in writes:
        if channel == RESUME:
            problem = argument_problem(value, max_depth=ANSWER_DEPTH + 2)  # stored as {interrupt_id: {answer, sender}}
            if problem:
                raise InexactResume(f"the answer cannot be stored exactly ({problem}); nothing was changed")


class ExactResumeWrites:
    """Mixin for a LangGraph checkpointer: resume values are checked before they are stored."""

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        check_resume_writes(writes)
        super().put_writes(config, writes, task_id, task_path)  # type: ignore[misc]

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        check_resume_writes(writes)
        await super().aput_writes(config, writes, task_id, task_path)  # type: ignore[misc]
