"""The graph that wrote tests/data/threads_COMMIT.sqlite (with the code of each commit of COMMITS), and that resumes
their threads with today's code (tests/test_stored_formats.py).

It uses only the public API both commits have (`gatedloop.graph.build_graph`, `Limits`, `gatedloop.graph.scripted`,
`gatedloop.tools.ToolPolicy`, `CallContext`), and the scripted model's reply is a function of the conversation, so
a thread resumed today gets the replies it would have got then. Do not change the tools, their policies or the
replies: the stored threads were made by them (regenerate the files if you must, see make_threads.py).

Every real execution of a tool lands as a row in `app_effects`, a table in the same SQLite file as the threads
(the tools' "authoritative system"), so a test counts how often each call really ran.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolArg, tool

from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy

COMMITS = ("2077b07", "1ee2d3b")
"""The commits whose files tests/test_stored_formats.py resumes: 2077b07 (before graphs were recorded) and 1ee2d3b
(the last before the evidence chain)."""
EFFECTS_TABLE = "app_effects"
LIMITS = Limits(max_model_calls=3)
LOSSY = "lossy"
"""A payee whose bank takes the payment and then drops the connection, and cannot say afterwards whether it did."""

REQUESTER = CallContext(user_id="ann")
REVIEWER = CallContext(user_id="rev")
FINANCE_ALICE = CallContext(user_id="alice", roles=frozenset({"finance"}))
FINANCE_BOB = CallContext(user_id="bob", roles=frozenset({"finance"}))


class Effects:
    """The tools' side effects, one row per real execution, in `app_effects` of the threads' own file."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        with self._connect() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (seq INTEGER PRIMARY KEY, tool TEXT, args TEXT, key TEXT)"
            )

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction on a connection of its own, closed after it (tools run in worker threads)."""
        with closing(sqlite3.connect(self.path, timeout=30)) as conn, conn:
            yield conn

    def add(self, tool: str, args: dict[str, Any], key: str | None) -> int:
        with self._connect() as conn:
            cur = conn.execute(
                f"INSERT INTO {EFFECTS_TABLE} (tool, args, key) VALUES (?, ?, ?)",
                (tool, json.dumps(args, sort_keys=True), key),
            )
            return int(cur.lastrowid or 0)

    def rows(self) -> list[tuple[str, dict[str, Any], str | None]]:
        with self._connect() as conn:
            rows = conn.execute(f"SELECT tool, args, key FROM {EFFECTS_TABLE} ORDER BY seq").fetchall()
        return [(tool, json.loads(args), key) for tool, args, key in rows]

    def find(self, key: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(f"SELECT seq, args FROM {EFFECTS_TABLE} WHERE key=?", (key,)).fetchone()
        return {"payment": row[0], **json.loads(row[1])} if row else None


def make_tools(effects: Effects) -> list[BaseTool]:
    @tool
    def balance(account: str) -> dict[str, Any]:
        """Read an account's balance (read)."""
        effects.add("balance", {"account": account}, None)
        return {"account": account, "balance": 42}

    @tool
    def pay(amount: float, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Pay an amount to someone (write, one approval)."""
        row = effects.add("pay", {"amount": amount, "to": to}, idempotency_key)
        if to == LOSSY:
            raise ConnectionError("the bank closed the connection after taking the payment")
        return {"payment": row, "amount": amount, "to": to}

    @tool
    def wire(amount: float, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Wire an amount abroad (write, two approvals from finance)."""
        row = effects.add("wire", {"amount": amount, "to": to}, idempotency_key)
        return {"wire": row, "amount": amount, "to": to}

    return [balance, pay, wire]


def policies(effects: Effects) -> dict[str, ToolPolicy]:
    def reconcile_payment(args: dict[str, Any], key: str) -> dict[str, Any] | None:
        if args["to"] == LOSSY:
            raise ConnectionError("the bank's status service is down too")
        return effects.find(key)

    return {
        "balance": ToolPolicy(effect="read", approval="never"),
        "pay": ToolPolicy(effect="write", approval="always", self_approval=False, reconcile=reconcile_payment),
        "wire": ToolPolicy(
            effect="write",
            approval="always",
            approvers=frozenset({"finance"}),
            approvals_required=2,
            reconcile=lambda args, key: effects.find(key),
        ),
    }


def responder(messages: list[BaseMessage]) -> AIMessage:
    """'balance X' | 'pay N to X' | 'wire N to X' -> one call (id: its kind and the turn's number), then a summary
    of the answers' statuses; 'loop' -> reads of acct0, acct1, ... until a limit stops it."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    turn = len(humans)
    words = str(messages[humans[-1]].content).split()
    answers = [m for m in messages[humans[-1] + 1 :] if isinstance(m, ToolMessage)]
    if words == ["loop"]:
        return reply(calls=[call("balance", {"account": f"acct{len(answers)}"}, f"loop{turn}_{len(answers)}")])
    if answers:
        return reply("done: " + "; ".join(f"{m.tool_call_id}={m.status}" for m in answers))
    if words[0] == "balance":
        return reply(calls=[call("balance", {"account": words[1]}, f"b{turn}")])
    kind, amount, _, to = words
    return reply(calls=[call(kind, {"amount": float(amount), "to": to}, f"{kind[0]}{turn}")])


def build(saver: Any, effects_db: str | Path) -> Any:
    """The graph over `saver` (from `open_sqlite`), its tools' effects in `effects_db`."""
    effects = Effects(effects_db)
    return build_graph(
        ScriptedChatModel(responder=responder),
        make_tools(effects),
        policies=policies(effects),
        limits=LIMITS,
        checkpointer=saver,
    )


def cli_graph() -> Any:
    """The same graph without a checkpointer, for `gatedloop --graph tests/data/stored_threads_app.py:cli_graph`;
    its tools write to the file named by STORED_THREADS_DB."""
    return build(None, os.environ["STORED_THREADS_DB"])
