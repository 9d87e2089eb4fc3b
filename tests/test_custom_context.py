"""A graph's own `context_schema` travels (issue 29, finding 7): through the CLI (`--context JSON` or @FILE) and
to answers that carry no context (the CLI's `resume`, the inboxes, Agent Chat UI), which reuse the fields the
request was made under; identity fields are never reused."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run_cli
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import ToolPolicy, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

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

    from gatedloop.graph.build import with_saver

    cfg = {"configurable": {"thread_id": "t1"}}
    with open_sqlite(str(folder / "runs.sqlite")) as saver:
        graph = with_saver(team_agent.graph, saver)
        asked = graph.invoke({"messages": [("user", "refund o1")]}, cfg, context={"tenant": "acme", "user_id": "ana"})
        assert "__interrupt__" in asked
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert out["status"] == "completed"
    assert effects(folder) == [{"order": "o1", "tenant": "acme", "user_id": None}]


def request_id(stdout: str) -> str:
    return next(json.loads(line)["request"]["request_id"] for line in stdout.splitlines() if '"request"' in line)


def with_approvers(roles: str) -> str:
    """TEAM_AGENT whose refund is decided by `roles` only."""
    return TEAM_AGENT.replace('approval="always")', f'approval="always", approvers={{{roles!r}}})')


def rows_written(folder: Path) -> int:
    """Rows in every table of runs.sqlite, ledger and checkpoints alike (0 when the file was never made)."""
    path = folder / "runs.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as conn:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return sum(conn.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0] for name in tables)


def test_an_upgrade_fixes_a_policy_typo_for_a_graph_with_its_own_context_and_audits_the_operator(folder: Path):
    """Issue 51: a typo in `approvers` leaves a request nobody can approve; the remedy, `--upgrade-graph` with the
    fixed graph, crashed for any `context_schema` ('dict' object has no attribute 'user_id': the CLI sends a dict).
    The operator is read as every caller is, and is the upgrade's actor."""
    (folder / "team_agent.py").write_text(with_approvers("finanse"))
    asked = gatedloop(
        folder,
        "--user",
        "ana",
        "--context",
        '{"tenant": "acme"}',
        "--json",
        "run",
        "refund o1",
        "--thread",
        "t1",
        code=3,
    )
    answer = ("resume", "t1", "--request", request_id(asked.stdout), "--approve")
    (folder / "team_agent.py").write_text(with_approvers("finance"))
    gatedloop(folder, "--upgrade-graph", "--user", "ops", "--roles", "finance", *answer, code=0)
    assert effects(folder) == [{"order": "o1", "tenant": "acme", "user_id": "ops"}]
    with sqlite3.connect(folder / "runs.sqlite") as conn:
        [(actor,)] = conn.execute("SELECT actor FROM gatedloop_audit WHERE event LIKE 'graph_upgraded:%'").fetchall()
    assert actor == "ops"


NO_ROLES = with_approvers("finance").replace("    roles: list[str] = field(default_factory=list)\n", "")
REFUSAL = "context_schema TeamContext has no 'roles' field, so no caller can hold the roles its policies name"


def test_a_graph_whose_context_cannot_carry_the_roles_its_policies_name_is_refused_before_anything_runs(folder: Path):
    """Issue 51: with no `roles` field, `--roles` never reaches the gate and every approval was refused ("needs
    one of the roles ['finance']") after the request was made; now the run is refused in one line, exit 2."""
    (folder / "team_agent.py").write_text(NO_ROLES)
    refused = gatedloop(folder, "--context", '{"tenant": "acme"}', "run", "refund o1", "--thread", "t1", code=2)
    [line] = refused.stderr.strip().splitlines()
    assert REFUSAL in line and "refund approvers ['finance']" in line and "add roles: list[str]" in line
    assert rows_written(folder) == 0 and effects(folder) == []


@dataclass
class NoRolesContext:
    user_id: str | None = None
    tenant: str = "acme"


def test_build_graph_refuses_such_a_context_with_a_checkpointer_and_a_served_graph_takes_the_servers_roles(
    tmp_path: Path,
) -> None:
    """In Python the roles can only come from the context, so `build_graph` with a checkpointer refuses. A graph
    built without one is what a server runs, and there the authenticated user's roles count whatever the schema:
    it builds, and a finance reviewer's approval runs the refund."""
    done: list[str] = []

    @tool
    def refund(order: str) -> str:
        """Refund an order (write)."""
        done.append(order)
        return "refunded"

    script = ScriptedChatModel(script=[reply(calls=[call("refund", {"order": "o1"}, "c1")]), reply("done")])
    options: dict[str, Any] = {
        "policies": {"refund": ToolPolicy(effect="write", approval="always", approvers={"finance"})},
        "context_schema": NoRolesContext,
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        with pytest.raises(ValueError, match="refund approvers \\['finance'\\]"):
            build_graph(script, [refund], checkpointer=saver, **options)
        served = build_graph(script, [refund], **options)
        served.checkpointer = saver  # as the server attaches its own
        as_user = {"identity": "bo", "roles": ["finance"], "gatedloop_auth": "token"}
        config = {"configurable": {"thread_id": "t1", "langgraph_auth_user": {**as_user, "identity": "ana"}}}
        assert "__interrupt__" in served.invoke({"messages": [("user", "refund o1")]}, config)
        config["configurable"]["langgraph_auth_user"] = as_user
        out = served.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert out["status"] == "completed" and done == ["o1"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [("{}", "TeamContext needs the field 'tenant'"), ('{"tenant": "acme", "tenat": "acme"}', "no field 'tenat'")],
    ids=["missing", "unknown"],
)
def test_a_missing_or_unknown_context_field_is_a_usage_error_naming_it_and_writes_nothing(
    folder: Path, fields: str, named: str
) -> None:
    """Issue 51: was "unexpected TypeError" (exit 1) from deep in LangGraph, after the thread's graph was recorded."""
    refused = gatedloop(folder, "--context", fields, "run", "refund o1", "--thread", "t1", code=2)
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("gatedloop: --context: ") and named in line
    assert rows_written(folder) == 0 and effects(folder) == []
