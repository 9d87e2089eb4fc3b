"""Loading the model `GATEDLOOP_MODEL` names, and binding the loop's tools to it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEMO_SPEC = "demo"
"""`GATEDLOOP_MODEL=demo` asks for the offline demo model, which only the entry points above the core can build."""


class ModelConfigError(ValueError):
    pass


def configured_spec(spec: str | None = None) -> str | None:
    """The model asked for: `spec`, else `GATEDLOOP_MODEL`, else ChatOpenAI's default when `OPENAI_API_KEY` is set;
    None when nothing is configured (the caller decides what that means: the CLI and Studio play the demo)."""
    spec = (spec or os.environ.get("GATEDLOOP_MODEL") or "").strip()
    if spec:
        return spec
    return DEFAULT_OPENAI_MODEL if os.environ.get("OPENAI_API_KEY") else None


def load_model(spec: str | None = None) -> BaseChatModel:
    """A bare name for ChatOpenAI (honours OPENAI_API_KEY, OPENAI_BASE_URL), or `provider:model` through LangChain's
    `init_chat_model`. The offline demo model is not a provider: `gatedloop.demo.choose_model` plays it."""
    chosen = configured_spec(spec)
    if chosen is None or chosen == DEMO_SPEC:
        raise ModelConfigError(
            "no model configured: set GATEDLOOP_MODEL (a ChatOpenAI model name or provider:model) and its API key; "
            "the offline demo model is gatedloop.demo.choose_model / demo_model"
        )
    provider, _, name = chosen.partition(":")
    if not name or provider == "openai":
        from langchain_openai import ChatOpenAI
        from openai import OpenAIError

        try:
            return ChatOpenAI(model=name or provider, stream_usage=True)
        except OpenAIError as exc:  # raised at construction when no API key is configured
            raise ModelConfigError(
                f"GATEDLOOP_MODEL={chosen!r} needs OPENAI_API_KEY (or unset GATEDLOOP_MODEL / set it to demo for the "
                "offline model)"
            ) from exc
    try:
        from langchain.chat_models import init_chat_model
    except ImportError as exc:
        raise ModelConfigError(
            f"GATEDLOOP_MODEL={chosen!r} needs `pip install langchain langchain-{provider}`"
        ) from exc
    try:
        return init_chat_model(chosen)
    except (ImportError, ValueError) as exc:
        raise ModelConfigError(f"cannot load model {chosen!r}: {exc}") from exc


class ModelCannotBindTools(TypeError):
    """The chat model has no tool calling (`bind_tools` is LangChain's unimplemented default)."""


def bind_loop_tools(
    model: BaseChatModel, tools: Sequence[BaseTool | dict[str, Any]], **kwargs: Any
) -> Runnable[Any, BaseMessage]:
    """`model.bind_tools(tools)`, or one line saying what to use instead (LangChain's fakes cannot bind tools)."""
    try:
        return model.bind_tools(tools, **kwargs)
    except NotImplementedError:
        name = type(model).__name__
        raise ModelCannotBindTools(
            f"build_graph needs a chat model with tool calling, and {name}.bind_tools is not implemented; "
            "use a provider's chat model, or in tests gatedloop.graph.scripted.ScriptedChatModel "
            "(or a LangChain fake whose bind_tools returns self; see README 'Testing your agent')"
        ) from None
