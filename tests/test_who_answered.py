"""Who asked, who answered (issue 29, invariants 10 and 13), in process on a real SQLite file: the requester is
bound to the message and the sender to the answer when each enters, never taken from whoever runs the graph next.
The crash and server versions are in test_crash.py and test_served_identity.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain.tools import ToolRuntime
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import CallContext, InvalidDecision, ToolPolicy, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

ANA = CallContext(user_id="ana", roles={"finance"})
BO = CallContext(user_id="bo", roles={"finance"})
CY = CallContext(user_id="cy", roles={"finance"})
T = "t1"
CFG = {"configurable": {"thread_id": T}}
FINANCE = ToolPolicy(effect="write", approval="always", approvers={"finance"})


class World:
    """The tools' real effects, and the runtime context each tool run saw."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, dict[str, Any]]] = []
        self.contexts: list[Any] = []
        self.lock = threading.Lock()

    def tools(self) -> list[Any]:
        world = self

        @tool
        def refund(order: str, runtime: ToolRuntime[Any]) -> str:
            """Refund an order (write)."""
            with world.lock:
                world.effects.append(("refund", {"order": order}))
                world.contexts.append(runtime.context)
            return f"refunded {order}"

        @tool
        def send_email(to: str, runtime: ToolRuntime[Any]) -> str:
            """Send an email (write)."""
            with world.lock:
                world.effects.append(("send_email", {"to": to}))
                world.contexts.append(runtime.context)
            return f"sent to {to}"

        return [refund, send_email]


def graph_of(saver: Any, world: World, script: list[Any], **kwargs: Any) -> Any:
    return build_graph(
        ScriptedChatModel(script=script),
        world.tools(),
        policies={"refund": FINANCE, "send_email": FINANCE},
        checkpointer=saver,
        **kwargs,
    )


def pending(graph: Any) -> dict[str, Any]:
    request = runs.pending_request(graph, T)
    assert request is not None
    return request


def test_the_requester_stays_who_sent_the_message_after_someone_else_resumes(db: str) -> None:
    """Finding 3: ana asks; bo approves her refund; the model then proposes send_email. It is requested by ana,
    not by bo who resumed: ana may not approve it (no self-approval), bo may."""
    world = World()
    script = [
        reply(calls=[call("refund", {"order": "o1"}, "c1")]),
        reply(calls=[call("send_email", {"to": "ana@example.com"}, "c2")]),
        reply("done"),
    ]
    with open_sqlite(db) as saver:
        graph = graph_of(saver, world, script)
        graph.invoke({"messages": [("user", "refund o1 and tell me")]}, CFG, context=ANA)
        assert pending(graph)["action_requests"][0]["requested_by"] == "ana"
        graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG, context=BO)
        second = pending(graph)["action_requests"][0]
        assert (second["name"], second["requested_by"]) == ("send_email", "ana")
        assert "Requested by: ana" in second["description"]
        with pytest.raises(InvalidDecision, match="requester"):
            runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=ANA)
        out = runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=BO)
        assert [record.requester.user_id for record in saver.ledger.calls(T, ["c1", "c2"]).values()] == ["ana"] * 2
    assert out["status"] == "completed"
    assert [name for name, _ in world.effects] == ["refund", "send_email"]


def test_a_client_cannot_set_the_requester_in_its_input_or_through_the_state_api(db: str) -> None:
    world = World()
    script = [reply(calls=[call("refund", {"order": "o1"}, "c1")]), reply("done")]
    with open_sqlite(db) as saver:
        graph = graph_of(saver, world, script)
        forged = {"user_id": "carol", "roles": ["finance"]}
        graph.invoke({"messages": [("user", "refund o1")], "requester": forged}, CFG, context=ANA)
        assert pending(graph)["action_requests"][0]["requested_by"] == "ana"
        with pytest.raises(InvalidDecision, match="requester"):
            runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=ANA)
        graph.update_state(CFG, {"requester": forged})
        requester = graph.get_state(CFG).values["requester"]
        assert (requester["user_id"], requester["roles"]) == ("ana", ["finance"])
    assert world.effects == []


def test_a_resume_with_no_answer_never_supplies_the_answer_someone_else_sent(db: str) -> None:
    """Finding 2 without the crash: ana's own approve is stored by LangGraph before the gate reads it; whoever
    then runs the graph with no answer (bo, `invoke(None)`) does not lend it his identity."""
    world = World()
    script = [reply(calls=[call("refund", {"order": "o1"}, "c1")]), reply("done")]
    with open_sqlite(db) as saver:
        graph = graph_of(saver, world, script)
        graph.invoke({"messages": [("user", "refund o1")]}, CFG, context=ANA)
        graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG, context=ANA)
        assert "requester" in pending(graph)["error"]
        graph.invoke(None, CFG, context=BO)
        assert world.effects == []
        decided = [row for row in saver.ledger.audit(T) if row["event"].startswith("decision")]
        assert decided == []
        refused = [row["actor"] for row in saver.ledger.audit(T) if row["event"].startswith("answer_refused")]
        assert refused == ["ana"]


def test_two_raw_invokes_racing_judge_each_answer_as_its_senders(db: str) -> None:
    """Finding 2's race: ana's answer and bo's `invoke(None)` at once, with no lease: nothing runs."""
    world = World()
    script = [reply(calls=[call("refund", {"order": "o1"}, "c1")]), reply("done")]
    with open_sqlite(db) as saver:
        graph = graph_of(saver, world, script)
        graph.invoke({"messages": [("user", "refund o1")]}, CFG, context=ANA)
        errors: list[BaseException] = []

        def run(payload: Any, who: CallContext) -> None:
            try:
                graph.invoke(payload, CFG, context=who)
            except Exception as exc:  # a lost race may surface as a checkpoint conflict; what ran is what counts
                errors.append(exc)

        racers = [
            threading.Thread(target=run, args=(Command(resume={"decisions": [{"type": "approve"}]}), ANA)),
            threading.Thread(target=run, args=(None, BO)),
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        graph.invoke(None, CFG, context=BO)
        assert world.effects == []
        assert not [row for row in saver.ledger.audit(T) if row["event"].startswith("decision")]


def test_a_refusal_shows_the_replacing_request_only_to_its_own_sender(db: str) -> None:
    """Finding 5: ana swaps her pending "refund o1" for "refund o9" with a new message and answers positionally
    herself (refused: she is the requester). That does not show the new request to bo: his stale positional
    approve is refused with it; once shown, his positional answer applies."""
    world = World()
    script = [
        reply(calls=[call("refund", {"order": "o1"}, "c1")]),
        reply(calls=[call("refund", {"order": "o9"}, "c2")]),
        reply("done"),
    ]
    with open_sqlite(db) as saver:
        graph = graph_of(saver, world, script)
        graph.invoke({"messages": [("user", "refund o1")]}, CFG, context=ANA)
        graph.invoke({"messages": [("user", "no, refund o9")]}, CFG, context=ANA)
        assert pending(graph)["replaced"] is True
        positional = {"decisions": [{"type": "approve"}]}
        for who in (ANA, ANA):  # the first shows it to ana; the second is refused as hers (the requester)
            with pytest.raises(InvalidDecision):
                runs.resume(graph, T, positional, context=who)
        with pytest.raises(InvalidDecision, match="the request changed since it was shown"):
            runs.resume(graph, T, positional, context=BO)
        assert world.effects == []
        out = runs.resume(graph, T, positional, context=BO)
    assert out["status"] == "completed"
    assert world.effects == [("refund", {"order": "o9"})]


def test_an_approval_of_a_replaced_request_never_counts_toward_its_replacement(db: str) -> None:
    """Finding 5, quorum: with two approvals required, bo approves the old request once; ana replaces it and
    answers positionally herself (refused); bo's stale positional approve is refused too, and never counts
    toward the new request."""
    world = World()
    quorum = ToolPolicy(effect="write", approval="always", approvers={"finance"}, approvals_required=2)
    script = [
        reply(calls=[call("refund", {"order": "o1"}, "c1")]),
        reply(calls=[call("refund", {"order": "o9"}, "c2")]),
    ]
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=script), world.tools(), policies={"refund": quorum}, checkpointer=saver
        )
        graph.invoke({"messages": [("user", "refund o1")]}, CFG, context=ANA)
        runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=BO)
        assert pending(graph)["action_requests"][0]["approved_by"] == ["bo"]
        graph.invoke({"messages": [("user", "no, refund o9")]}, CFG, context=ANA)
        with pytest.raises(InvalidDecision):  # ana's own answer that names nothing: shows it to ana only
            runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=ANA)
        with pytest.raises(InvalidDecision, match="the request changed since it was shown"):
            runs.resume(graph, T, {"decisions": [{"type": "approve"}]}, context=BO)
        assert pending(graph)["action_requests"][0]["approved_by"] == []
    assert world.effects == []


@dataclass
class TeamContext:
    """A user's own context schema: identity fields and one of the team's."""

    user_id: str | None = None
    roles: list[str] = field(default_factory=list)
    tenant: str = "default"


SERVER_ANA = {"identity": "ana", "roles": ["finance"], "gatedloop_auth": "token"}


@pytest.mark.parametrize(
    ("schema", "sent", "seen"),
    [
        (None, CallContext(user_id="bo", roles={"finance"}), CallContext(user_id="ana", roles={"finance"})),
        (None, None, CallContext(user_id="ana", roles={"finance"})),
        (None, {"user_id": "bo", "roles": ["finance"]}, CallContext(user_id="ana", roles={"finance"})),
        (TeamContext, {"user_id": "bo", "roles": ["x"], "tenant": "t9"}, TeamContext("ana", ["finance"], "t9")),
        (TeamContext, TeamContext("bo", ["x"], "t9"), TeamContext("ana", ["finance"], "t9")),
    ],
    ids=["call-context", "no-context", "dict", "custom-schema-dict", "custom-schema-object"],
)
def test_tools_see_the_authenticated_user_never_the_clients_claim(db: str, schema: Any, sent: Any, seen: Any) -> None:
    """Finding 4: under a server's auth (its user where LangGraph Server puts it), the runtime context a tool is
    given carries that user's identity; the client's user_id and roles are dropped, its other fields kept."""
    world = World()
    script = [reply(calls=[call("refund", {"order": "o1"}, "c1")]), reply("done")]
    config = {"configurable": {"thread_id": T, "langgraph_auth_user": SERVER_ANA}}
    with open_sqlite(db) as saver:
        extra = {"context_schema": schema} if schema is not None else {}
        policy = {"refund": ToolPolicy(effect="write", approval="never")}
        graph = build_graph(
            ScriptedChatModel(script=script), world.tools(), policies=policy, checkpointer=saver, **extra
        )
        out = graph.invoke({"messages": [("user", "refund o1")]}, config, context=sent)
    assert out["status"] == "completed"
    assert world.contexts == [seen]
