"""What LangGraph says about the step running now: the one module of gatedloop that reads the running step's
config (`langgraph.config.get_config`). In `checkpoints`, the lowest layer that needs it: the ledger of a served
run is found from the run's checkpointer (checkpoints/ledger_for.py), and the nodes read the rest.

Only facts of the run are read here (the task's namespace, its callbacks, its checkpointer; nodes take the thread
from their `Runtime`: nodes/run/facts.py); who asked and who answered never are: they arrive as data, bound to the
message and the answer as they entered (gatedloop.graph.gated).
"""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER
from langgraph.config import get_config


def step_config() -> RunnableConfig:
    """The running step's config (callbacks, tags, metadata, configurable)."""
    return get_config()


def running_checkpointer() -> object | None:
    """The checkpointer LangGraph gave the running step (None when it has none); RuntimeError outside a run."""
    return get_config().get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)


def task_namespace() -> str:
    """The running task's checkpoint namespace: the same each time LangGraph runs the task again."""
    return str(get_config().get("configurable", {}).get("checkpoint_ns", ""))
