"""Smoke tests for tests/support/devserver.py: a throwaway interrupting graph served by the real ``langgraph dev``.

The graph module and langgraph.json are written into tmp_path by the tests themselves.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from devserver import run_dev_server
from langgraph_sdk import get_sync_client

pytestmark = pytest.mark.slow

AGENT_PY = textwrap.dedent(
    """
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt


    class State(TypedDict, total=False):
        request: str
        decision: str
        status: str


    def gate(state: State) -> State:
        answer = interrupt({"kind": "approval", "request": state.get("request", "")})
        status = "approved" if answer["decision"] == "yes" else "denied"
        return {"decision": answer["decision"], "status": status}


    builder = StateGraph(State)
    builder.add_node("gate", gate)
    builder.add_edge(START, "gate")
    builder.add_edge("gate", END)
    # No checkpointer: the dev server refuses graphs compiled with one and supplies its own.
    graph = builder.compile()
    """
)

CHECKPOINTER_PY = textwrap.dedent(
    """
    import os
    from contextlib import asynccontextmanager

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver


    @asynccontextmanager
    async def make_checkpointer():
        async with AsyncSqliteSaver.from_conn_string(os.environ["SMOKE_CKPT_DB"]) as saver:
            await saver.setup()
            yield saver
    """
)


def _write_project(root: Path, *, checkpointer: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "agent.py").write_text(AGENT_PY)
    config: dict[str, Any] = {"dependencies": ["."], "graphs": {"agent": "./agent.py:graph"}}
    if checkpointer:
        (root / "ckpt.py").write_text(CHECKPOINTER_PY)
        config["checkpointer"] = {"path": "./ckpt.py:make_checkpointer"}
    (root / "langgraph.json").write_text(json.dumps(config))
    return root


def _client(url: str):
    # api_key=None: don't pick up LANGSMITH_API_KEY etc. from the environment.
    return get_sync_client(url=url, api_key=None, timeout=30)


def _start_until_interrupt(client, request: str) -> tuple[str, dict[str, Any]]:
    thread_id = client.threads.create()["thread_id"]
    result = client.runs.wait(thread_id, "agent", input={"request": request})
    assert isinstance(result, dict)
    # runs.wait returns the thread values plus "__interrupt__": [{"value", "id", ...}].
    assert [i["value"] for i in result["__interrupt__"]] == [{"kind": "approval", "request": request}]
    return thread_id, result


def _assert_interrupted(client, thread_id: str, request: str) -> None:
    state = client.threads.get_state(thread_id)
    expected = {"kind": "approval", "request": request}
    assert state["next"] == ["gate"]
    assert [i["value"] for i in state["interrupts"]] == [expected]
    assert [i["value"] for i in state["tasks"][0]["interrupts"]] == [expected]
    thread = client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    assert [i["value"] for i in thread["interrupts"][state["tasks"][0]["id"]]] == [expected]


def _resume(client, thread_id: str, decision: str) -> dict[str, Any]:
    result = client.runs.wait(thread_id, "agent", command={"resume": {"decision": decision}})
    assert isinstance(result, dict)
    assert "__interrupt__" not in result
    state = client.threads.get_state(thread_id)
    assert state["next"] == []
    assert state["interrupts"] == []
    assert state["values"] == result
    assert client.threads.get(thread_id)["status"] == "idle"
    return result


def test_interrupt_and_resume_roundtrip(tmp_path: Path) -> None:
    project = _write_project(tmp_path / "proj")
    with run_dev_server(project, timeout_s=60) as url:
        assert url.startswith("http://127.0.0.1:")
        client = _client(url)
        thread_id, _ = _start_until_interrupt(client, "rm -rf /tmp/x")
        _assert_interrupted(client, thread_id, "rm -rf /tmp/x")
        final = _resume(client, thread_id, "yes")
        assert final == {"request": "rm -rf /tmp/x", "decision": "yes", "status": "approved"}
    # The server ran in its own scratch cwd: no .langgraph_api state in the project.
    assert not (project / ".langgraph_api").exists()


def test_interrupted_thread_survives_restart_with_same_workdir(tmp_path: Path) -> None:
    project = _write_project(tmp_path / "proj")
    workdir = tmp_path / "work"
    with run_dev_server(project, workdir=workdir) as url:
        client = _client(url)
        thread_id, _ = _start_until_interrupt(client, "deploy")
    assert (workdir / ".langgraph_api").is_dir()
    with run_dev_server(project, workdir=workdir) as url:
        client = _client(url)
        _assert_interrupted(client, thread_id, "deploy")
        final = _resume(client, thread_id, "no")
        assert final == {"request": "deploy", "decision": "no", "status": "denied"}


def test_custom_sqlite_checkpointer_from_langgraph_json(tmp_path: Path) -> None:
    project = _write_project(tmp_path / "proj", checkpointer=True)
    db = tmp_path / "ckpt.sqlite"
    workdir = tmp_path / "work"
    with run_dev_server(project, workdir=workdir, env={"SMOKE_CKPT_DB": str(db)}) as url:
        client = _client(url)
        thread_id, _ = _start_until_interrupt(client, "email boss")
        _assert_interrupted(client, thread_id, "email boss")
        final = _resume(client, thread_id, "yes")
        assert final["status"] == "approved"
    log = (workdir / "langgraph-dev.log").read_text()
    assert "Using custom checkpointer: AsyncSqliteSaver" in log
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)).fetchone()
    assert rows[0] >= 2
