"""Per-assistant configuration of the served graph, and a client's `command.goto` (Agent Chat UI's "Mark as
resolved"), under real `langgraph dev`.

`gatedloop.demo.studio:graph` is a graph factory: langgraph-api calls it per run with the assistant's config and
the run's context, so two assistants of the one graph differ in model, limits, tools and system prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from devserver import run_dev_server
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage, messages_from_dict
from langgraph_sdk import get_sync_client

from gatedloop.demo.studio import AssistantConfigError, assistant_settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
GRAPH = "gatedloop"
WORKSHOP = "Reserve a seat in workshop WS-101 for {who}"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("assistants")
    env = {
        "GATEDLOOP_MODEL": "demo",
        "GATEDLOOP_DB": str(folder / "studio.sqlite"),
        "GATEDLOOP_LEDGER": None,
        "OPENAI_API_KEY": None,
    }
    with run_dev_server(ROOT, env=env, workdir=folder / "server", config_overrides={"env": None}) as url:
        yield get_sync_client(url=url, api_key=None, timeout=60)


def run(client: Any, assistant_id: str, text: str) -> tuple[str, dict[str, Any]]:
    thread_id = client.threads.create()["thread_id"]
    out = client.runs.wait(thread_id, assistant_id, input={"messages": [{"role": "user", "content": text}]})
    return thread_id, out


def tool_messages(values: dict[str, Any]) -> list[ToolMessage]:
    messages = messages_from_dict([{"type": m["type"], "data": m} for m in values["messages"]])
    return [m for m in messages if isinstance(m, ToolMessage)]


def test_two_assistants_of_one_graph_differ_in_limits_and_tools(client: Any) -> None:
    tight = client.assistants.create(GRAPH, config={"configurable": {"limits": {"max_model_calls": 1}}}, name="tight")
    reads = client.assistants.create(GRAPH, context={"tools": ["get_weather", "calculator"]}, name="reads-only")

    # The default assistant: pauses for approval, then completes.
    thread, out = run(client, GRAPH, WORKSHOP.format(who="Ana"))
    assert out["__interrupt__"][0]["value"]["action_requests"][0]["name"] == "reserve_seat"
    done = client.runs.wait(thread, GRAPH, command={"resume": {"decisions": [{"type": "approve"}]}})
    assert done["status"] == "completed"

    # One model call allowed: after the approved write, the loop stops for its limit instead of answering.
    thread, out = run(client, tight["assistant_id"], WORKSHOP.format(who="Bo"))
    assert "__interrupt__" in out
    stopped = client.runs.wait(thread, tight["assistant_id"], command={"resume": {"decisions": [{"type": "approve"}]}})
    assert stopped["status"] == "step_limit" and stopped["answer"] is None

    # No reserve_seat for this assistant: the call is refused before anyone is asked, nothing is booked.
    _, out = run(client, reads["assistant_id"], WORKSHOP.format(who="Cy"))
    assert "__interrupt__" not in out
    [refused] = [m for m in tool_messages(out) if m.name == "reserve_seat"]
    assert json.loads(refused.content)["error"]["type"] == "unknown_tool"
    assert "get_weather, calculator" in json.loads(refused.content)["error"]["message"]
    assert_each_call_answered_once(messages_from_dict([{"type": m["type"], "data": m} for m in out["messages"]]))


def test_an_assistant_choosing_a_model_or_limits_that_do_not_exist_gets_a_clear_error(client: Any) -> None:
    bad_model = client.assistants.create(GRAPH, context={"model": "nosuchprovider:m1"}, name="bad-model")
    bad_limits = client.assistants.create(GRAPH, config={"configurable": {"limits": {"max_modle_calls": 3}}})
    for assistant, words in ((bad_model, "nosuchprovider:m1"), (bad_limits, "max_modle_calls")):
        thread_id = client.threads.create()["thread_id"]
        run_ = client.runs.create(
            thread_id, assistant["assistant_id"], input={"messages": [{"role": "user", "content": "hi"}]}
        )
        client.runs.join(thread_id, run_["run_id"])
        assert client.runs.get(thread_id, run_["run_id"])["status"] == "error"
        assert client.threads.get(thread_id)["status"] == "error"
        assert words in json.dumps(client.threads.get(thread_id).get("error") or client.threads.get(thread_id))


@pytest.mark.parametrize("target", ["__end__", "finalize", "execute", "model"])
def test_a_clients_goto_is_refused_and_the_request_stays_answerable(client: Any, target: str) -> None:
    """Agent Chat UI's "Mark as resolved" sends `command.goto="__end__"`; an attacker might route to a node. A routed
    node would run beside the paused `approve` and wedge the thread (the next resume raised InvalidUpdateError:
    `finalize` and `approve` both wrote `calls`), so the server refuses every goto before the run exists."""
    thread, out = run(client, GRAPH, WORKSHOP.format(who="Di"))
    request = out["__interrupt__"][0]["value"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        client.runs.wait(thread, GRAPH, command={"goto": target})
    assert refused.value.response.status_code == 422 and "command.goto" in refused.value.response.text
    state = client.threads.get_state(thread)
    assert client.threads.get(thread)["status"] == "interrupted"
    assert state["interrupts"][0]["value"] == request and state["next"] == ["approve"]
    assert tool_messages(state["values"]) == []
    # What to use instead: reject, with a reason; the call is answered and the thread ends.
    reject = {"decisions": [{"type": "reject", "message": "resolved elsewhere"}]}
    done = client.runs.wait(thread, GRAPH, command={"resume": reject})
    assert done["status"] == "completed" and client.threads.get(thread)["status"] == "idle"
    [answer] = tool_messages(done)
    assert json.loads(answer.content)["error"]["type"] == "rejected_by_reviewer"


@pytest.mark.parametrize(
    ("config", "context", "error"),
    [
        ({"configurable": {"limits": {"max_model_calls": 0}}}, None, "limits.*max_model_calls"),
        (None, {"tools": "get_weather"}, "list of tool names"),
        (None, {"model": 3}, "`model` must be a string"),
    ],
)
def test_assistant_settings_are_checked(config: Any, context: Any, error: str) -> None:
    with pytest.raises(AssistantConfigError, match=error):
        assistant_settings(config, context)


def test_context_wins_over_config_and_unknown_tools_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gatedloop.demo import studio

    monkeypatch.setenv("GATEDLOOP_DB", str(tmp_path / "studio.sqlite"))
    monkeypatch.delenv("GATEDLOOP_LEDGER", raising=False)
    studio._shared.cache_clear()
    monkeypatch.setattr(studio, "_shared", studio._shared.__wrapped__)
    settings = assistant_settings(
        {"configurable": {"model": "demo", "system_prompt": "a"}}, {"system_prompt": "b", "tools": ["calculator"]}
    )
    assert (settings.model, settings.system_prompt, settings.tools) == ("demo", "b", ("calculator",))
    with pytest.raises(AssistantConfigError, match=r"unknown tools \['nope'\]"):
        studio.make_studio_graph(assistant_settings(None, {"tools": ["nope"]}))


def test_the_factory_builds_one_graph_per_assistant_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """langgraph-api times every factory call (each run and each read) and logs "Slow graph load" above 100 ms; a
    build takes 30-100 ms, so the factory builds once per assistant settings and then returns that graph."""
    import asyncio
    from types import SimpleNamespace

    from gatedloop.demo import studio
    from gatedloop.graph.parts_of import parts_of

    built: list[Any] = []
    monkeypatch.setattr(studio, "make_studio_graph", lambda settings: built.append(settings) or object())
    studio._served_graph.cache_clear()
    try:
        graphs = [
            asyncio.run(studio.graph({"configurable": {"model": "demo"}}, SimpleNamespace(context=context)))
            for context in (None, {"tools": ["calculator"]}, None, {"tools": ["calculator"]})
        ]
    finally:
        studio._served_graph.cache_clear()
    assert graphs[0] is graphs[2] and graphs[1] is graphs[3] and graphs[0] is not graphs[1]
    assert [s.tools for s in built] == [None, ("calculator",)]

    monkeypatch.undo()
    served = asyncio.run(studio.graph({}, SimpleNamespace(context={"tools": ["calculator"]})))
    assert served is asyncio.run(studio.graph({}, SimpleNamespace(context={"tools": ["calculator"]})))
    parts = parts_of(served)
    assert parts is not None and list(parts.registry.tools) == ["calculator"]
