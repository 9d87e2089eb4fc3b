"""What a user needs to unit-test an agent: the README's examples run as written, LangChain's fakes are refused
with a line that names the fix, and ScriptedChatModel's automatic call ids survive a resume in a new process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_text import section
from invariants import assert_each_call_answered_once
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    FakeMessagesListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, ToolMessage
from sample_app import Effects, make_tools, policies

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.models import ModelCannotBindTools
from gatedloop.graph.scripted import ScriptedChatModel

SUPPORT = Path(__file__).parent / "support"


def python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section, re.S)


SECTION = section("Testing your agent")


@pytest.mark.parametrize("index", range(2), ids=["scripted-model", "langchain-fakes"])
def test_the_readme_examples_run_as_written(index: int) -> None:
    blocks = python_blocks(SECTION)
    assert len(blocks) == 2
    exec(compile(blocks[index], f"docs/testing.md, block {index + 1}", "exec"), {"__name__": "readme"})


FAKES: dict[str, BaseChatModel] = {
    "GenericFakeChatModel": GenericFakeChatModel(messages=iter([AIMessage("hi")])),
    "FakeMessagesListChatModel": FakeMessagesListChatModel(responses=[AIMessage("hi")]),
    "FakeListChatModel": FakeListChatModel(responses=["hi"]),
}


@pytest.mark.parametrize("name", FAKES)
def test_a_model_that_cannot_bind_tools_is_refused_in_one_line_naming_the_fix(name: str, tmp_path: Path) -> None:
    effects = Effects(tmp_path / "effects.sqlite")
    with pytest.raises(ModelCannotBindTools) as caught:
        build_graph(FAKES[name], make_tools(effects), policies=policies(effects))
    line = f"{type(caught.value).__name__}: {caught.value}"
    assert "\n" not in line
    assert f"{name}.bind_tools is not implemented" in line and "ScriptedChatModel" in line
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    if name == "GenericFakeChatModel":
        assert f"```\n{line}\n```" in SECTION  # the docs quote the real message


CHILD = """
import json, sys
from pathlib import Path
from langchain_core.messages import ToolMessage
from sample_app import Effects, make_tools, policies
from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

def responder(messages):
    answered = sum(isinstance(m, ToolMessage) for m in messages)
    if answered == 0:
        return reply(calls=[call("book", {"item": "seat", "quantity": 1})])
    if answered == 1:
        return reply(calls=[call("lookup", {"query": "seat map"})])
    return reply("booked, and here is the seat map")

db, step = sys.argv[1], sys.argv[2]
effects = Effects(Path(db).with_name("effects.sqlite"))
with open_sqlite(db) as saver:
    model = ScriptedChatModel(responder=responder)
    limits = Limits(model_retries=0)  # a refused reply is not retried, so a reused id cannot hide behind a retry
    graph = build_graph(model, make_tools(effects), policies=policies(effects), limits=limits, checkpointer=saver)
    if step == "start":
        out = runs.start(graph, "t1", "book a seat, then show me the seat map")
    else:
        out = runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]})
    print(json.dumps({"status": out.get("status"), "paused": "__interrupt__" in out}))
"""


def run_child(db: str, step: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", CHILD, db, step], capture_output=True, text=True, env=env, timeout=60)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_automatic_call_ids_stay_unique_when_a_new_process_resumes_the_thread(db: str) -> None:
    """Each process starts fresh; ids planned without one must still never repeat within the thread."""
    assert run_child(db, "start")["paused"]
    assert run_child(db, "resume") == {"status": "completed", "paused": False}

    effects = Effects(Path(db).with_name("effects.sqlite"))
    assert [row[0] for row in effects.rows()] == ["book"]
    with open_sqlite(db) as saver:
        graph = build_graph(ScriptedChatModel(), make_tools(effects), policies=policies(effects), checkpointer=saver)
        messages = graph.get_state({"configurable": {"thread_id": "t1"}}).values["messages"]
    ids = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert len(ids) == 2 and len(set(ids)) == 2 and all(ids)
    assert [m.tool_call_id for m in messages if isinstance(m, ToolMessage)] == ids
    assert_each_call_answered_once(messages)
