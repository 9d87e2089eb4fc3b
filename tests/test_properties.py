"""Property-based: whatever the model proposes and the reviewer answers, the loop holds its invariants.

Fixed seed (derandomize) and a small budget here; `bench/fuzz.py` runs the same properties longer.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from invariants import assert_each_call_answered_once
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import STATUSES, Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, reply
from gatedloop.tools import ToolPolicy

NAMES = st.sampled_from(
    ["lookup", "book", "Lookup", "BOOK", " lookup", "lookup\n", "lооkup", "bооk", "look_up", "", "eval", "__import__"]
) | st.text(max_size=12)
JUNK = st.one_of(
    st.text(max_size=40),
    st.sampled_from(['{"query": "x"', "[1, 2]", "null", '"str"', "{}", '{"query": 1}', '```json\n{"query": "f"}\n```']),
    st.builds(lambda n: json.dumps({"query": "q" * n}), st.integers(0, 20_000)),
)
ARGS = st.one_of(
    st.fixed_dictionaries({"query": st.text(max_size=20)}),
    st.fixed_dictionaries({"item": st.text(max_size=10), "quantity": st.integers(-5, 10**12)}),
    st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.text(max_size=8)), max_size=3),
    JUNK,
)
IDS = st.one_of(st.none(), st.sampled_from(["", "dup", "dup", "x"]), st.text(min_size=1, max_size=6))
CALL = st.fixed_dictionaries({"name": NAMES, "args": ARGS, "id": IDS})
TURN = st.builds(
    lambda calls, text, finish: reply(text, calls, finish_reason=finish),
    st.lists(CALL, max_size=4),
    st.text(max_size=20),
    st.sampled_from(["auto", "auto", "auto", "length", None, "content_filter"]),
)
DECISION = st.one_of(
    st.just({"type": "approve"}),
    st.just({"type": "reject", "message": "no"}),
    st.builds(lambda a: {"type": "edit", "edited_action": {"name": "book", "args": a}}, ARGS),
    st.just({"type": "respond", "message": "handled"}),
    st.sampled_from([{"type": "nope"}, "approve", None, {"type": "edit"}, {"type": "edit", "edited_action": 5}]),
)
# `Command(resume=None)` is refused inside LangGraph itself (before any node runs); `runs.resume` turns it into
# InvalidDecision (tested in test_approvals), so it is left out here.
ANSWER = st.one_of(
    st.builds(lambda d: {"decisions": d}, st.lists(DECISION, max_size=5)),
    st.text(max_size=5),
    st.integers(),
    st.lists(st.integers(), max_size=2),
)


def make_tools(ran: list[tuple[str, dict[str, Any]]]):
    @tool
    def lookup(query: str) -> dict[str, Any]:
        """Look up (read)."""
        ran.append(("lookup", {"query": query}))
        return {"found": query[:10]}

    @tool
    def book(item: str, quantity: int) -> dict[str, Any]:
        """Book (write)."""
        ran.append(("book", {"item": item, "quantity": quantity}))
        return {"booked": item}

    return [lookup, book]


EXAMPLES = int(os.environ.get("GATEDLOOP_PROPERTY_EXAMPLES", "50"))
"""Sized for the README's test command; CI runs 150 (.ci/run)."""


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(turns=st.lists(TURN, min_size=1, max_size=4), answers=st.lists(ANSWER, max_size=6))
def test_the_loop_never_raises_never_runs_what_it_should_not_and_answers_every_call(turns, answers):
    ran: list[tuple[str, dict[str, Any]]] = []
    approved: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp, open_sqlite(Path(tmp) / "p.sqlite") as saver:
        graph = build_graph(
            ScriptedChatModel(script=[*turns, reply("final")]),
            make_tools(ran),
            policies={"lookup": ToolPolicy(effect="read", approval="never")},
            limits=Limits(max_model_calls=8),
            checkpointer=saver,
        )
        cfg = {"configurable": {"thread_id": "p"}}
        out = graph.invoke({"messages": [("user", "go")]}, cfg)
        pending_answers = list(answers)
        for _ in range(12):
            if "__interrupt__" not in out:
                break
            request = out["__interrupt__"][0].value
            answer = (
                pending_answers.pop(0)
                if pending_answers
                else {"decisions": [{"type": "approve"}] * len(request["action_requests"])}
            )
            out = graph.invoke(Command(resume=answer), cfg)
            refused = "__interrupt__" in out and out["__interrupt__"][0].value.get("error")
            if not refused:
                approved.extend(_approved(request["action_requests"], answer))
        if "__interrupt__" in out:
            return  # still waiting for a valid answer: nothing more may have run, checked below
        assert out["status"] in STATUSES
        assert_each_call_answered_once(out["messages"])
    for name, args in ran:
        assert name in ("lookup", "book")
        if name == "lookup":
            assert isinstance(args["query"], str)
        else:
            assert (name, args) in approved, f"write ran without an approval of exactly {args}"


def _approved(actions: list[dict[str, Any]], answer: Any) -> list[tuple[str, dict[str, Any]]]:
    result = []
    for action, decision in zip(actions, answer.get("decisions") or [], strict=False):
        if isinstance(decision, dict) and decision.get("type") == "approve":
            result.append((action["name"], action["args"]))
        elif isinstance(decision, dict) and decision.get("type") == "edit":
            edited = decision.get("edited_action")
            if isinstance(edited, dict) and isinstance(edited.get("args"), dict):
                result.append((action["name"], edited["args"]))
    return result
