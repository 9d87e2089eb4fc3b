"""Two graphs of one agent, served side by side (langgraph.json): `tables` and `rooms`.

The model is any OpenAI-compatible endpoint when `BOOKINGS_OPENAI_BASE_URL` is set (with `BOOKINGS_MODEL`), else a
scripted model that proposes the booking the user asks for, so the example runs offline. The graphs are compiled
without a checkpointer and without a ledger: the server supplies gatedloop's checkpointer, whose database keeps the
ledger too.
"""

from __future__ import annotations

import os
import re

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph

from bookings_agent.tools import POLICIES, book_room, opening_hours, reserve_table
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply


def scripted_booking(messages: list[BaseMessage]) -> AIMessage:
    """'a table for 4 at Chez Ana' or 'a room for 2 nights at Hotel Sol' -> that booking, then a summary."""
    if isinstance(messages[-1], ToolMessage):
        return reply(f"Done: {messages[-1].content}")
    text = [m for m in messages if isinstance(m, HumanMessage)][-1].text  # a string or content blocks
    table = re.search(r"table for (\d+) at (.+)", text)
    if table:
        return reply(calls=[call("reserve_table", {"restaurant": table[2], "people": int(table[1])})])
    room = re.search(r"room for (\d+) nights? at (.+)", text)
    if room:
        return reply(calls=[call("book_room", {"hotel": room[2], "nights": int(room[1])})])
    return reply("Tell me what to book: a table for N at PLACE, or a room for N nights at HOTEL.")


def model() -> BaseChatModel:
    base_url = os.environ.get("BOOKINGS_OPENAI_BASE_URL")
    if not base_url:
        return ScriptedChatModel(responder=scripted_booking)
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url, model=os.environ.get("BOOKINGS_MODEL", "gpt-4o-mini"))


def agent(name: str, tools: list[BaseTool], prompt: str) -> CompiledStateGraph:
    policies = {tool.name: POLICIES[tool.name] for tool in tools}
    return build_graph(model(), tools, policies=policies, system_prompt=prompt, name=name)


tables = agent("tables", [reserve_table, opening_hours], "You reserve restaurant tables.")
rooms = agent("rooms", [book_room], "You book hotel rooms.")
