"""A payments agent for the standing-grant and limit tests, its graph for the CLI, and a racing child.

Tools (every write's effect is a row in `effects.sqlite`, as in sample_app): `pay(to, amount)` (approvers finance,
grantable, at most 500 paid per tenant per day, refused past it), `wire(to, amount)` (finance, two approvers,
grantable), `mail(to, body)` (gated, not grantable), `email(to)` (no approval; at most 3 per requester per hour,
asked past it) and `hook()` (an ungated write that runs `HOOKS["hook"]`: something happening between two writes
of a turn; `HOOKS["pay"]` runs as a payment starts). The scripted model turns each user message "pay bo 50; mail
cy hi" into one turn of those calls.

`graph` (no checkpointer; effects to `$GRANTS_EFFECTS`, or a throwaway file) is what `--graph grants_app:graph`
loads. Run as a script (`python grants_app.py race --db DB --thread T --barrier DIR [--say TEXT]`, tests/ on
PYTHONPATH), it starts one thread (default "pay bo 10") as ana once the barrier's `go` file exists, and prints `ran`
or `asked <reason>`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from sample_app import Effects

from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy
from gatedloop.tools.usage import HOUR, UsageLimit

ANA = CallContext(user_id="ana", roles=frozenset({"staff"}), extra={"tenant": "acme"})
DEE = CallContext(user_id="dee", roles=frozenset({"staff"}), extra={"tenant": "acme"})
BO = CallContext(user_id="bo", roles=frozenset({"finance"}))
CY = CallContext(user_id="cy", roles=frozenset({"finance"}))
HOOKS: dict[str, Callable[[], None]] = {}
SCRIPT = [sys.executable, str(Path(__file__).resolve())]

FINANCE = frozenset({"finance"})
POLICIES = {
    "pay": ToolPolicy(
        effect="write",
        approvers=FINANCE,
        grantable=True,
        limits=[UsageLimit(at_most=500, sums="amount", per="context:tenant", over="refuse")],
    ),
    "wire": ToolPolicy(effect="write", approvers=FINANCE, approvals_required=2, grantable=True),
    "mail": ToolPolicy(effect="write", approvers=FINANCE),
    "email": ToolPolicy(
        effect="write", approval="never", limits=[UsageLimit(at_most=3, window_s=HOUR, per="requester")]
    ),
    "hook": ToolPolicy(effect="write", approval="never"),
}


def make_tools(effects: Effects) -> list[BaseTool]:
    @tool
    def pay(to: str, amount: float) -> str:
        """Pay someone (write)."""
        HOOKS.get("pay", lambda: None)()
        effects.add("pay", {"to": to, "amount": amount}, None)
        return "paid"

    @tool
    def wire(to: str, amount: float) -> str:
        """Wire money abroad (write)."""
        effects.add("wire", {"to": to, "amount": amount}, None)
        return "wired"

    @tool
    def mail(to: str, body: str) -> str:
        """Mail a letter (write)."""
        effects.add("mail", {"to": to, "body": body}, None)
        return "mailed"

    @tool
    def email(to: str) -> str:
        """Send an email (write)."""
        effects.add("email", {"to": to}, None)
        return "sent"

    @tool
    def hook() -> str:
        """Something else happens (write)."""
        HOOKS.get("hook", lambda: None)()
        return "hooked"

    return [pay, wire, mail, email, hook]


def _args(name: str, words: list[str]) -> dict[str, Any]:
    if name in ("pay", "wire"):
        return {"to": words[0], "amount": float(words[1])}
    if name == "mail":
        return {"to": words[0], "body": " ".join(words[1:])}
    if name == "announce":
        return {"to": words}
    if name == "order":  # order A:2 B:5 EUR 40
        lines = [{"sku": w.split(":")[0], "qty": int(w.split(":")[1])} for w in words[:-2]]
        return {"items": lines, "payment": {"currency": words[-2], "amount": float(words[-1])}}
    return {"to": words[0]} if name == "email" else {}


def responder(messages: list[BaseMessage]) -> AIMessage:
    """'pay bo 50; hook; mail cy hi' -> one turn with those calls; once answered, a summary."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    results = [m for m in messages[humans[-1] + 1 :] if isinstance(m, ToolMessage)]
    if results:
        return reply("; ".join(f"{m.name} {m.status}" for m in results))
    parts = [p.split() for p in str(messages[humans[-1]].content).split(";")]
    return reply(calls=[call(p[0], _args(p[0], p[1:]), f"c{len(humans)}_{i}") for i, p in enumerate(parts)])


def build(saver: Any, effects: Effects) -> Any:
    return build_graph(
        ScriptedChatModel(responder=responder), make_tools(effects), policies=POLICIES, checkpointer=saver, name="pay"
    )


def __getattr__(name: str) -> Any:
    """`graph`, built when the CLI asks for it (a racing child never does)."""
    if name != "graph":
        raise AttributeError(name)
    effects = Effects(os.environ.get("GRANTS_EFFECTS") or Path(tempfile.mkdtemp()) / "effects.sqlite")
    return build_graph(ScriptedChatModel(responder=responder), make_tools(effects), policies=POLICIES, name="pay")


def run_race(child_db: str, folder: Path, racers: int, say: str = "pay bo 10") -> list[str]:
    """The parent's side: `racers` children, each with a thread of its own, say `say` at the same moment; what each
    printed last (`ran completed`, `asked <why>`). Their writes' effects are in `folder / "effects.sqlite"`."""
    from crash_child import Child

    barrier = folder / "barrier"
    barrier.mkdir()
    command = [*SCRIPT, "race", "--db", child_db, "--barrier", str(barrier), "--say", say]
    children = [Child([*command, "--thread", f"race-{i}"], folder / f"race{i}.err") for i in range(racers)]
    for child in children:
        assert child.wait_for("ready") is not None, child.wait().stderr[-2000:]
    (barrier / "go").touch()
    results = [child.wait() for child in children]
    assert all(r.returncode == 0 and r.lines for r in results), [r.stderr[-800:] for r in results]
    return [r.lines[-1] for r in results]


def race(argv: list[str]) -> int:
    """One racer: build the graph on the database, wait for the barrier, start its thread, say what became of it."""
    import crash_child
    from backends import open_checkpointer

    from gatedloop.graph import runs

    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--say", default="pay bo 10")
    args = parser.parse_args(argv)
    with open_checkpointer(args.db) as saver:
        graph = build(saver, Effects(Path(args.barrier).parent / "effects.sqlite"))
        crash_child.mark("ready", os.getpid())
        while not os.path.exists(os.path.join(args.barrier, "go")):
            time.sleep(0.002)
        out = runs.start(graph, args.thread, args.say, context=ANA)
        pending = out.get("__interrupt__")
        if pending:
            crash_child.mark("asked", pending[0].value["action_requests"][0].get("sent_back", "at validation"))
        else:
            crash_child.mark("ran", out["status"])
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["race"]:
        sys.exit("usage: grants_app.py race --db DB --thread T --barrier DIR")
    sys.exit(race(sys.argv[2:]))
