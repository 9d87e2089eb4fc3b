"""The approval protocol's stateful model with standing grants and limits across threads (issue 53; invariants 1,
2, 15 and 17), driven by Hypothesis: tests/test_approval_protocol_model.py's machine, its steps and its invariants,
with four more kinds of step and the evidence they must leave.

`pay(to, amount)` is grantable (`approvers={"finance"}`) and carries two limits in a window of `WINDOW_S` seconds:
at most `SUM_AT_MOST` paid in all (`over="refuse"`), and at most `CALLS_AT_MOST` calls per requester (`over="ask"`).
Besides sending messages (a turn may now propose two payments at once) and answering requests, the callers
create grants (tool, `to in ...` and `amount<=n` bounds, uses, expiry, for ana, bo or anyone), confirm them (under
`approvals_required=2` a grant covers nothing until a second finance member confirms it), revoke them, and the
clock moves on (`time.time` is the test's clock: grants expire and windows turn over by its steps, never while a
step runs).

After every step the model checks the graph's evidence against its own record:

- every payment was decided by enough finance members its rule admits (not the requester), each of whom sent that
  approval after the last time the call was sent back to a person; or it was covered by a grant the model made,
  live when it ran (confirmed by enough such granters, not revoked before the step, not expired), whose bounds and
  requester it matches, with the arguments the model proposed, never a call a person edited;
- no grant approved more payments than its uses, and `runs.grants` says as many uses are left;
- within each window, all payments together stay within `SUM_AT_MOST`; a requester's payments past `CALLS_AT_MOST`
  were each approved by a person after a limit sent the call back to her;
- every tool call is answered by exactly one `ToolMessage`, except the calls of a paused turn still waiting;
- a grant, a confirmation or a revocation is refused exactly when the rule says so, and a refused one writes nothing;
- a single payment inside a live grant, within both limits, runs with no request (the grant is not ignored).

Examples are not saved (`database=None`): `pytest tests/test_grants_protocol_model.py --hypothesis-seed=N`
reproduces a run.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from unittest import mock

from approval_model import (
    ACTORS,
    CFG,
    EXAMPLES,
    FINANCE,
    SETTINGS,
    THREAD,
    ApprovalProtocol,
    may_decide,
    senders,
    user_id,
)
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool

from gatedloop.graph import CallContext, ToolPolicy, build_graph, open_sqlite, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.gate.admission import SENT_BACK
from gatedloop.nodes.gate.grants import GrantRefused
from gatedloop.tools.usage import UsageLimit

WINDOW_S = 1000.0
SUM_AT_MOST = 15
CALLS_AT_MOST = 2
# The clock starts `MARGIN` seconds into a window and moves in steps of `TICK`; grants last a whole number of ticks
# plus half of one. So windows turn over and grants expire half a tick away from any moment a step runs at (a step
# takes far less than `MARGIN` seconds of real time), and which side of a boundary a payment fell on is never a race.
TICK = 100.0
MARGIN = TICK / 2
PAYEES = ("ed", "flo", "gus")  # no grant ever names gus
SUMMED = UsageLimit(at_most=SUM_AT_MOST, window_s=WINDOW_S, sums="amount", over="refuse")
PER_REQUESTER = UsageLimit(at_most=CALLS_AT_MOST, window_s=WINDOW_S, per="requester", over="ask")
REAL_TIME = time.time

payments = st.tuples(st.integers(1, 9), st.sampled_from(PAYEES))
turns = st.lists(payments, min_size=1, max_size=2)  # two payments in one turn: both admitted, claimed in order
plans = st.one_of(*[st.lists(turns, min_size=1, max_size=1)] * 3, st.lists(turns, min_size=2, max_size=2))
finance = st.sampled_from(sorted(FINANCE))
granters = st.sampled_from(["bo", "cy", "bo", "cy", "ana", "dan", "anonymous"])
bounds = st.tuples(
    st.sampled_from([("ed",), ("flo",), ("ed", "flo"), None]),  # `to in ...`, or any payee
    st.sampled_from([3, 5, 9, None]),  # `amount<=n`, or any amount
)
grant_requesters = st.sampled_from([None, None, "ana", "bo"])
lifetimes = st.sampled_from([2.5 * TICK, 6.5 * TICK, 24.5 * TICK])


class Clock:
    """`time.time` while a machine runs: the real time plus how far the steps moved it on, starting `MARGIN` seconds
    into the next window."""

    def __init__(self) -> None:
        now = REAL_TIME()
        self.offset = (math.floor(now / WINDOW_S) + 1) * WINDOW_S + MARGIN - now

    def __call__(self) -> float:
        return REAL_TIME() + self.offset


def respond(messages: list[BaseMessage]) -> AIMessage:
    """For the latest human message ("pay 3 to ed & pay 4 to flo then pay 2 to gus"), propose each turn's
    payments together, each turn after the previous one's answers; then answer in text."""
    last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    wanted = str(messages[last].content).split(": ", 1)[1].split(" then ")
    asked = sum(1 for m in messages[last + 1 :] if isinstance(m, AIMessage) and m.tool_calls)
    if asked < len(wanted):
        parts = [p.split() for p in wanted[asked].split(" & ")]
        return reply(calls=[call("pay", {"to": p[3], "amount": int(p[1])}) for p in parts])
    return reply("all done")


class Bank:
    """Every real payment, keyed by tool call id, with the step it ran in and the clock's time then."""

    def __init__(self) -> None:
        self.paid: list[dict[str, Any]] = []
        self.step = ""
        self.step_no = 0
        self.lock = threading.Lock()

        @tool
        def pay(to: str, amount: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
            """Pay `amount` to `to` (write)."""
            payment = {"call_id": tool_call_id, "to": to, "amount": amount, "during": self.step, "at": time.time()}
            with self.lock:
                self.paid.append({**payment, "step_no": self.step_no})
            return {"paid": to, "amount": amount}

        self.tool = pay

    def per_call(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for payment in self.paid:
            out[payment["call_id"]].append(payment)
        return out


@dataclass
class ModelGrant:
    """A grant as the model made it: its bounds, who granted it (in order), and the step that revoked it."""

    to: tuple[str, ...] | None
    at_most: int | None
    requester: str | None
    uses: int
    expires_at: float
    granters: list[str]
    revoked_step: int | None = None

    def admits(self, to: str, amount: int, requester: str | None) -> bool:
        inside = (self.to is None or to in self.to) and (self.at_most is None or amount <= self.at_most)
        return inside and self.requester in (None, requester)

    def authorized(self, requester: str | None) -> int:
        """How many of its granters may decide this requester's calls (the quorum it has for them)."""
        return sum(may_decide(g, requester) for g in self.granters)


def context_of(actor: str) -> CallContext:
    return ACTORS[actor] or CallContext()


class GrantsAndLimits(ApprovalProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.bank: Bank = Bank()  # type: ignore[assignment]
        self.clock = Clock()
        self.clock_patch = mock.patch.object(time, "time", self.clock)
        self.clock_patch.start()
        self.step_no = 0
        self.sent_at: dict[str, list[tuple[str, str, int]]] = defaultdict(list)  # call id -> [(actor, kind, step)]
        self.sent_back: dict[str, list[tuple[str, int]]] = defaultdict(list)  # call id -> [(why, step)]
        self.seen_back: set[tuple[str, str, float]] = set()
        self.grants: dict[str, ModelGrant] = {}

    def teardown(self) -> None:
        super().teardown()
        self.clock_patch.stop()

    def new_graph(self, stack: contextlib.ExitStack | None = None) -> tuple[Any, Any]:
        saver = (stack or self.stack).enter_context(open_sqlite(self.db))
        policy = ToolPolicy(
            effect="write",
            approval="always",
            approvers={"finance"},
            approvals_required=self.APPROVALS_REQUIRED,
            grantable=True,
            limits=[SUMMED, PER_REQUESTER],
        )
        graph = build_graph(
            ScriptedChatModel(responder=respond), [self.bank.tool], policies={"pay": policy}, checkpointer=saver
        )
        return saver, graph

    # ------------------------------------------------------------------ bookkeeping

    def invoke(self, payload: Any, actor: str, step: str, graph: Any = None) -> None:
        self.step_no += 1
        self.bank.step_no = self.step_no
        super().invoke(payload, actor, step, graph)

    def note_sent(self, actor: str, kind: str, call_ids: list[str], edit: dict[str, Any] | None = None) -> None:
        super().note_sent(actor, kind, call_ids, edit)
        for call_id in call_ids:  # sent with the step about to be invoked
            self.sent_at[call_id].append((actor, kind, self.step_no + 1))

    def refresh(self) -> None:
        """Also: which calls the gate sent back to a person (a lapsed grant, a limit that asks), in which step."""
        super().refresh()
        for record in self.saver.ledger.approvals(THREAD, list(self.requester)):
            key = (record.call_id, record.reviewer, record.at)
            if record.decision == SENT_BACK and key not in self.seen_back:
                self.seen_back.add(key)
                self.sent_back[record.call_id].append((record.reviewer, self.step_no))

    def grant_uses(self) -> dict[str, str]:
        """call id -> the grant whose use its claim took, as the ledger says."""
        return {c: g for c, (g, _) in self.saver.ledger.grant_uses(THREAD, list(self.requester)).items()}

    def uses_taken(self) -> dict[str, int]:
        taken: dict[str, int] = defaultdict(int)
        for grant_id in self.grant_uses().values():
            taken[grant_id] += 1
        return taken

    def step(self, text: str) -> None:
        self.step_no += 1
        self.log.append(text)

    def views(self) -> list[dict[str, Any]]:
        return [v.as_json() for v in runs.grants(self.graph)]

    def grant_open(self, grant_id: str) -> bool:
        g = self.grants[grant_id]
        return g.revoked_step is None and self.clock() < g.expires_at and self.uses_taken()[grant_id] < g.uses

    # ------------------------------------------------------------------ steps: messages

    @initialize(actor=senders, plan=plans, granter=finance, bound=bounds, confirmer=st.one_of(st.none(), finance))
    def starts(  # type: ignore[override]
        self,
        actor: str,
        plan: list[list[tuple[int, str]]],
        granter: str,
        bound: tuple[tuple[str, ...] | None, int | None],
        confirmer: str | None,
    ) -> None:
        """A fresh SQLite file and a graph over it; a grant of ana's payments (confirmed by a second granter, or
        not); the thread's first message."""
        self.folder = tempfile.TemporaryDirectory()
        self.db = str(Path(self.folder.name) / "runs.sqlite")
        self.saver, self.graph = self.new_graph()
        self.grants_ahead(granter, bound, "ana", 2, 6.5 * TICK)
        if confirmer is not None:
            self.confirms(confirmer, 0)
        self.says(actor, plan)

    @rule(actor=senders, plan=plans)
    def says(self, actor: str, plan: list[list[tuple[int, str]]]) -> None:  # type: ignore[override]
        """A new message; when nothing was pending and its first turn is one payment that a live grant covers
        within both limits, that payment must run with no request."""
        self.messages += 1
        text = f"m{self.messages}: " + " then ".join(" & ".join(f"pay {a} to {t}" for a, t in turn) for turn in plan)
        self.sender_of[text] = actor
        free = self.pending is None and len(plan[0]) == 1 and self.runs_free(*plan[0][0], user_id(actor))
        self.invoke({"messages": [("user", text)]}, actor, f"{actor} says {text!r}")
        self.refresh()
        if free:
            first = self.first_call_of(text)
            assert first in self.grant_uses() and first in self.bank.per_call(), self.report(
                [
                    f"{first} ({plan[0][0]}, asked by {actor}) is inside a live grant and both limits, but did not run "
                    f"under it: grants {self.grants}, uses {self.grant_uses()}, pending {self.pending}"
                ]
            )

    @precondition(lambda self: bool(self.grants))
    @rule(which=st.integers(0, 9), amount=st.integers(1, 9), two=st.booleans())
    def asks_within_a_grant(self, which: int, amount: int, two: bool) -> None:
        """A message from the requester a grant names (ana when it names anyone) for a payment inside its bounds;
        with `two`, the same payment twice in one turn (a one-use grant covers both at admission, the second's
        claim finds it used up)."""
        g = self.grants[list(self.grants)[which % len(self.grants)]]
        payment = (min(amount, g.at_most or amount), g.to[0] if g.to else "ed")
        self.says(g.requester or "ana", [[payment, payment] if two else [payment]])

    def runs_free(self, amount: int, to: str, requester: str | None) -> bool:
        now = self.clock()
        window = [p for p in self.bank.paid if math.floor(p["at"] / WINDOW_S) == math.floor(now / WINDOW_S)]
        mine = [p for p in window if self.requester_of(p["call_id"]) == requester]
        within = sum(p["amount"] for p in window) + amount <= SUM_AT_MOST and len(mine) < CALLS_AT_MOST
        covered = any(
            self.grant_open(i)
            and g.admits(to, amount, requester)
            and g.authorized(requester) >= self.APPROVALS_REQUIRED
            for i, g in self.grants.items()
        )
        return within and covered

    def first_call_of(self, text: str) -> str:
        messages = self.graph.get_state(CFG).values["messages"]
        start = next(i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and m.content == text)
        return next(m.tool_calls[0]["id"] for m in messages[start:] if isinstance(m, AIMessage) and m.tool_calls)

    # ------------------------------------------------------------------ steps: grants and the clock

    @rule(actor=granters, bound=bounds, requester=grant_requesters, uses=st.integers(1, 3), lifetime=lifetimes)
    def grants_ahead(
        self,
        actor: str,
        bound: tuple[tuple[str, ...] | None, int | None],
        requester: str | None,
        uses: int,
        lifetime: float,
    ) -> None:
        """A grant of pay within `to` and `amount` bounds; refused unless a finance member, not its requester."""
        to, at_most = bound
        where = [] if to is None else [f"to={to[0]}" if len(to) == 1 else f"to in {','.join(to)}"]
        where += [] if at_most is None else [f"amount<={at_most}"]
        allowed = actor in FINANCE and actor != requester
        self.step(f"{actor} grants pay where {where} for {requester or 'anyone'}, {uses} uses, {lifetime:g} s")
        before, views = self.clock(), self.views()
        try:
            grant_id = runs.grant(
                self.graph,
                "pay",
                context=context_of(actor),
                where=where,
                uses=uses,
                expires_in_s=lifetime,
                requester=requester,
            )
        except GrantRefused as refused:
            assert not allowed, self.report([f"{actor}'s grant was refused: {refused}"])
            assert self.views() == views, self.report(["a refused grant wrote something"])
            return
        assert allowed, self.report([f"{actor} may not grant {requester}'s calls, yet made {grant_id}"])
        [view] = [v for v in runs.grants(self.graph) if v.grant_id == grant_id]
        assert before + lifetime <= view.expires_at <= self.clock() + lifetime, view
        self.grants[grant_id] = ModelGrant(to, at_most, requester, uses, view.expires_at, [actor])
        self.log[-1] += f": {grant_id}"

    @precondition(lambda self: bool(self.grants))
    @rule(actor=granters, which=st.integers(0, 9))
    def confirms(self, actor: str, which: int) -> None:
        """A further granter: only while the grant is open, by a finance member who is neither its requester nor a
        granter of it already."""
        grant_id = list(self.grants)[which % len(self.grants)]
        g = self.grants[grant_id]
        allowed = self.grant_open(grant_id) and actor in FINANCE and actor != g.requester and actor not in g.granters
        self.step(f"{actor} confirms {grant_id}")
        views = self.views()
        try:
            runs.confirm_grant(self.graph, grant_id, context=context_of(actor))
        except GrantRefused as refused:
            assert not allowed, self.report([f"{actor}'s confirmation of {grant_id} was refused: {refused}"])
            assert self.views() == views, self.report(["a refused confirmation wrote something"])
            return
        assert allowed, self.report([f"{actor} confirmed {grant_id} ({g}), which the rule does not allow"])
        g.granters.append(actor)

    @precondition(lambda self: bool(self.grants))
    @rule(actor=granters, which=st.integers(0, 9))
    def revokes(self, actor: str, which: int) -> None:
        """A revocation: by a finance member (a granter, or a reviewer of pay), once."""
        grant_id = list(self.grants)[which % len(self.grants)]
        g = self.grants[grant_id]
        allowed = actor in FINANCE and g.revoked_step is None
        self.step(f"{actor} revokes {grant_id}")
        views = self.views()
        try:
            runs.revoke(self.graph, grant_id, context=context_of(actor))
        except GrantRefused as refused:
            assert not allowed, self.report([f"{actor}'s revocation of {grant_id} was refused: {refused}"])
            assert self.views() == views, self.report(["a refused revocation wrote something"])
            return
        assert allowed, self.report([f"{actor} revoked {grant_id}, which the rule does not allow"])
        g.revoked_step = self.step_no

    @rule(ticks=st.sampled_from([1, 4, 10]))
    def time_passes(self, ticks: int) -> None:
        """The clock moves on: grants expire, a limit's window turns over."""
        self.clock.offset += ticks * TICK
        self.step(f"{ticks * TICK:g} s pass")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_payment_was_approved_by_its_own_authorized_senders(self) -> None:
        """Decided by people the rule admits (after the call's last send-back), or covered by a live grant."""
        problems: list[str] = []
        uses = self.grant_uses()
        for call_id, paid in self.bank.per_call().items():
            if call_id in uses:
                problems += self.grant_problems(call_id, uses[call_id], paid)
                continue
            asker = self.requester_of(call_id)
            last_back = max((step for _, step in self.sent_back[call_id]), default=0)
            approvers = {
                a
                for a, kind, step in self.sent_at[call_id]
                if kind in ("approve", "edit") and may_decide(a, asker) and step > last_back
            }
            if len(approvers) < self.APPROVALS_REQUIRED:
                problems.append(
                    f"{call_id} (asked by {asker}) was paid {paid} with no grant's use, but the authorized approvals "
                    f"sent for it after it was last sent back (step {last_back}) are {sorted(approvers)} (everything "
                    f"sent for it: {self.sent_at[call_id]})"
                )
            allowed = [self.proposed.get(call_id)] + [args for a, args in self.edits[call_id] if may_decide(a, asker)]
            problems += [
                f"{call_id} paid {p}, arguments nobody authorized approved ({allowed})"
                for p in paid
                if {"to": p["to"], "amount": p["amount"]} not in allowed
            ]
        assert not problems, self.report(problems)

    def grant_problems(self, call_id: str, grant_id: str, paid: list[dict[str, Any]]) -> list[str]:
        """Why the grant whose use the ledger names could not have approved this payment (none: it could)."""
        g = self.grants.get(grant_id)
        if g is None:
            return [f"{call_id} ran under {grant_id}, a grant nobody made"]
        asker = self.requester_of(call_id)
        [p] = paid
        why = []
        if {"to": p["to"], "amount": p["amount"]} != self.proposed.get(call_id):
            why.append(f"it ran {p}, not the arguments proposed ({self.proposed.get(call_id)})")
        if any(may_decide(a, asker) for a, _ in self.edits[call_id]):
            why.append(f"a reviewer edited it ({self.edits[call_id]})")
        if not g.admits(p["to"], p["amount"], asker):
            why.append(f"it is outside the grant's bounds ({g}; asked by {asker})")
        if g.authorized(asker) < self.APPROVALS_REQUIRED:
            why.append(f"the grant's granters {g.granters} are not a quorum for {asker}'s calls")
        if g.revoked_step is not None and p["step_no"] > g.revoked_step:
            why.append(f"it ran in step {p['step_no']}, after the grant was revoked in step {g.revoked_step}")
        if p["at"] >= g.expires_at:
            why.append(f"it ran at {p['at']:.0f}, after the grant expired at {g.expires_at:.0f}")
        return [f"{call_id} ran under {grant_id}, but {w}" for w in why]

    @invariant()
    def no_grant_approves_more_calls_than_its_uses(self) -> None:
        taken = self.uses_taken()
        left = {v.grant_id: v.uses_left for v in runs.grants(self.graph)}
        problems = [
            f"{grant_id} approved {taken[grant_id]} calls of {g.uses}, and shows {left.get(grant_id)} uses left"
            for grant_id, g in self.grants.items()
            if taken[grant_id] > g.uses or left.get(grant_id) != g.uses - taken[grant_id]
        ]
        assert not problems, self.report(problems)

    @invariant()
    def no_payment_goes_past_a_limit_unless_a_person_let_it(self) -> None:
        """The summed limit refuses: never past it. The per-requester one asks: each call past it was sent back
        by the limit and approved by people the rule admits after that."""
        windows: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for payment in self.bank.paid:
            windows[math.floor(payment["at"] / WINDOW_S)].append(payment)
        problems = []
        for window, paid in windows.items():
            total = sum(p["amount"] for p in paid)
            if total > SUM_AT_MOST:
                problems.append(f"window {window} paid {total} in all, past {SUM_AT_MOST}: {paid}")
            per: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
            for p in paid:
                per[self.requester_of(p["call_id"])].append(p)
            for asker, theirs in per.items():
                for p in sorted(theirs, key=lambda p: p["at"])[CALLS_AT_MOST:]:
                    problems += self.past_limit_problems(p, asker)
        assert not problems, self.report(problems)

    def past_limit_problems(self, payment: dict[str, Any], asker: str | None) -> list[str]:
        call_id = payment["call_id"]
        backs = [step for why, step in self.sent_back[call_id] if why.startswith("limit:")]
        if not backs:
            return [f"{call_id} (asked by {asker}) went past {CALLS_AT_MOST} calls in its window, never sent back"]
        approvers = {
            a
            for a, kind, step in self.sent_at[call_id]
            if kind in ("approve", "edit") and may_decide(a, asker) and step > max(backs)
        }
        if len(approvers) < self.APPROVALS_REQUIRED:
            return [f"{call_id} went past the limit with approvals after its send-back from {sorted(approvers)} only"]
        return []

    @invariant()
    def every_recorded_decision_was_sent_by_its_actor(self) -> None:
        """The base model's check, over people's decisions: a send-back is the gate's own record, which no one
        sends."""
        problems = []
        for record in self.saver.ledger.approvals(THREAD, list(self.requester)):
            if record.decision == SENT_BACK:
                if not record.reviewer.startswith(("limit:", "grant:")):
                    problems.append(f"a send-back of {record.call_id} recorded as sent by {record.reviewer!r}")
                continue
            asker = self.requester_of(record.call_id)
            if (record.reviewer, record.decision) not in self.sent[record.call_id]:
                problems.append(
                    f"the ledger records {record.reviewer!r} deciding {record.decision!r} on "
                    f"{record.call_id}, which they never sent ({sorted(self.sent[record.call_id])})"
                )
            elif not may_decide(record.reviewer, asker):
                problems.append(f"the ledger records {record.reviewer!r} deciding {record.call_id}, asked by {asker}")
        assert not problems, self.report(problems)

    @invariant()
    def every_call_is_answered_exactly_once(self) -> None:
        """Invariant 1: one ToolMessage per call; only the calls of the last turn may wait, and only while the
        thread is paused."""
        messages = self.graph.get_state(CFG).values.get("messages") or []
        answers: dict[str, int] = defaultdict(int)
        for m in messages:
            if isinstance(m, ToolMessage):
                answers[m.tool_call_id] += 1
        turns = [[c["id"] for c in m.tool_calls] for m in messages if isinstance(m, AIMessage) and m.tool_calls]
        waiting = set(turns[-1]) if turns and self.pending is not None else set()
        proposed = {i for turn in turns for i in turn}
        problems = [f"{i} answered {n} times" for i, n in answers.items() if n != 1 or i not in proposed]
        problems += [f"{i} was never answered" for i in proposed - set(answers) - waiting]
        assert not problems, self.report(problems)


class GrantsAndLimitsTwoGranters(GrantsAndLimits):
    """The same with `approvals_required=2`: a grant covers nothing until bo and cy both granted it, and covers
    neither of their own calls (the requester never counts toward her own quorum)."""

    APPROVALS_REQUIRED = 2


GRANT_SETTINGS = settings(SETTINGS, max_examples=max(1, EXAMPLES // 4), stateful_step_count=20)
GrantsAndLimits.TestCase.settings = GRANT_SETTINGS
GrantsAndLimitsTwoGranters.TestCase.settings = GRANT_SETTINGS
TestGrantsAndLimits = GrantsAndLimits.TestCase
TestGrantsAndLimitsTwoGranters = GrantsAndLimitsTwoGranters.TestCase
