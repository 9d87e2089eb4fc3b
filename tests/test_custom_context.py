"""A graph's own `context_schema` travels (issue 29, finding 7): through the CLI (`--context JSON` or @FILE) and
to answers that carry no context (the CLI's `resume`, the inboxes, Agent Chat UI), which reuse the fields the
request was made under; identity fields are never reused."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run_cli
from langgraph.types import Command

TEAM_AGENT = textwrap.dedent(
    '''
    import json
    import os
    from dataclasses import dataclass, field

    from langchain.tools import ToolRuntime
    from langchain_core.tools import tool

    from gatedloop.graph import ToolPolicy, build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply


    @dataclass
    class TeamContext:
        tenant: str  # required: no default
        user_id: str | None = None
        roles: list[str] = field(default_factory=list)


    @tool
    def refund(order: str, runtime: ToolRuntime[TeamContext]) -> str:
        """Refund an order (write)."""
        seen = {"order": order, "tenant": runtime.context.tenant, "user_id": runtime.context.user_id}
        with open(os.environ["TEAM_EFFECTS"], "a") as out:
            out.write(json.dumps(seen) + "\\n")
        return "refunded"


    def responder(messages):
        if messages[-1].type == "tool":
            return reply("done")
        return reply(calls=[call("refund", {"order": "o1"})])


    graph = build_graph(
        ScriptedChatModel(responder=responder),
        [refund],
        policies={"refund": ToolPolicy(effect="write", approval="always")},
        context_schema=TeamContext,
        name="team",
    )
    '''
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "team_agent.py").write_text(TEAM_AGENT)
    return tmp_path


def gatedloop(folder: Path, *args: str, code: int) -> Any:
    for name in [m for m in sys.modules if m == "team_agent" or m.startswith("gatedloop_user_graph_")]:
        del sys.modules[name]
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    env.update(GATEDLOOP_MODEL="demo", OPENAI_API_KEY="", TEAM_EFFECTS=str(folder / "effects.jsonl"))
    ran = run_cli(["--db", "runs.sqlite", "--graph", "team_agent:graph", *args], env, cwd=folder)
    assert ran.returncode == code, ran.stdout + ran.stderr
    return ran


def effects(folder: Path) -> list[dict[str, Any]]:
    path = folder / "effects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("given", ["inline", "file"])
def test_the_cli_sends_the_graphs_context_fields_and_an_answer_reuses_them(folder: Path, given: str) -> None:
    fields = json.dumps({"tenant": "acme"})
    if given == "file":
        (folder / "ctx.json").write_text(fields)
        fields = "@ctx.json"
    asked = gatedloop(
        folder, "--user", "ana", "--context", fields, "--json", "run", "refund o1", "--thread", "t1", code=3
    )
    request = next(
        json.loads(line)["request"]["request_id"] for line in asked.stdout.splitlines() if '"request"' in line
    )
    gatedloop(folder, "--user", "bo", "resume", "t1", "--request", request, "--approve", code=0)
    assert effects(folder) == [{"order": "o1", "tenant": "acme", "user_id": "bo"}]


@pytest.mark.parametrize(
    ("given", "complaint"),
    [("{not json", "--context is not JSON"), ("[1]", "must be a JSON object"), ("@missing.json", "cannot read")],
)
def test_a_bad_context_is_one_clear_line_and_runs_nothing(folder: Path, given: str, complaint: str) -> None:
    ran = gatedloop(folder, "--context", given, "run", "refund o1", "--thread", "t1", code=2)
    assert complaint in ran.stderr and "Traceback" not in ran.stderr
    assert not (folder / "runs.sqlite").exists() or effects(folder) == []


def test_an_answer_without_context_to_a_schema_with_required_fields_reuses_the_requests(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Agent Chat UI and the inboxes answer: no context at all. The thread does not end in `error`."""
    monkeypatch.setenv("TEAM_EFFECTS", str(folder / "effects.jsonl"))
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("team_agent", None)
    import team_agent  # type: ignore[import-not-found]

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph.build import with_saver

    cfg = {"configurable": {"thread_id": "t1"}}
    with open_sqlite(str(folder / "runs.sqlite")) as saver:
        graph = with_saver(team_agent.graph, saver)
        asked = graph.invoke({"messages": [("user", "refund o1")]}, cfg, context={"tenant": "acme", "user_id": "ana"})
        assert "__interrupt__" in asked
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert out["status"] == "completed"
    assert effects(folder) == [{"order": "o1", "tenant": "acme", "user_id": None}]
