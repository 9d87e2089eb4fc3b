"""The graph `langgraph dev` serves and LangGraph Studio shows: compiled with no checkpointer.

The server supplies persistence for checkpoints: with this repo's `langgraph.json` that is gatedloop's
SQLite saver (`gatedloop.checkpoints.devserver.studio_checkpointer`) on `GATEDLOOP_DB` (default
`.gatedloop/studio.sqlite`). The execution ledger (at-most-once writes, audit, cancel flags) goes in the
same file by default, as with `open_sqlite`; `GATEDLOOP_LEDGER` names another file if you must. Either may be a
`postgresql://` URL: then the ledger is a `PostgresLedger` in that database (on LangGraph Server, the database of
`POSTGRES_URI`, whose checkpoints the server keeps itself). The demo tools keep their data in `demo-data.sqlite`
beside a SQLite ledger, or in `GATEDLOOP_DEMO_DATA` (default `.gatedloop/demo-data.sqlite`) with Postgres.
The model comes from `GATEDLOOP_MODEL` (the offline demo without an API key).

`graph` is a graph factory (langgraph-api calls it per run with the assistant's config and the run's context):
an assistant chooses its model, limits, demo tools and system prompt with the keys of `AssistantSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from pydantic import ValidationError

from gatedloop.checkpoints.contract import POSTGRES_PREFIXES
from gatedloop.checkpoints.devserver import DB_ENV, studio_db_path
from gatedloop.checkpoints.ledger import Ledger, SqliteLedger
from gatedloop.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.demo.model import choose_model
from gatedloop.graph.build import build_graph
from gatedloop.graph.models import ModelConfigError
from gatedloop.nodes.limits import Limits
from gatedloop.tools.policy import ToolPolicy

if TYPE_CHECKING:  # resolved by langgraph-api from the annotation's name; the SDK is the server's dependency
    from langgraph_sdk.runtime import ServerRuntime

LEDGER_ENV = "GATEDLOOP_LEDGER"
DEMO_DATA_ENV = "GATEDLOOP_DEMO_DATA"


def studio_ledger_path() -> Path:
    """`GATEDLOOP_LEDGER` if set, else the checkpoint file itself (`GATEDLOOP_DB`)."""
    override = os.environ.get(LEDGER_ENV)
    return Path(override).expanduser() if override else studio_db_path()


def studio_ledger() -> tuple[Ledger, Path]:
    """The ledger (`GATEDLOOP_LEDGER`, else `GATEDLOOP_DB`: a SQLite file or a Postgres URL) and the demo data file."""
    target = os.environ.get(LEDGER_ENV) or os.environ.get(DB_ENV) or ""
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import PostgresLedger

        demo_data = Path(os.environ.get(DEMO_DATA_ENV) or ".gatedloop/demo-data.sqlite").expanduser()
        return PostgresLedger(target), demo_data
    ledger_path = studio_ledger_path()
    return SqliteLedger(ledger_path), ledger_path.with_name("demo-data.sqlite")


ASSISTANT_KEYS = ("model", "limits", "tools", "system_prompt")


class AssistantConfigError(ValueError):
    """An assistant's configuration names something that does not exist or breaks a limit."""


@dataclass(frozen=True)
class AssistantSettings:
    """What one assistant of the served graph may choose (documented keys, see the README).

    - `model`: as `GATEDLOOP_MODEL` (`demo`, a ChatOpenAI model name, or `provider:model`); default: the env's.
    - `limits`: a dict of `Limits` fields, e.g. `{"max_model_calls": 4}`; unknown fields are refused.
    - `tools`: the demo tools this assistant may use (names); default: all of them.
    - `system_prompt`: a string every model call starts with.
    """

    model: str | None = None
    limits: Limits = field(default_factory=Limits)
    tools: tuple[str, ...] | None = None
    system_prompt: str | None = None


def assistant_settings(config: Mapping[str, Any] | None, context: Any = None) -> AssistantSettings:
    """Read the documented keys from the assistant's `config["configurable"]` and its `context` (context wins)."""
    found: dict[str, Any] = {}
    for source in ((config or {}).get("configurable") or {}, context if isinstance(context, Mapping) else {}):
        found.update({key: source[key] for key in ASSISTANT_KEYS if source.get(key) is not None})
    try:
        limits = Limits.model_validate(found.get("limits") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise AssistantConfigError(f"assistant `limits` is invalid: {where}: {first['msg']}") from None
    tools = found.get("tools")
    if tools is not None and (isinstance(tools, str) or not all(isinstance(t, str) for t in tools)):
        raise AssistantConfigError("assistant `tools` must be a list of tool names")
    model, prompt = found.get("model"), found.get("system_prompt")
    if model is not None and not isinstance(model, str):
        raise AssistantConfigError("assistant `model` must be a string such as 'demo' or 'openai:gpt-4o-mini'")
    if prompt is not None and not isinstance(prompt, str):
        raise AssistantConfigError("assistant `system_prompt` must be a string")
    return AssistantSettings(model, limits, tuple(tools) if tools is not None else None, prompt)


@lru_cache(maxsize=1)
def _shared() -> tuple[Ledger, DemoStore]:
    """One ledger and one demo data store per server process, whichever assistant runs."""
    ledger, demo_data = studio_ledger()
    demo_data.parent.mkdir(parents=True, exist_ok=True)
    return ledger, DemoStore(demo_data)


def make_studio_tools() -> tuple[list[BaseTool], dict[str, ToolPolicy], Ledger]:
    """The demo tools (data beside the ledger), their policies, and the ledger."""
    ledger, store = _shared()
    return build_demo_tools(store), demo_policies(store), ledger


tools, policies, _ledger = make_studio_tools()
"""Kept for the approval inbox served beside this graph (`gatedloop.inbox.server`): argument schemas, who may
approve."""


@lru_cache(maxsize=16)
def _model(spec: str | None) -> BaseChatModel:
    return choose_model(spec)


def make_studio_graph(settings: AssistantSettings | None = None) -> CompiledStateGraph:
    settings = settings or AssistantSettings()
    ledger, store = _shared()
    tools = build_demo_tools(store)
    policies = demo_policies(store)
    if settings.tools is not None:
        unknown = sorted(set(settings.tools) - {t.name for t in tools})
        if unknown:
            raise AssistantConfigError(
                f"assistant `tools` names unknown tools {unknown}; available: {sorted(t.name for t in tools)}"
            )
        tools = [t for t in tools if t.name in settings.tools]
        policies = {name: policy for name, policy in policies.items() if name in settings.tools}
    return build_graph(
        _model(settings.model),
        tools,
        policies=policies,
        limits=settings.limits,
        ledger=ledger,
        system_prompt=settings.system_prompt,
        name="gatedloop",
    )


@lru_cache(maxsize=32)
def _served_graph(settings: AssistantSettings) -> CompiledStateGraph:
    """One compiled graph per assistant settings: building one (nine tool schemas, compiling) takes 30-100 ms, and
    the server times every factory call, logging "Slow graph load" above 100 ms. A compiled graph holds no run
    state (the server copies it with its checkpointer per call), so reusing it changes nothing else."""
    return make_studio_graph(settings)


async def graph(config: RunnableConfig, runtime: ServerRuntime) -> CompiledStateGraph:
    """The graph factory LangGraph Server calls for each run (and each read), with the assistant's config and the
    run's context, so two assistants of this one graph can use different models, limits and tools. Building opens
    SQLite files and may load a model client: off the server's event loop."""
    settings = assistant_settings(config, getattr(runtime, "context", None))
    return await asyncio.to_thread(_served_graph, settings)


# The default assistant's graph, built while the server imports this module (untimed), so its first run is a cache
# hit too. A model that is not configured fails at the first run, as without this.
with contextlib.suppress(ModelConfigError):
    _served_graph(AssistantSettings())
