"""The offline demo model: plays the source articles' scenarios as a function of the conversation.

Because each reply depends only on the messages, a thread paused in one process and resumed in another
gets the same replies, and the demo needs no key and no network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from gatedloop.graph.models import DEMO_SPEC, configured_spec, load_model
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

DEMO_QUESTIONS = {
    "order": "订单 ORD-2026-001 到哪里了?",
    "lunch": "Schedule lunch with Alice on 2026-03-06",
    "workshop": "Reserve a seat in workshop WS-101 for 李娜",
    "trip": "Is train G1234 on time on 2026-03-07, and what's the weather in Shanghai?",
    "math": "What is (17 + 25) * 3?",
}

Step = Callable[[str, list[ToolMessage], str], AIMessage]


def _results(turn: list[BaseMessage]) -> list[ToolMessage]:
    return [m for m in turn if isinstance(m, ToolMessage)]


def _json(message: ToolMessage) -> dict[str, Any]:
    try:
        value = json.loads(str(message.content))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _failed(results: list[ToolMessage]) -> ToolMessage | None:
    return next((m for m in results if m.status == "error"), None)


def _reviewer_answer(results: list[ToolMessage]) -> AIMessage | None:
    """A reviewer who answered in a write's place (`respond`): relay what they said."""
    for message in results:
        body = _json(message)
        if body.get("answered_by") == "reviewer":
            return reply(f"A reviewer handled {message.name} instead: {body.get('result')}")
    return None


def _explain(failure: ToolMessage) -> AIMessage:
    error = _json(failure).get("error", {})
    return reply(
        f"I could not complete that: {failure.name} was not done ({error.get('type')}: {error.get('message')})."
    )


def _find(pattern: str, text: str, default: str) -> str:
    found = re.search(pattern, text)
    return found.group(0) if found else default


def _order(question: str, results: list[ToolMessage], tag: str) -> AIMessage:
    if not results:
        order_id = _find(r"ORD-[\w-]+", question, "")
        return reply(calls=[call("query_order", {"order_id": order_id}, f"{tag}_order")])
    if (failure := _failed(results)) is not None:
        return _explain(failure)
    order = _json(results[0])
    if len(results) == 1 and order.get("tracking_no"):
        return reply(calls=[call("query_logistics", {"tracking_no": order["tracking_no"]}, f"{tag}_logistics")])
    if len(results) == 1:
        return reply(f"The order is {order.get('status')}; it has no tracking number yet.")
    track = _json(results[1])
    return reply(f"订单已经发货,最新进度是“{track.get('latest_event')}”,更新时间为 {track.get('updated_at')}。")


def _lunch(question: str, results: list[ToolMessage], tag: str) -> AIMessage:
    day = _find(r"\d{4}-\d{2}-\d{2}", question, "2026-03-06")
    name = "Alice" if "alice" in question.lower() else "Bob"
    if not results:
        return reply(
            calls=[
                call("check_calendar", {"date": day, "user": "me"}, f"{tag}_calendar"),
                call("lookup_contact", {"name": name}, f"{tag}_contact"),
            ]
        )
    if (failure := _failed(results)) is not None:
        return _explain(failure)
    if (relayed := _reviewer_answer(results)) is not None:
        return relayed
    if len(results) == 2:
        contact = _json(results[1])
        event = {
            "title": f"Lunch with {name}",
            "date": day,
            "start": "13:00",
            "end": "14:00",
            "attendees": [contact.get("email", name)],
        }
        return reply(calls=[call("create_event", event, f"{tag}_event")])
    created = _json(results[-1])
    event = created.get("result", created)
    return reply(
        f"Lunch is booked: {event.get('title')} on {event.get('date')} {event.get('start')}-{event.get('end')}"
        f" (event {event.get('event_id')})."
    )


def _workshop(question: str, results: list[ToolMessage], tag: str) -> AIMessage:
    person = question.rsplit(" for ", 1)[-1].strip() if " for " in question else "me"
    if not results:
        args = {"event_id": _find(r"WS-\d+", question, "WS-101"), "participant": person}
        return reply(calls=[call("reserve_seat", args, f"{tag}_seat")])
    if (failure := _failed(results)) is not None:
        return _explain(failure)
    if (relayed := _reviewer_answer(results)) is not None:
        return relayed
    seat = _json(results[0])
    seat = seat.get("result", seat)
    return reply(
        f"Reserved: {seat.get('reservation_id')} for {seat.get('participant')} in {seat.get('event_id')}"
        f" ({seat.get('seats_left')} seats left)."
    )


def _trip(question: str, results: list[ToolMessage], tag: str) -> AIMessage:
    if not results:
        return reply(
            calls=[
                call("get_train_status", {"train_no": "G1234", "date": "2026-03-07"}, f"{tag}_train"),
                call("get_weather", {"city": "Shanghai"}, f"{tag}_weather"),
            ]
        )
    train, weather = (_json(m) for m in results[:2])
    return reply(
        f"G1234 is {train.get('status')} ({train.get('delay_minutes', 0)} min); Shanghai is "
        f"{weather.get('temperature')}°C, {weather.get('condition')}."
    )


def _math(question: str, results: list[ToolMessage], tag: str) -> AIMessage:
    expression = question.split("is", 1)[-1].strip(" ?") if "is" in question else question
    if not results:
        return reply(calls=[call("calculator", {"expression": expression}, f"{tag}_calc")])
    return reply(f"{expression} = {_json(results[0]).get('result')}")


def _scenario(question: str) -> Step | None:
    lowered = question.lower()
    if "ord-" in lowered:
        return _order
    if "lunch" in lowered or "午餐" in question:
        return _lunch
    if "ws-" in lowered or "workshop" in lowered or "工作坊" in question:
        return _workshop
    if "train" in lowered or "列车" in question:
        return _trip
    if re.search(r"\d\s*[-+*/]\s*\d", question):
        return _math
    return None


def demo_responder(messages: list[BaseMessage]) -> AIMessage:
    """Reply from the last user message and the tool results that followed it."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    if not humans:
        return reply("Ask me about an order, a lunch, a workshop seat, a train, or some arithmetic.")
    start = humans[-1]
    question = messages[start].text  # a string or content blocks (Agent Chat UI sends [{"type": "text", ...}])
    step = _scenario(question)
    if step is None:
        return reply(
            "I can track orders, schedule lunches, reserve workshop seats, check trains and weather, "
            "and do arithmetic. Try: " + DEMO_QUESTIONS["order"]
        )
    return step(question, _results(messages[start + 1 :]), f"call_{len(humans)}")


def demo_model() -> ScriptedChatModel:
    return ScriptedChatModel(responder=demo_responder)


def choose_model(spec: str | None = None) -> BaseChatModel:
    """The configured model (`gatedloop.graph.models.load_model`), or this offline demo when none is configured or
    `GATEDLOOP_MODEL=demo`: what the CLI and the Studio graph use."""
    chosen = configured_spec(spec)
    return demo_model() if chosen in (None, DEMO_SPEC) else load_model(chosen)


def describe_choice(spec: str | None = None) -> str:
    chosen = configured_spec(spec)
    if chosen in (None, DEMO_SPEC):
        return "demo (scripted, offline; set GATEDLOOP_MODEL and OPENAI_API_KEY for a real model)"
    return str(chosen)
