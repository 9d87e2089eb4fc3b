"""Who asked, who answered (issue 29, invariants 10 and 13) over the real `langgraph dev`, with gatedloop's token
auth, driven through the real `langgraph-sdk` client: the in-process versions are tests/test_who_answered.py and
tests/test_crash.py.

One server for the module serves tests/support/served_identity_app.py (gated writes only a `finance` reviewer
decides, self-approval off; a read that records the runtime context it sees; and the same read in a graph with a
context schema of the user's own). Users: ana (staff), bo (finance), fay (finance), dan (ops, another team's
approver: the server lets him see other people's threads, no tool here lets him decide). What really happened is
read from the files the tools write and from the ledger in the server's database, never from the server's reply.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from devserver import run_dev_server
from langgraph_sdk import get_sync_client
from refused import resumed

from gatedloop.checkpoints.ledger import SqliteLedger

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "support" / "served_identity_app.py"
GRAPH, TEAM_GRAPH, WEAKENED_GRAPH = "served_identity", "served_identity_team", "served_identity_weakened"
EFFECTS, CONTEXTS = "effects.jsonl", "contexts.jsonl"  # as in served_identity_app.py, which only the server imports

USERS: dict[str, tuple[str, list[str]]] = {
    "ana": ("ana-token-3b8d1f6e0a", ["staff"]),
    "bo": ("bo-token-8e2c5a7d1f", ["finance"]),
    "fay": ("fay-token-6a1e9c3b5d", ["finance"]),
    "dan": ("dan-token-2f7b4d8e6c", ["ops"]),
}
AUTH = {
    "supervisor_roles": ["finance", "ops"],
    "tokens": {token: {"user_id": user, "roles": roles} for user, (token, roles) in USERS.items()},
}
AS_BO = {"user_id": "bo", "roles": ["finance"]}
"""What a client claims in `context`: ignored under auth, for the gate and for the tools."""
APPROVE = {"decisions": [{"type": "approve"}]}
NOT_DONE = {"decisions": [{"type": "not_done"}]}


@dataclass
class Server:
    url: str
    folder: Path
    db: Path

    def client(self, user: str) -> Any:
        return get_sync_client(
            url=self.url, api_key=None, headers={"Authorization": f"Bearer {USERS[user][0]}"}, timeout=60
        )

    def effects(self, thread_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every real side effect of this thread's tools, in order."""
        return [(r["tool"], r["args"]) for r in self._records(EFFECTS) if r["thread_id"] == thread_id]

    def contexts(self, thread_id: str) -> list[dict[str, Any] | None]:
        """Every runtime context a tool of this thread was given."""
        return [r["context"] for r in self._records(CONTEXTS) if r["thread_id"] == thread_id]

    def audit(self, thread_id: str) -> list[dict[str, Any]]:
        with closing(SqliteLedger(self.db)) as ledger:
            return ledger.audit(thread_id)

    def requesters(self, thread_id: str, call_ids: list[str]) -> dict[str, str | None]:
        with closing(SqliteLedger(self.db)) as ledger:
            return {cid: record.requester.user_id for cid, record in ledger.calls(thread_id, call_ids).items()}

    def _records(self, name: str) -> list[dict[str, Any]]:
        path = self.folder / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("served-identity")
    db = folder / "studio.sqlite"
    env = {
        "SERVED_IDENTITY_DIR": str(folder),
        "GATEDLOOP_DB": str(db),
        "GATEDLOOP_LEDGER": None,
        "GATEDLOOP_AUTH_TOKENS": json.dumps(AUTH),
        "GATEDLOOP_AUTH_FILE": None,
    }
    overrides = {
        "env": None,
        "graphs": {GRAPH: f"{APP}:graph", TEAM_GRAPH: f"{APP}:team_graph", WEAKENED_GRAPH: f"{APP}:weakened_graph"},
    }
    with run_dev_server(ROOT, env=env, workdir=folder / "server", config_overrides=overrides) as url:
        yield Server(url, folder, db)


def say(client: Any, thread_id: str, text: str, graph: str = GRAPH, **kwargs: Any) -> dict[str, Any]:
    """One user message on a thread, waited for; kwargs go to `runs.wait` (e.g. `context=`)."""
    return client.runs.wait(thread_id, graph, input={"messages": [{"role": "user", "content": text}]}, **kwargs)


def answer(client: Any, thread_id: str, resume: Any, **kwargs: Any) -> dict[str, Any]:
    """A resume, waited for; a refusal is also the run's `__error__` (support/refused.py checks it)."""
    return resumed(client, thread_id, GRAPH, resume, **kwargs)


def asked(out: dict[str, Any]) -> dict[str, Any]:
    """The one pending question a run ended on."""
    [interrupt] = out["__interrupt__"]
    return interrupt["value"]


def action_of(out: dict[str, Any]) -> dict[str, Any]:
    [action] = asked(out)["action_requests"]
    return action


def test_refused_settlements_are_never_handed_back_as_the_answer_of_whoever_resumes_next(server: Server) -> None:
    """Finding 1: bo approved ana's transfer; the bank took the money and the reply was lost (its outcome is
    unknown). ana (the requester, no finance role) answers `not_done` positionally, keyed by the interrupt's id,
    and with a context claiming to be bo; dan (another team) positionally: each is refused. bo then continues with
    no answer of his own (`input=None`, twice): LangGraph hands the stored answers back to the settle task, and
    each is still judged as its sender's, so the money never moves twice, nothing is decided, and the question
    still waits; bo's own answer then settles it."""
    ana, bo, dan = server.client("ana"), server.client("bo"), server.client("dan")
    thread = ana.threads.create()["thread_id"]
    out = say(ana, thread, "transfer 500 to bo")
    assert (action_of(out)["name"], action_of(out)["requested_by"]) == ("transfer", "ana")
    out = answer(bo, thread, APPROVE)
    [unknown] = asked(out)["calls"]
    assert (asked(out)["kind"], unknown["tool_call_id"], unknown["reason"]) == (
        "unknown_outcome",
        "call_1_transfer",
        "connection_lost",
    )
    paid = [("transfer", {"amount": 500.0, "to": "bo"})]
    assert server.effects(thread) == paid

    out = answer(ana, thread, NOT_DONE)
    assert "deciding this call needs one of the roles ['finance']" in asked(out)["error"]
    [pending] = ana.threads.get_state(thread)["interrupts"]
    out = answer(ana, thread, {pending["id"]: NOT_DONE})
    assert asked(out)["kind"] == "unknown_outcome" and "finance" in asked(out)["error"]
    out = answer(ana, thread, NOT_DONE, context=AS_BO)
    assert asked(out)["kind"] == "unknown_outcome" and "finance" in asked(out)["error"]
    out = answer(dan, thread, NOT_DONE)
    assert asked(out)["kind"] == "unknown_outcome" and "finance" in asked(out)["error"]
    assert server.effects(thread) == paid

    for _ in range(2):
        out = bo.runs.wait(thread, GRAPH, input=None)
        assert server.effects(thread) == paid  # the one real transfer, never a second
        assert asked(out)["kind"] == "unknown_outcome"
    audit = [e for e in server.audit(thread) if e["call_id"] == "call_1_transfer"]
    assert [e for e in audit if e["event"] == "unknown_outcome_decision"] == []
    refused = Counter(e["actor"] for e in audit if e["event"].startswith("unknown_answer_refused:"))
    assert refused == {"ana": 3, "dan": 1}, refused
    assert [i["value"]["kind"] for i in bo.threads.get_state(thread)["interrupts"]] == ["unknown_outcome"]

    done = {"decisions": [{"type": "done", "result": {"transferred": 500.0, "to": "bo"}}]}
    out = answer(bo, thread, done)
    assert out["status"] == "completed"
    assert server.effects(thread) == paid
    settled = [e for e in server.audit(thread) if e["event"] == "unknown_outcome_decision"]
    assert [(e["actor"], e["detail"]["decision"]) for e in settled] == [("bo", "done")]


def test_the_requester_of_a_later_call_is_who_sent_the_message_not_who_approved_the_first(server: Server) -> None:
    """Finding 3: fay (finance) asks for a refund and an email; bo (finance) approves the refund. The model's next
    call, send_email, is requested by fay, not by bo whose run proposed it: fay may not approve it (she is the
    requester), bo may."""
    fay, bo = server.client("fay"), server.client("bo")
    thread = fay.threads.create()["thread_id"]
    out = say(fay, thread, "refund o1 and tell me")
    assert (action_of(out)["name"], action_of(out)["requested_by"]) == ("refund", "fay")
    out = answer(bo, thread, APPROVE)
    second = action_of(out)
    assert (second["tool_call_id"], second["requested_by"]) == ("call_1_send_email", "fay")
    assert "Requested by: fay" in second["description"]
    assert server.effects(thread) == [("refund", {"order": "o1"})]

    out = answer(fay, thread, APPROVE)
    assert "the requester may not decide her own call" in asked(out)["error"]
    assert server.effects(thread) == [("refund", {"order": "o1"})]
    out = answer(bo, thread, APPROVE)
    assert out["status"] == "completed"
    assert server.effects(thread) == [("refund", {"order": "o1"}), ("send_email", {"to": "requester@example.com"})]
    assert server.requesters(thread, ["call_1_refund", "call_1_send_email"]) == {
        "call_1_refund": "fay",
        "call_1_send_email": "fay",
    }
    decided = [(e["call_id"], e["actor"]) for e in server.audit(thread) if e["event"].startswith("decision")]
    assert decided == [("call_1_refund", "bo"), ("call_1_send_email", "bo")]


ANA_SEEN = {"type": "CallContext", "user_id": "ana", "roles": ["staff"], "extra": {}}


@pytest.mark.parametrize(
    ("graph", "sent", "seen"),
    [
        (GRAPH, AS_BO, ANA_SEEN),
        (GRAPH, None, ANA_SEEN),
        (
            TEAM_GRAPH,
            {**AS_BO, "tenant": "t9"},
            {"type": "TeamContext", "user_id": "ana", "roles": ["staff"], "tenant": "t9"},
        ),
        (TEAM_GRAPH, None, {"type": "TeamContext", "user_id": "ana", "roles": ["staff"], "tenant": "default"}),
    ],
    ids=["claimed-context", "no-context", "custom-schema-claimed", "custom-schema-no-context"],
)
def test_a_tool_sees_the_authenticated_user_never_the_clients_claim(
    server: Server, graph: str, sent: dict[str, Any] | None, seen: dict[str, Any]
) -> None:
    """Finding 4: the `runtime.context` a tool is given (`ToolRuntime`) carries ana's identity, whatever the
    client sends as `context`; with a context schema of the user's own, its identity fields are the server's
    user's and its other fields as the client sent them."""
    ana = server.client("ana")
    thread = ana.threads.create()["thread_id"]
    out = say(ana, thread, "whoami", graph=graph, **({"context": sent} if sent is not None else {}))
    assert out["status"] == "completed"
    assert server.contexts(thread) == [seen]


def test_a_requesters_refusal_never_shows_her_replacing_request_to_another_reviewer(server: Server) -> None:
    """Finding 5: ana swaps her pending "pay 5 to bo" for "pay 9000 to ana" with a new message, then answers it
    positionally herself (refused: it was not shown to her). That shows the new request to ana only: bo's stale
    positional approve, given for "pay 5 to bo", is refused with the new request and pays nothing; once shown,
    bo's positional answer applies to it."""
    ana, bo = server.client("ana"), server.client("bo")
    thread = ana.threads.create()["thread_id"]
    out = say(ana, thread, "pay 5 to bo")
    assert (action_of(out)["tool_call_id"], action_of(out)["args"]) == ("call_1_pay", {"amount": 5.0, "to": "bo"})
    out = say(ana, thread, "pay 9000 to ana")
    assert asked(out)["replaced"] is True
    assert (action_of(out)["tool_call_id"], action_of(out)["args"]) == ("call_2_pay", {"amount": 9000.0, "to": "ana"})
    request_id = asked(out)["request_id"]

    out = answer(ana, thread, APPROVE)
    assert "the request changed since it was shown" in asked(out)["error"]
    out = answer(bo, thread, APPROVE)
    assert server.effects(thread) == []
    assert asked(out)["request_id"] == request_id
    assert "the request changed since it was shown" in asked(out)["error"]
    assert [e for e in server.audit(thread) if e["event"].startswith("decision")] == []

    out = answer(bo, thread, APPROVE)
    assert out["status"] == "completed"
    assert server.effects(thread) == [("pay", {"amount": 9000.0, "to": "ana"})]
    decided = [(e["call_id"], e["actor"]) for e in server.audit(thread) if e["event"].startswith("decision")]
    assert decided == [("call_2_pay", "bo")]


def test_a_graph_whose_policies_were_weakened_never_decides_an_old_threads_request(server: Server) -> None:
    """Finding 6 over the server: ana's payment waits for a finance reviewer. The same graph redeployed with pay's
    approvers dropped (`weakened_graph`: same name, same tools, a weaker rule) is another graph for this thread:
    dan (ops, no finance role, whom the weaker rule would accept) resuming through it is refused with the reason,
    nothing is paid or recorded, and the request still waits for the rule it was made under: bo's approval through
    the graph that made the thread pays, once."""
    ana, bo, dan = server.client("ana"), server.client("bo"), server.client("dan")
    thread = ana.threads.create()["thread_id"]
    out = say(ana, thread, "pay 500 to bo")
    assert action_of(out)["name"] == "pay"
    refused = dan.runs.wait(thread, WEAKENED_GRAPH, command={"resume": APPROVE}, raise_error=False)
    assert refused["__error__"]["error"] == "GraphMismatch", refused
    assert "policy of pay: approvers ['finance'] -> None" in refused["__error__"]["message"]
    assert server.effects(thread) == [] and [e for e in server.audit(thread) if e["actor"] == "dan"] == []
    [waiting] = ana.threads.get_state(thread)["interrupts"]
    assert waiting["value"]["action_requests"][0]["name"] == "pay"
    out = answer(bo, thread, APPROVE)
    assert server.effects(thread) == [("pay", {"amount": 500.0, "to": "bo"})]
    assert out["status"] == "completed"
