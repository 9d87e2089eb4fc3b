"""A tool run of a tool with `secret_args` is reported to callbacks (tracers, LangSmith) with masked inputs.

LangChain's `BaseTool.run` hands the tool's raw input to every handler's `on_tool_start` and has no hook to mask
it. So for such a tool gatedloop reports the tool run itself, with the masked arguments as its inputs, and runs the
tool with no callbacks and LangSmith tracing off for its duration: the trace shows the run, its masked inputs, its
output or error, but no runs nested inside the tool (a model the tool calls). Hand-written: no LangChain or
LangSmith component masks one tool's inputs for every handler (LangSmith's `hide_inputs` is per client, all runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import CallbackManager
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langsmith import tracing_context


def run_masked(
    tool: BaseTool, shown_args: dict[str, Any], config: RunnableConfig, run: Callable[[RunnableConfig], Any]
) -> Any:
    """`run(config)` with the tool's own callback reporting replaced by one tool run whose inputs are `shown_args`."""
    manager = CallbackManager.configure(
        config.get("callbacks"), inheritable_tags=config.get("tags"), inheritable_metadata=config.get("metadata")
    )
    run_manager = manager.on_tool_start(
        {"name": tool.name, "description": tool.description},
        json.dumps(shown_args, ensure_ascii=False, default=str),
        name=config.get("run_name"),
        inputs=shown_args,
    )
    quiet: RunnableConfig = {**config, "callbacks": []}  # not None: None would fall back to the ambient config
    try:
        with tracing_context(enabled=False):
            output = run(quiet)
    except BaseException as exc:
        run_manager.on_tool_error(exc)
        raise
    run_manager.on_tool_end(output)
    return output
