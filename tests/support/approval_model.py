"""The approval protocol's stateful model (Hypothesis), shared by tests/test_approval_protocol_model.py (the protocol
and its variants) and tests/test_grants_protocol_model.py (with standing grants and limits): the callers, the
scripted model, the bank, the machine with its steps and invariants, and the run's size. What it models and checks
is told in tests/test_approval_protocol_model.py."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.types import Command

from gatedloop.graph import CallContext, ToolPolicy, build_graph, open_sqlite
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

ACTORS: dict[str, CallContext | None] = {
    "ana": CallContext(user_id="ana"),
    "bo": CallContext(user_id="bo", roles=frozenset({"finance"})),
    "cy": CallContext(user_id="cy", roles=frozenset({"finance"})),
    "dan": CallContext(user_id="dan", roles=frozenset({"ops"})),
    "anonymous": None,
}
FINANCE = frozenset({"bo", "cy"})
ANONYMOUS = "anonymous"
THREAD = "t"
CFG: Any = {"configurable": {"thread_id": THREAD}}
LOSSY = "lossy"

# Who sends a message, and who answers: every caller can do anything, the ones that matter a little more often
# (ana, who has no role, asks; bo and cy, who may decide her calls, answer).
senders = st.sampled_from(["ana", "ana", "bo", "cy", "dan", ANONYMOUS])
reviewers = st.sampled_from(["bo", "cy", "bo", "cy", "ana", "dan", ANONYMOUS])
recipients = st.sampled_from(["ed", "flo", LOSSY, LOSSY])
payments = st.tuples(st.integers(1, 9), recipients)
single = st.lists(payments, min_size=1, max_size=1)
plans = st.one_of(  # one payment per message mostly; sometimes a second one the model asks for after the first
    single, single, single, st.lists(payments, min_size=2, max_size=2, unique_by=lambda p: p[1])
)
namings = st.sampled_from(["positional", "positional", "tool_call_id", "request_id", "both"])
approval_kinds = st.sampled_from(["approve", "approve", "approve", "edit", "reject", "respond"])
settle_kinds = st.sampled_from(["not_done", "not_done", "done", "abandon"])
MALFORMED: dict[str, Any] = {
    "not an object": "yes",
    "no decisions list": {"decision": []},
    "no decisions": {"decisions": []},
    "decisions not a list": {"decisions": "approve"},
    "unknown type": {"decisions": [{"type": "maybe"}]},
    "too many": {"decisions": [{"type": "approve"}, {"type": "approve"}, {"type": "approve"}]},
}
WRONG = [*MALFORMED, "other kind", "stale call", "stale request"]
PAYMENT = re.compile(r"pay (\d+) to (\w+)")


def user_id(actor: str) -> str | None:
    return None if actor == ANONYMOUS else actor


def may_decide(actor: str, requester: str | None) -> bool:
    """The policy: a finance member, identified, who is not the requester."""
    return actor in FINANCE and actor != requester


def respond(messages: list[BaseMessage]) -> AIMessage:
    """For the latest human message, propose its payments one at a time (each after the previous one's answer);
    then answer in text."""
    last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    wanted = PAYMENT.findall(str(messages[last].content))
    asked = sum(1 for m in messages[last + 1 :] if isinstance(m, AIMessage) and m.tool_calls)
    if asked < len(wanted):
        amount, to = wanted[asked]
        return reply(calls=[call("pay", {"to": to, "amount": int(amount)})])
    return reply("all done")


class Bank:
    """The authoritative system: every real payment, keyed by tool call id, with what was paid and during which
    step. Paying `lossy` takes the money and then loses the connection, on the first attempt of each call."""

    def __init__(self) -> None:
        self.paid: list[dict[str, Any]] = []
        self.step = ""
        self.lock = threading.Lock()

        @tool
        def pay(to: str, amount: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
            """Pay `amount` to `to` (write)."""
            with self.lock:
                first = not any(p["call_id"] == tool_call_id for p in self.paid)
                self.paid.append({"call_id": tool_call_id, "to": to, "amount": amount, "during": self.step})
            if to == LOSSY and first:
                raise ConnectionError("the bank closed the connection after taking the payment")
            return {"paid": to, "amount": amount}

        self.tool = pay

    def per_call(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for payment in self.paid:
            out[payment["call_id"]].append(payment)
        return out


class ApprovalProtocol(RuleBasedStateMachine):
    APPROVALS_REQUIRED = 1

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.bank = Bank()
        self.messages = 0
        self.sender_of: dict[str, str] = {}  # human message text -> who sent it
        self.sent: dict[str, set[tuple[str, str]]] = defaultdict(set)  # call id -> {(actor, decision type)}
        self.edits: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)  # call id -> [(actor, args)]
        self.seen_ids: list[str] = []  # tool call ids and request ids shown at some point
        self.pending: dict[str, Any] | None = None
        self.requester: dict[str, str] = {}  # tool call id -> who sent the human message it answers
        self.proposed: dict[str, dict[str, Any]] = {}  # tool call id -> the arguments the model proposed
        self.log: list[str] = []

    # ------------------------------------------------------------------ the graph

    @initialize(actor=senders, payments=plans)
    def starts(self, actor: str, payments: list[tuple[int, str]]) -> None:
        """A fresh SQLite file, a graph over it, and the thread's first message."""
        self.folder = tempfile.TemporaryDirectory()
        self.db = str(Path(self.folder.name) / "runs.sqlite")
        self.saver, self.graph = self.new_graph()
        self.says(actor, payments)

    def new_graph(self, stack: contextlib.ExitStack | None = None) -> tuple[Any, Any]:
        saver = (stack or self.stack).enter_context(open_sqlite(self.db))
        policy = ToolPolicy(
            effect="write", approval="always", approvers={"finance"}, approvals_required=self.APPROVALS_REQUIRED
        )
        graph = build_graph(
            ScriptedChatModel(responder=respond), [self.bank.tool], policies={"pay": policy}, checkpointer=saver
        )
        return saver, graph

    def teardown(self) -> None:
        self.stack.close()
        if hasattr(self, "folder"):
            self.folder.cleanup()

    def invoke(self, payload: Any, actor: str, step: str, graph: Any = None) -> None:
        self.bank.step = step
        self.log.append(step)
        (graph or self.graph).invoke(payload, CFG, context=ACTORS[actor], durability="sync")

    def refresh(self) -> None:
        """Read the thread once after each step: what is pending, and who asked for each call proposed so far."""
        state = self.graph.get_state(CFG)
        values = [i.value for t in state.tasks for i in t.interrupts]
        self.pending = values[0] if values else None
        for a in self.pending_calls():
            if a["tool_call_id"] not in self.seen_ids:
                self.seen_ids.append(a["tool_call_id"])
        rid = (self.pending or {}).get("request_id")
        if rid and rid not in self.seen_ids:
            self.seen_ids.append(rid)
        sender = None
        for message in state.values.get("messages") or []:
            if isinstance(message, HumanMessage):
                sender = self.sender_of.get(str(message.content))
            elif isinstance(message, AIMessage):
                for c in message.tool_calls:
                    if sender is not None and c["id"] and c["id"] not in self.requester:
                        self.requester[c["id"]] = sender
                        self.proposed[c["id"]] = dict(c["args"])

    def pending_kind(self) -> str | None:
        return None if self.pending is None else self.pending.get("kind")

    def pending_calls(self) -> list[dict[str, Any]]:
        if self.pending is None:
            return []
        return list(self.pending.get("action_requests") or self.pending.get("calls") or [])

    # ------------------------------------------------------------------ the oracle: who really asked

    def requester_of(self, call_id: str) -> str | None:
        actor = self.requester.get(call_id)
        return None if actor is None else user_id(actor)

    def authorized_for_all(self, actor: str, call_ids: list[str]) -> bool:
        return all(may_decide(actor, self.requester_of(c)) for c in call_ids)

    # ------------------------------------------------------------------ "a refused answer changes nothing"

    def snapshot(self) -> tuple[Any, ...]:
        approvals = sorted(
            (a.call_id, a.reviewer, a.decision, a.args_digest)
            for a in self.saver.ledger.approvals(THREAD, list(self.requester))
        )
        settled = sorted(
            (r["call_id"], r["actor"], r["detail"].get("decision"))
            for r in self.saver.ledger.audit(THREAD)
            if r["event"] == "unknown_outcome_decision"
        )
        shown = [(a["tool_call_id"], a["args"]) for a in self.pending_calls()]
        return len(self.bank.paid), approvals, settled, self.pending_kind(), shown

    def send(self, payload: Any, actor: str, step: str, *, must_refuse: bool) -> None:
        before = self.snapshot()
        self.invoke(Command(resume=payload), actor, step)
        self.refresh()
        if must_refuse:
            after = self.snapshot()
            assert after == before, self.report([f"a refused answer changed something: before {before}, after {after}"])

    def note_sent(self, actor: str, kind: str, call_ids: list[str], edit: dict[str, Any] | None = None) -> None:
        for call_id in call_ids:
            self.sent[call_id].add((actor, kind))
            if edit is not None:
                self.edits[call_id].append((actor, edit))

    # ------------------------------------------------------------------ steps

    @rule(actor=senders, payments=plans)
    def says(self, actor: str, payments: list[tuple[int, str]]) -> None:
        """A new human message: starts the thread, or continues it (replacing whatever is pending)."""
        self.messages += 1
        text = f"m{self.messages}: " + " then ".join(f"pay {amount} to {to}" for amount, to in payments)
        self.sender_of[text] = actor
        self.invoke({"messages": [("user", text)]}, actor, f"{actor} says {text!r}")
        self.refresh()

    @precondition(lambda self: self.pending_kind() == "approval")
    @rule(actor=reviewers, kind=approval_kinds, naming=namings)
    def answers(self, actor: str, kind: str, naming: str) -> None:
        """The approval request: approve, edit (the amount), reject or respond."""
        self.answer(actor, kind, naming)

    @precondition(lambda self: self.pending_kind() == "unknown_outcome")
    @rule(actor=reviewers, kind=settle_kinds, naming=namings)
    def settles(self, actor: str, kind: str, naming: str) -> None:
        """The question about a write whose outcome is unknown (decisions are positional; a tool_call_id is extra)."""
        self.answer(actor, kind, naming)

    def answer(self, actor: str, kind: str, naming: str) -> None:
        """`actor` answers every pending call with `kind`: in order, or naming the request (`request_id`), each
        call (`tool_call_id`, in reverse order), or both."""
        assert self.pending is not None
        calls = self.pending_calls()
        if naming in ("tool_call_id", "both"):
            calls.reverse()  # a decision that names its call applies to it, whatever its position
        decisions = []
        for c in calls:
            d = self.decision(kind, c)
            if naming in ("tool_call_id", "both"):
                d["tool_call_id"] = c["tool_call_id"]
            decisions.append(d)
            self.note_sent(actor, kind, [c["tool_call_id"]], d.get("edited_action", {}).get("args"))
        payload: dict[str, Any] = {"decisions": decisions}
        if naming in ("request_id", "both") and self.pending_kind() == "approval":
            payload["request_id"] = self.pending["request_id"]
        ids = [c["tool_call_id"] for c in calls]
        refuse = not self.authorized_for_all(actor, ids)
        how = "in order" if naming == "positional" else f"naming {naming}"
        self.send(payload, actor, f"{actor} answers {kind} {how} to {ids}", must_refuse=refuse)

    def decision(self, kind: str, action: dict[str, Any]) -> dict[str, Any]:
        if kind == "edit":
            args = {**action["args"], "amount": int(action["args"].get("amount", 1)) + 10}
            return {"type": "edit", "edited_action": {"name": "pay", "args": args}}
        if kind in ("reject", "respond"):
            return {"type": kind, "message": f"{kind}ed"}
        if kind == "done":
            return {"type": kind, "result": {"paid": "seen at the bank"}}
        return {"type": kind}

    @precondition(lambda self: self.pending is not None)
    @rule(actor=reviewers, wrong=st.sampled_from(WRONG))
    def sends_a_bad_answer(self, actor: str, wrong: str) -> None:
        """An answer that must be refused whoever sends it: malformed, of the other interrupt kind (an approval to
        a settle question, and the reverse), or naming a call or a request that is not pending (one shown before,
        or one never asked)."""
        calls = self.pending_calls()
        if wrong in ("stale call", "stale request"):
            live = {c["tool_call_id"] for c in calls} | {(self.pending or {}).get("request_id")}
            stale = [i for i in self.seen_ids if i not in live and i.startswith("req-") == (wrong == "stale request")]
            named = stale[-1] if stale else ("req-never-asked" if wrong == "stale request" else "call_never_asked")
            if wrong == "stale request":
                payload: Any = {"request_id": named, "decisions": [{"type": "approve"} for _ in calls]}
            else:
                payload = {"decisions": [{"type": "approve", "tool_call_id": named}]}
        elif wrong == "other kind":
            other = "not_done" if self.pending_kind() == "approval" else "approve"
            payload = {"decisions": [{"type": other} for _ in calls]}
            self.note_sent(actor, other, [c["tool_call_id"] for c in calls])
        else:
            payload = MALFORMED[wrong]
        self.send(payload, actor, f"{actor} sends a bad answer ({wrong}): {payload!r}", must_refuse=True)

    @rule(actor=reviewers, fresh_graph=st.booleans())
    def resumes_with_no_input(self, actor: str, fresh_graph: bool) -> None:
        """Carries no answer, so it supplies none: whatever it does, it decides nothing under `actor`'s name. With
        `fresh_graph`, first a restart: a new graph object over the same file, on a new connection (another
        process, as far as the thread can tell), which every later step uses too."""
        if fresh_graph:
            self.stack.close()
            self.stack = contextlib.ExitStack()
            self.saver, self.graph = self.new_graph()
        where = " on a fresh graph (restart)" if fresh_graph else ""
        self.invoke(None, actor, f"{actor} resumes with no input{where}")
        self.refresh()

    # ------------------------------------------------------------------ invariants

    # Each invariant collects what it finds and fails on one line of its own, so Hypothesis reports (and shrinks)
    # one failure per invariant, not one per way of breaking it.

    @invariant()
    def every_payment_was_approved_by_its_own_authorized_senders(self) -> None:
        problems = []
        for call_id, paid in self.bank.per_call().items():
            asker = self.requester_of(call_id)
            approvers = {a for a, kind in self.sent[call_id] if kind in ("approve", "edit") and may_decide(a, asker)}
            if len(approvers) < self.APPROVALS_REQUIRED:
                problems.append(
                    f"{call_id} (asked by {asker}) was paid {paid}, but the authorized approvals sent for it are "
                    f"{sorted(approvers)} (everything sent for it: {sorted(self.sent[call_id])})"
                )
            allowed = [self.proposed.get(call_id)] + [args for a, args in self.edits[call_id] if may_decide(a, asker)]
            problems += [
                f"{call_id} paid {p}, arguments nobody authorized approved ({allowed})"
                for p in paid
                if {"to": p["to"], "amount": p["amount"]} not in allowed
            ]
        assert not problems, self.report(problems)

    @invariant()
    def no_payment_twice_unless_an_authorized_person_said_not_done(self) -> None:
        problems = []
        for call_id, paid in self.bank.per_call().items():
            asker = self.requester_of(call_id)
            said = [a for a, kind in self.sent[call_id] if kind == "not_done" and may_decide(a, asker)]
            if len(paid) > 1 + len(said):
                problems.append(
                    f"{call_id} (asked by {asker}) was paid {len(paid)} times: {paid}; authorized not_done sent by "
                    f"{said} (everything sent for it: {sorted(self.sent[call_id])})"
                )
        assert not problems, self.report(problems)

    @invariant()
    def every_recorded_decision_was_sent_by_its_actor(self) -> None:
        recorded = [
            (a.call_id, a.reviewer, a.decision) for a in self.saver.ledger.approvals(THREAD, list(self.requester))
        ]
        recorded += [
            (r["call_id"], r["actor"], r["detail"].get("decision"))
            for r in self.saver.ledger.audit(THREAD)
            if r["event"] == "unknown_outcome_decision"
        ]
        problems = []
        for call_id, actor, kind in recorded:
            asker = self.requester_of(call_id)
            paid = len(self.bank.per_call().get(call_id, []))
            if (actor, kind) not in self.sent[call_id]:
                problems.append(
                    f"the ledger records {actor!r} deciding {kind!r} on {call_id} (asked by {asker}, paid {paid} "
                    f"times), which {actor!r} never sent (everything sent for it: {sorted(self.sent[call_id])})"
                )
            elif not may_decide(actor, asker):
                problems.append(f"the ledger records {actor!r} deciding {kind!r} on {call_id}, asked by {asker}")
        assert not problems, self.report(problems)

    @invariant()
    def the_requester_is_the_sender_of_the_message(self) -> None:
        problems = []
        if self.pending_kind() == "approval":
            for action in self.pending_calls():
                expected = self.requester_of(action["tool_call_id"])
                if action["requested_by"] != expected:
                    problems.append(
                        f"pending {action['tool_call_id']} shows requested_by {action['requested_by']!r}, but "
                        f"{expected!r} sent the message it answers"
                    )
        for call_id, record in self.saver.ledger.calls(THREAD, list(self.requester)).items():
            expected = self.requester_of(call_id)
            if record.requester.user_id != expected:
                problems.append(
                    f"the ledger records {record.requester.user_id!r} as the requester of {call_id}, but "
                    f"{expected!r} sent the message it answers"
                )
        assert not problems, self.report(problems)

    def report(self, problems: list[str]) -> str:
        return "\n".join([*problems, "steps:", *(f"  {step}" for step in self.log)])


# Sized for the README's test command (CI runs 100, .ci/run); GATEDLOOP_MODEL_EXAMPLES=200 runs a longer search
# (seed 2 at 50 found findings 1 and 3 on 1ee2d3b).
EXAMPLES = int(os.environ.get("GATEDLOOP_MODEL_EXAMPLES", "20"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no explain: it traces every line
)
