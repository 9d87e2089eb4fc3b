"""Your agent, through the CLI (issue 22, items 1 and 2): a user's own module in a fresh folder, outside this repo,
named as langgraph.json names graphs. `run`, `show`, `resume` use its tools, policies and model; a thread
remembers the graph that made it and refuses another one (the demo included) without changing anything."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_in_process import run_cli

MY_AGENT = textwrap.dedent(
    '''
    """Someone's own agent: a seat booking that needs an `events` approver and keeps a card number secret."""
    import json
    import os

    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply
    from gatedloop.tools import ToolPolicy


    @tool
    def reserve_seat(seats: int, card: str) -> str:
        """Reserve seats at the conference, paid with a card."""
        with open(os.environ["MY_AGENT_EFFECTS"], "a") as effects:
            effects.write(json.dumps({"seats": seats, "card": card}) + "\\n")
        return f"RSV-{seats:04d}"


    def responder(messages):
        if isinstance(messages[-1], ToolMessage):
            return reply(f"Booked: {messages[-1].content}")
        return reply(calls=[call("reserve_seat", {"seats": 2, "card": "4111-1111-1111-1111"})])


    POLICIES = {
        "reserve_seat": ToolPolicy(
            effect="write", approval="always", approvers=frozenset({"events"}), secret_args=frozenset({"card"})
        )
    }


    def make_graph():
        return build_graph(ScriptedChatModel(responder=responder), [reserve_seat], policies=POLICIES, name="seats")


    graph = make_graph()
    '''
)
CARD = "4111-1111-1111-1111"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A fresh folder with the user's module, far from this repo (no langgraph.json yet)."""
    (tmp_path / "my_agent.py").write_text(MY_AGENT)
    return tmp_path


def cli_env(folder: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    env.update(GATEDLOOP_MODEL="demo", OPENAI_API_KEY="", MY_AGENT_EFFECTS=str(folder / "effects.jsonl"))
    return env


def gatedloop(folder: Path, *args: str, code: int) -> subprocess.CompletedProcess[str]:
    """`gatedloop --db runs.sqlite ARGS` in `folder`, in this process as a fresh one runs it, the user's module
    imported anew (a real process: `test_the_cli_as_a_real_process_runs_your_graph_from_a_fresh_folder`)."""
    for name in [m for m in sys.modules if m == "my_agent" or m.startswith("gatedloop_user_graph_")]:
        del sys.modules[name]
    ran = run_cli(["--db", "runs.sqlite", *args], cli_env(folder), cwd=folder)
    assert ran.returncode == code, ran.stdout + ran.stderr
    return ran


def test_the_cli_as_a_real_process_runs_your_graph_from_a_fresh_folder(folder: Path):
    """The smoke test the in-process ones stand for: two real processes, paused then approved."""

    def real(*args: str, code: int) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gatedloop.cli.main",
                "--db",
                "runs.sqlite",
                "--graph",
                "./my_agent.py:graph",
                *args,
            ],
            cwd=folder,
            env=cli_env(folder),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        assert done.returncode == code, done.stdout + done.stderr
        return done

    asked = real("--json", "run", "two seats", "--thread", "t1", code=3)
    real(
        "--user", "bo", "--roles", "events", "resume", "t1", "--request", request_id(asked.stdout), "--approve", code=0
    )
    assert effects(folder) == [{"seats": 2, "card": CARD}]


def effects(folder: Path) -> list[dict]:
    path = folder / "effects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def checkpoints(folder: Path) -> int:
    with sqlite3.connect(folder / "runs.sqlite") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0])


def request_id(output: str) -> str:
    return next(json.loads(line)["request"]["request_id"] for line in output.splitlines() if '"request"' in line)


@pytest.mark.parametrize("reference", ["my_agent:graph", "my_agent:make_graph", "./my_agent.py:graph"])
def test_your_graph_pauses_with_its_tool_masks_its_secret_and_runs_once_when_an_approver_approves(
    folder: Path, reference: str
):
    asked = gatedloop(
        folder, "--graph", reference, "--json", "--user", "ana", "run", "two seats", "--thread", "t1", code=3
    )
    request = next(json.loads(line)["request"] for line in asked.stdout.splitlines() if '"request"' in line)
    [action] = request["action_requests"]
    assert (action["name"], action["args"]) == ("reserve_seat", {"seats": 2, "card": "***"})
    assert "Reserve seats at the conference" in action["description"] and action["approvers"] == ["events"]
    assert CARD not in asked.stdout + asked.stderr

    shown = gatedloop(folder, "--graph", reference, "show", "t1", code=0)
    assert "reserve_seat" in shown.stdout and '"card": "***"' in shown.stdout and CARD not in shown.stdout

    answer = ("resume", "t1", "--request", request["request_id"], "--approve")
    refused = gatedloop(folder, "--graph", reference, "--user", "ana", "--roles", "staff", *answer, code=6)
    assert "events" in refused.stderr and effects(folder) == []
    done = gatedloop(folder, "--graph", reference, "--user", "bo", "--roles", "events", *answer, code=0)
    assert effects(folder) == [{"seats": 2, "card": CARD}]  # the tool ran once, with the real card
    assert "Booked: RSV-0002" in done.stdout and CARD not in done.stdout


def test_another_graph_never_resumes_your_thread_and_nothing_is_written(folder: Path):
    asked = gatedloop(folder, "--graph", "my_agent:graph", "--json", "run", "two seats", "--thread", "t1", code=3)
    before = checkpoints(folder)
    answer = ("resume", "t1", "--request", request_id(asked.stdout), "--approve", "--roles", "events")
    for refused in (gatedloop(folder, *answer, code=6), gatedloop(folder, "--graph", "demo", *answer, code=6)):
        [line] = refused.stderr.strip().splitlines()
        assert "was made by graph 'seats'" in line and "not by graph 'gatedloop'" in line and "--graph" in line
    assert "was made by graph 'seats'" in gatedloop(folder, "show", "t1", code=6).stderr  # demo's policies: no mask
    assert checkpoints(folder) == before and effects(folder) == []
    gatedloop(folder, "--graph", "my_agent:graph", "--user", "bo", *answer, code=0)
    assert len(effects(folder)) == 1


def inbox_recent(folder: Path, thread_id: str) -> list[tuple[str, str]]:
    """The recent conversation the standalone inbox shows beside the thread's pending request, over your graph."""
    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph.build import with_saver
    from gatedloop.graph.load import load_graph
    from gatedloop.inbox import InboxBackend

    with open_sqlite(folder / "runs.sqlite") as saver:
        backend = InboxBackend.over(with_saver(load_graph("./my_agent.py:graph", folder), saver), saver)
        view = backend.pending.get(thread_id)
    assert view is not None
    return view.recent


def test_show_redacts_the_secret_as_the_inbox_does_and_masks_every_argument_when_it_cannot_know(folder: Path):
    """Issue 32, item 4. The user typed the card into the message: `show` redacts it from that text as the inbox
    does (the same function). A thread no graph is recorded for (as threads written before gatedloop recorded
    them, whose rows it lacks) is shown by whatever graph is at hand, here the demo, whose policies cannot say what
    is secret in it: every argument is masked, and the card is in no text, plain or --json."""
    asked = f"two seats, card {CARD}"
    gatedloop(folder, "--graph", "my_agent:graph", "run", asked, "--thread", "t1", code=3)
    shown = gatedloop(folder, "--graph", "my_agent:graph", "show", "t1", code=0).stdout
    assert ("user", "two seats, card ***") in inbox_recent(folder, "t1")
    assert "user: two seats, card ***" in shown and '"seats": 2, "card": "***"' in shown and CARD not in shown

    with sqlite3.connect(folder / "runs.sqlite") as conn:
        conn.execute("DELETE FROM gatedloop_thread_graphs")
        conn.execute("DELETE FROM gatedloop_thread_policies")
    shown = gatedloop(folder, "show", "t1", code=0).stdout
    assert "user: two seats, card ***" in shown and 'reserve_seat({"seats": "***", "card": "***"})' in shown
    records = gatedloop(folder, "--json", "show", "t1", code=0).stdout
    assert CARD not in shown + records and '"card": "***"' in records


def test_an_explicit_upgrade_lets_the_new_graph_run_the_thread_and_is_audited(folder: Path):
    asked = gatedloop(folder, "--graph", "my_agent:graph", "--json", "run", "two seats", "--thread", "t1", code=3)
    (folder / "my_agent.py").write_text(MY_AGENT.replace("paid with a card", "paid with a card (v2)"))
    answer = ("resume", "t1", "--request", request_id(asked.stdout), "--approve")
    refused = gatedloop(folder, "--graph", "my_agent:graph", "--roles", "events", *answer, code=6)
    assert "was made by graph 'seats'" in refused.stderr  # a changed tool description is another graph
    gatedloop(
        folder,
        "--graph",
        "my_agent:graph",
        "--upgrade-graph",
        "--user",
        "ops",
        "--roles",
        "events",
        *answer,
        code=0,
    )
    # The thread is upgraded, but the call was validated against the old tool: it is answered tool_changed (issue
    # 20's pin), not run; proposed again, it runs with the new tool once approved.
    assert effects(folder) == []
    with sqlite3.connect(folder / "runs.sqlite") as conn:
        [(_event, actor)] = conn.execute(
            "SELECT event, actor FROM gatedloop_audit WHERE event LIKE 'graph_upgraded:%'"
        ).fetchall()
        assert conn.execute("SELECT COUNT(*) FROM gatedloop_audit WHERE event='tool_definition_changed'").fetchone()[0]
    assert actor == "ops"
    again = gatedloop(folder, "--graph", "my_agent:graph", "--json", "run", "two seats", "--thread", "t1", code=3)
    answer = ("resume", "t1", "--request", request_id(again.stdout), "--approve")
    gatedloop(folder, "--graph", "my_agent:graph", "--user", "bo", "--roles", "events", *answer, code=0)
    assert len(effects(folder)) == 1


def test_the_graph_of_the_folders_langgraph_json_is_the_default_and_a_name_picks_one(folder: Path):
    manifest = {"graphs": {"seats": "./my_agent.py:graph", "other": "my_agent:make_graph"}}
    (folder / "langgraph.json").write_text(json.dumps(manifest))
    several = gatedloop(folder, "run", "two seats", code=2)
    assert "names several graphs (other, seats); pick one with --graph NAME" in several.stderr
    asked = gatedloop(folder, "--graph", "seats", "--json", "run", "two seats", "--thread", "t1", code=3)
    assert '"reserve_seat"' in asked.stdout
    (folder / "langgraph.json").write_text(json.dumps({"graphs": {"seats": "./my_agent.py:graph"}}))
    answer = ("resume", "t1", "--request", request_id(asked.stdout), "--approve")
    gatedloop(folder, "--user", "bo", "--roles", "events", *answer, code=0)
    assert len(effects(folder)) == 1


@pytest.mark.parametrize(
    ("reference", "complaint"),
    [
        ("nowhere:graph", "cannot import nowhere: ModuleNotFoundError"),
        ("my_agent:missing", "my_agent has no attribute 'missing'"),
        ("my_agent:POLICIES", "is a dict, not a graph from gatedloop.graph.build_graph"),
        ("unnamed", "neither MODULE:ATTR nor one of no langgraph.json"),
    ],
)
def test_a_graph_that_cannot_be_loaded_is_one_line_saying_why(folder: Path, reference: str, complaint: str):
    failed = gatedloop(folder, "--graph", reference, "run", "hi", code=2)
    [line] = failed.stderr.strip().splitlines()
    assert complaint in line, line


def test_langgraph_dev_serves_your_graph_from_a_langgraph_json_without_gatedloops_checkpointer(folder: Path):
    """The shortest langgraph.json a newcomer writes (their graph, nothing of gatedloop's): `langgraph dev` serves
    it on its own saver, so the run makes its ledger on first use, which must not block the server's event loop
    (`langgraph dev` refuses that: the run failed with an internal BlockingError). That saver keeps its checkpoints
    in `.langgraph_api/` across restarts, and the ledger beside them: the request pauses, the server restarts, the
    events approver's answer pays once (an in-memory ledger answered it "never validated"); a replay pays nothing."""
    from devserver import run_dev_server
    from langgraph_sdk import get_sync_client

    (folder / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {"seats": "./my_agent.py:graph"}})
    )
    env = {
        "MY_AGENT_EFFECTS": str(folder / "effects.jsonl"),
        "GATEDLOOP_AUTH_TOKENS": None,
        "GATEDLOOP_AUTH_FILE": None,
    }
    with run_dev_server(folder, env=env, workdir=folder / "server") as url:
        client = get_sync_client(url=url)
        thread_id = client.threads.create()["thread_id"]
        ask = {"messages": [{"role": "user", "content": "two seats please"}]}
        client.runs.wait(thread_id, "seats", input=ask, context={"user_id": "ana", "roles": ["staff"]})
        [interrupt] = client.threads.get_state(thread_id)["interrupts"]
        assert [r["name"] for r in interrupt["value"]["action_requests"]] == ["reserve_seat"]
    with run_dev_server(folder, env=env, workdir=folder / "server") as url:  # the same folder: a restart
        client = get_sync_client(url=url)
        approve = {"resume": {"decisions": [{"type": "approve"}]}}
        out = client.runs.wait(thread_id, "seats", command=approve, context={"user_id": "eve", "roles": ["events"]})
        assert isinstance(out, dict) and out["status"] == "completed", out
        client.runs.wait(thread_id, "seats", command=approve, context={"user_id": "eve", "roles": ["events"]})
    assert len((folder / "effects.jsonl").read_text().splitlines()) == 1
