"""Reviewers see everything; logs see no secrets (issue 10, finding 7).

The CLI's approval table and `gatedloop show` print every argument in full (wrapped, never cut: an amount past
character 80 was hidden from the reviewer), and mask a tool's `secret_args` there, in the log and in the custom
stream events. All on a real SQLite file through the real graph; the CLI as a real subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph, runs
from gatedloop.graph.display import Display
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy

WIDTH = 60
# 100 characters, the most `participant` takes; what matters to the reviewer is at the end.
PARTICIPANT = "Ana Lima; also charge the late fee of 9999 EUR to account 7731".ljust(97, ".") + "END"


def cli(*args: str, db: str, check_code: int) -> str:
    env = {
        **os.environ,
        "GATEDLOOP_MODEL": "demo",
        "OPENAI_API_KEY": "",
        "COLUMNS": str(WIDTH),
        "GATEDLOOP_GRAPH": "demo",
    }
    out = subprocess.run(
        [sys.executable, "-m", "gatedloop.cli.main", "--db", db, *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert out.returncode == check_code, out.stdout + out.stderr
    return out.stdout


def block_after(text: str, header_part: str, indent: str) -> str:
    """The wrapped lines under the first line containing `header_part`, joined back into one text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if header_part in line) + 1
    block = []
    for line in lines[start:]:
        if not line.startswith(indent):
            break
        assert len(line) <= WIDTH, f"not wrapped to the terminal: {line!r}"
        block.append(line[len(indent) :])
    return "".join(block)


def test_the_cli_shows_every_argument_in_full_wrapped_never_cut(tmp_path: Path):
    assert len(PARTICIPANT) == 100
    db = str(tmp_path / "runs.sqlite")
    printed = cli("run", f"Reserve a seat in workshop WS-101 for {PARTICIPANT}", "--thread", "w1", db=db, check_code=3)
    expected = "reserve_seat(" + json.dumps({"event_id": "WS-101", "participant": PARTICIPANT}, ensure_ascii=False)
    assert block_after(printed, "1. reserve_seat", "     ") == expected + ")"
    request_id = printed.split("--request ")[1].split()[0]
    cli("resume", "w1", "--request", request_id, "--approve", db=db, check_code=0)
    shown = cli("show", "w1", db=db, check_code=0)
    assert block_after(shown, "model: call ", "      ") == expected + ")"


# ------------------------------------------------------------------------------------------------ secrets

SECRET = "hunter2-sesame"


class Login:
    def __init__(self) -> None:
        self.logins: list[tuple[str, str]] = []

        @tool
        def login(user: str, password: str) -> str:
            """Log in to the bank."""
            self.logins.append((user, password))
            return f"logged in as {user}"

        self.tools = [login]
        self.policies = {"login": ToolPolicy(effect="write", approval="always", secret_args=frozenset({"password"}))}


def test_secret_arguments_are_masked_in_the_cli_the_log_and_the_stream_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = Login()
    model = ScriptedChatModel(
        script=[reply(calls=[call("login", {"user": "ana", "password": SECRET}, "l1")]), reply("done")]
    )
    events: list[Any] = []
    lines: list[str] = []
    json_lines: list[str] = []  # as `--json` prints each step

    def record(display: Display, mode: str, chunk: Any) -> None:
        if mode == "custom":
            events.append(chunk)
            return
        for node, update in chunk.items():
            lines.extend(display.step_lines(node, update))
            json_lines.append(display.json_line({"type": "step", "node": node, "update": display.shown_update(update)}))

    with caplog.at_level(logging.DEBUG, logger="gatedloop"), open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, app.tools, policies=app.policies, checkpointer=saver)
        display = Display.for_graph(graph)  # what the CLI and the inbox show this graph's threads with
        for mode, chunk in runs.stream_start(graph, "t", "log me in"):
            record(display, mode, chunk)
        request = runs.pending_request(graph, "t")
        assert request is not None
        table = display.approval_table(request)
        for mode, chunk in runs.stream_resume(graph, "t", {"decisions": [{"type": "approve"}]}):
            record(display, mode, chunk)
        out = runs.output(graph, "t")
        history = "\n".join(display.history_lines(out["messages"], saver.ledger.audit("t")))
        as_json = json.dumps([display.message_json(m) for m in out["messages"]])
    assert app.logins == [("ana", SECRET)], "the tool itself gets the real value"
    assert out["status"] == "completed"
    assert '"password": "***"' in table and '"user": "ana"' in table
    assert '"password": "***"' in history and '"password": "***"' in as_json
    assert sum('"password": "***"' in line for line in json_lines) >= 2, "the message and the call plan"
    assert any("proposes login(" in line and '"password": "***"' in line for line in lines)
    assert [e["event"] for e in events] == ["tool_started", "tool_finished"]
    shown = json.dumps(events) + table + history + as_json + "\n".join(lines + json_lines) + caplog.text
    assert SECRET not in shown
    assert any("tool call" in r.getMessage() and "login" in r.getMessage() for r in caplog.records), "it was logged"


def test_a_reviewers_edit_of_a_secret_argument_never_reaches_the_conversation(tmp_path: Path):
    """Issue 19, finding 3: the reviewer types a new password in an edit. The tool runs with it; the call's
    answer (which the model, the history and every stream carry) says `ran_with` with the value masked; the
    call plan in the state shows it masked (the ledger keeps it), and no stream mode, audit row or event holds it."""
    app = Login()
    model = ScriptedChatModel(
        script=[reply(calls=[call("login", {"user": "ana", "password": SECRET}, "l1")]), reply("done")]
    )
    edited = "edited-by-the-reviewer-77"
    modes: Any = ["updates", "values", "messages", "custom", "debug", "tasks", "checkpoints"]
    chunks: dict[str, list[Any]] = {mode: [] for mode in modes}
    cfg: Any = {"configurable": {"thread_id": "t"}}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, app.tools, policies=app.policies, checkpointer=saver)
        runs.start(graph, "t", "log me in")
        edit = {"type": "edit", "edited_action": {"name": "login", "args": {"user": "ana", "password": edited}}}
        for mode, chunk in graph.stream(Command(resume={"decisions": [edit]}), cfg, stream_mode=modes):
            chunks[mode].append(chunk)
        out = runs.output(graph, "t")
        audit = json.dumps(saver.ledger.audit("t"))
        saver_edits = saver.ledger.edited_args("t", ["l1"])
    [plan] = next(chunk["approve"]["calls"] for chunk in chunks["updates"] if "approve" in chunk)
    assert app.logins == [("ana", edited)], "the tool gets the edited value"
    [answer] = [m for m in out["messages"] if m.type == "tool"]
    body = json.loads(answer.content)
    assert body["ran_with"] == {"user": "ana", "password": "***"}
    assert body["note"].startswith("a reviewer edited")
    assert edited not in json.dumps([str(m.content) for m in out["messages"]])
    assert edited not in audit and '"password": "***"' in audit
    assert plan["args"] == {"user": "ana", "password": "***"} and plan["edited"]  # the state's call plan
    for mode in modes:  # every stream mode: node updates, state, messages, events, task inputs and results
        assert chunks[mode] and edited not in repr(chunks[mode]), mode
    assert saver_edits == {"l1": {"user": "ana", "password": edited}}  # the ledger keeps what runs


def test_an_edit_that_keeps_a_masked_secret_runs_with_it_after_a_second_approval(tmp_path: Path):
    """The reviewer sees "***" and sends it back while changing another field: the tool gets the original secret.
    With a quorum of two, the edit waits in the state masked and the second approval runs it from the ledger."""
    app = Login()
    policies = {"login": ToolPolicy(effect="write", secret_args=frozenset({"password"}), approvals_required=2)}
    model = ScriptedChatModel(
        script=[reply(calls=[call("login", {"user": "ana", "password": SECRET}, "l1")]), reply("done")]
    )
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, app.tools, policies=policies, checkpointer=saver)
        runs.start(graph, "t", "log me in")
        edit = {"type": "edit", "edited_action": {"name": "login", "args": {"user": "bo", "password": "***"}}}
        out = runs.resume(graph, "t", {"decisions": [edit]}, context=CallContext(user_id="cy"))
        [action] = out["__interrupt__"][0].value["action_requests"]
        assert action["args"] == {"user": "bo", "password": "***"} and action["approved_by"] == ["cy"]
        assert graph.get_state(runs.config_for("t")).values["calls"][0]["args"] == {"user": "bo", "password": "***"}
        assert app.logins == []
        out = runs.resume(graph, "t", {"decisions": [{"type": "approve"}]}, context=CallContext(user_id="dee"))
    assert out["status"] == "completed"
    assert app.logins == [("bo", SECRET)]


class ToolRuns(BaseCallbackHandler):
    """What a tracer records of each tool run: its inputs, and that it ended."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, Any]] = []
        self.ended = 0

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, inputs: Any = None, **kw: Any) -> None:
        self.started.append((serialized["name"], input_str, inputs))

    def on_tool_end(self, output: Any, **kw: Any) -> None:
        self.ended += 1


def test_callbacks_see_a_secret_tools_run_with_masked_inputs_and_other_tools_as_langchain_reports_them(
    tmp_path: Path,
):
    """Issue 19, finding 4: a callback handler (what LangSmith or any tracer records) gets the `login` run with
    its password masked, and an ordinary tool's run with its real inputs, as LangChain reports them."""
    app = Login()

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = ScriptedChatModel(
        script=[
            reply(
                calls=[
                    call("login", {"user": "ana", "password": SECRET}, "l1"),
                    call("weather", {"city": "Oslo"}, "w1"),
                ]
            ),
            reply("done"),
        ]
    )
    policies = {**app.policies, "weather": ToolPolicy(effect="read", approval="never")}
    runs_seen = ToolRuns()
    cfg: Any = {"configurable": {"thread_id": "t"}, "callbacks": [runs_seen]}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, [*app.tools, weather], policies=policies, checkpointer=saver)
        graph.invoke({"messages": [("user", "log me in")]}, cfg)
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve", "tool_call_id": "l1"}]}), cfg)
    assert out["status"] == "completed" and app.logins == [("ana", SECRET)]
    by_tool = {name: (text, inputs) for name, text, inputs in runs_seen.started}
    assert by_tool["login"][1] == {"user": "ana", "password": "***"}
    assert SECRET not in by_tool["login"][0] and "***" in by_tool["login"][0]
    assert by_tool["weather"][1] == {"city": "Oslo"}
    assert runs_seen.ended == 2
    assert SECRET not in repr(runs_seen.started)


def test_unparsed_arguments_of_a_tool_with_secrets_are_masked_whole():
    display = Display(Login().policies)
    lines = display.step_lines("model", {"messages": [reply(calls=[call("login", '{"password": "' + SECRET)])]})
    assert lines == ["[model] proposes login(***) [unparseable]"]


def test_the_card_names_the_thread_the_tools_note_and_what_approving_does(tmp_path: Path):
    """Issue 32's card: the thread's title (its first message, shortened), the policy's review note (an MCP
    server's hints), one line on what approving does (with the policy's preview, from the masked arguments), the
    same facts in `description` for clients that show only it, and a link from one request to the next."""
    from contextlib import contextmanager

    from starlette.testclient import TestClient

    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox.identity import Reviewer, Sessions

    @tool
    def pay(amount: float, to: str) -> str:
        """Pay an amount to an account."""
        return f"paid {amount}"

    def responder(messages: list[Any]) -> Any:
        if messages[-1].type == "tool":
            return reply("done")
        n = sum(m.type == "human" for m in messages)
        return reply(calls=[call("pay", {"amount": 900.0, "to": "DE-IBAN-1"}, f"c{n}-{len(messages)}")])

    policy = ToolPolicy(
        effect="write",
        secret_args=frozenset({"to"}),
        approvals_required=2,
        review_note="From MCP server bank: destructive, not idempotent.",
        preview=lambda args: f"moves {args['amount']:.0f} EUR to {args['to']}",
    )
    text = "Pay the March rent of 900 EUR to the landlord, please, and tell me when it is done"
    with open_sqlite(str(tmp_path / "runs.sqlite")) as saver:
        graph = build_graph(ScriptedChatModel(responder=responder), [pay], policies={"pay": policy}, checkpointer=saver)
        ana = CallContext(user_id="ana", roles={"staff"})
        first = runs.start(graph, "thread-0b4f7e2a-5c1d", text, context=ana)["__interrupt__"][0].value
        second = runs.start(graph, "thread-9a1c", "Pay the gym", context=ana)["__interrupt__"][0].value
        [action] = first["action_requests"]
        approving = "your approval makes 1 of the 2 needed; pay runs after the last"
        assert action["review_note"] == "From MCP server bank: destructive, not idempotent."
        assert action["preview"] == "moves 900 EUR to ***"
        assert f"If approved: {approving}; it moves 900 EUR to ***" in action["description"]

        @contextmanager
        def backend() -> Any:
            yield InboxBackend.over(graph, saver)

        bo = Reviewer("bo", frozenset({"finance"}), "fixed")
        with TestClient(create_app(backend, Sessions(None, bo))) as client:
            page = client.get("/inbox").text
            link = f"/inbox/requests/{first['request_id']}?thread=thread-0b4f7e2a-5c1d"
            card = client.get(link).text
    assert "“Pay the March rent of 900 EUR to the landlord, please, and…”" in page
    assert "From MCP server bank: destructive, not idempotent." in page
    assert f"<strong>If you approve:</strong> {approving}; it moves 900 EUR to ***" in page
    assert "DE-IBAN-1" not in page and "DE-IBAN-1" not in card
    nxt = f'href="/inbox/requests/{second["request_id"]}?thread=thread-9a1c">next waiting: pay (“Pay the gym”)'
    assert nxt in card
