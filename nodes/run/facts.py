"""The facts of the step running now (its thread, its stream), read once from the node's `Runtime` and handed on
as data (issue 52): below a node, nothing reads them from LangGraph's context.

LangGraph gives every node its `Runtime`; `execution_info` names the thread (None without a checkpointer: then
the run's id names it, or a fresh id, so the ledger still has a key) and `stream_writer` is the run's custom
stream. The clock is `LoopParts.clock`, injected once at build.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from langgraph.runtime import Runtime
from langgraph.types import StreamWriter


@dataclass(frozen=True)
class RunFacts:
    thread_id: str
    write: StreamWriter

    @classmethod
    def of(cls, runtime: Runtime) -> RunFacts:
        info = runtime.execution_info
        thread = info.thread_id if info is not None else None
        if thread is None:
            thread = f"run-{(info.run_id if info is not None else None) or uuid.uuid4()}"
        return cls(str(thread), runtime.stream_writer)
