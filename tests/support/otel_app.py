"""A payment graph for the telemetry tests (tests/test_telemetry.py), on the real ChatOpenAI client and a scripted
OpenAI-compatible server: `transfer` is a write that needs a `finance` approver and takes a secret `pin`; `balance`
is a read that fails with a token in its exception's text. Neither secret may reach a span or a metric.

Run as a script it is the process that answers: `python otel_app.py DB MODEL_URL THREAD` approves the pending
transfer as bob (finance), with telemetry from the `OTEL_*` variables alone, and prints the thread's status.
"""

from __future__ import annotations

import sys
from typing import Any

from langchain_core.tools import BaseTool, tool
from langgraph.types import Command
from openai_stub import Reply, chat_openai, tool_call

from gatedloop.graph import CallContext, ToolPolicy, build_graph, open_sqlite

PIN = "pin-7731-never-shown"
TOKEN = "tok-4242-never-shown"
ASKER = CallContext(user_id="alice", roles=frozenset({"staff"}))
APPROVER = CallContext(user_id="bob", roles=frozenset({"finance"}))
POLICIES = {
    "transfer": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}), secret_args={"pin"}),
    "balance": ToolPolicy(effect="read", approval="never"),
}


def make_tools() -> list[BaseTool]:
    @tool
    def transfer(to: str, amount: int, pin: str) -> dict[str, Any]:
        """Send money (write)."""
        return {"sent": amount, "to": to}

    @tool
    def balance(account: str) -> dict[str, Any]:
        """An account's balance (read)."""
        raise RuntimeError(f"the bank answered 401 for token={TOKEN}")

    return [transfer, balance]


def replies() -> list[Reply]:
    """The model asks for both calls in one turn, then answers once their results are in."""
    calls = [
        tool_call("transfer", {"to": "acct-9", "amount": 5, "pin": PIN}, "call_pay"),
        tool_call("balance", {"account": "acct-9"}, "call_balance"),
    ]
    return [Reply(tool_calls=calls), Reply(content="Sent 5 to acct-9.")]


def build(saver: Any, model_url: str, **telemetry: Any) -> Any:
    return build_graph(chat_openai(model_url), make_tools(), policies=POLICIES, checkpointer=saver, **telemetry)


def main(argv: list[str]) -> int:
    db, model_url, thread_id = argv
    with open_sqlite(db) as saver:
        graph = build(saver, model_url)
        config = {"configurable": {"thread_id": thread_id}}
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config, context=APPROVER)
    print(out["status"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
