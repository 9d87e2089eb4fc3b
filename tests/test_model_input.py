"""What a model call hands the chat model: the thread's messages as they are, not converted again per call."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import langchain_core.language_models.chat_models as chat_models
import pytest
from langchain_core.messages import BaseMessage
from sample_app import Effects, make_tools, policies

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages LangChain's chat model converts from its input, per call."""
    seen: list[int] = []
    convert = chat_models.convert_to_messages

    def counted(messages: Any) -> list[BaseMessage]:
        seen.append(len(messages))
        return convert(messages)

    monkeypatch.setattr(chat_models, "convert_to_messages", counted)
    return seen


def responder(received: list[list[BaseMessage]]) -> Any:
    def respond(messages: list[BaseMessage]) -> Any:
        received.append(messages)
        if messages[-1].type == "human":
            return reply(calls=[call("lookup", {"query": str(messages[-1].content)})])
        return reply("done")

    return respond


def test_the_thread_reaches_the_model_unconverted(db: Path, conversions: list[int]) -> None:
    """Each model call hands over the thread's messages themselves: LangChain converts none of them again (a walk
    over the whole thread in Python at each call), sync and async."""
    received: list[list[BaseMessage]] = []
    effects = Effects(Path(db).with_name("effects.sqlite"))
    with open_sqlite(db) as saver:
        model = ScriptedChatModel(responder=responder(received))
        graph = build_graph(model, make_tools(effects), policies=policies(effects), checkpointer=saver)
        cfg = {"configurable": {"thread_id": "t"}}
        for turn in range(3):
            out = graph.invoke({"messages": [("user", f"q{turn}")]}, cfg, durability="sync")
            assert out["status"] == "completed"
    assert conversions == []
    assert len(received) == 6
    assert [m.id for m in received[-1]] == [m.id for m in out["messages"][:-1]]


def test_the_async_model_call_hands_over_the_thread_unconverted(db: Path, conversions: list[int]) -> None:
    received: list[list[BaseMessage]] = []
    effects = Effects(Path(db).with_name("effects.sqlite"))

    async def main() -> dict[str, Any]:
        async with open_async_sqlite(db) as saver:
            model = ScriptedChatModel(responder=responder(received))
            graph = build_graph(model, make_tools(effects), policies=policies(effects), checkpointer=saver)
            return await graph.ainvoke({"messages": [("user", "q")]}, {"configurable": {"thread_id": "t"}})

    out = asyncio.run(main())
    assert out["status"] == "completed"
    assert conversions == []
    assert [m.id for m in received[-1]] == [m.id for m in out["messages"][:-1]]
