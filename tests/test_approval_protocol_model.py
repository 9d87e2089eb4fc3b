"""A stateful model of the approval protocol (invariants 2, 3, 10 and 13), driven by Hypothesis.

One thread, one gated write `pay(to, amount)` (`approvers={"finance"}`, so the requester may not decide her own
call), a scripted model whose reply is a function of the conversation (each payment a message asks for, one at a
time, each after the previous one's answer; then text), and five callers: ana (no role), bo and cy (finance), dan
(ops) and an anonymous caller (no context). Each step is something one of them can do through the public API:
send a message (which may replace a pending request), answer the pending request in order or naming its request
and/or its calls (approve, edit, reject, respond), settle a write whose outcome is unknown (done / not_done /
abandon), send an answer that must be refused (malformed, of the other kind, naming a call or request that is not
pending), resume with no input, on the same graph or after a restart (a fresh graph over the same SQLite file).

The machine keeps its own record of who sent which message and which answer, and after every step checks the
graph's evidence against it:

- every real payment (the bank's own list, keyed by tool call id) was approved for exactly that call by enough
  finance members other than the requester, each of whom sent that approval themselves; a call is paid twice only
  after such a member said `not_done` about its unknown outcome;
- every decision the ledger records (approvals and settlements of unknown outcomes) was sent by its recorded
  actor, about that call, and that actor may decide it;
- an answer that must be refused (malformed, stale, or from someone who may not decide) changes nothing: no
  payment, no recorded decision, the same calls still pending;
- the requester of a call (in the pending request and in the ledger) is whoever sent the message it answers.

Paying `lossy` takes the money and then loses the connection (on the first attempt of each call), so the write's
outcome is unknown and a person is asked; a `not_done` re-runs it (and the bank pays again, legitimately).

Four variants: the protocol as above; with `approvals_required=2`; with every payment lossy (the unknown-outcome
path, asked by `execute`, or by `model` when a new message arrives meanwhile); and ending with one more step, two
raw resumes racing in two threads (not shrunk: the interleaving is the scheduler's). Examples are not saved
(`database=None`), so a run is reproduced by its seed: `pytest tests/test_approval_protocol_model.py
--hypothesis-seed=N`. The machine itself is in tests/support/approval_model.py, which
tests/test_grants_protocol_model.py extends with standing grants and limits.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from approval_model import (
    ACTORS,
    CFG,
    EXAMPLES,
    LOSSY,
    SETTINGS,
    ApprovalProtocol,
    reviewers,
    senders,
)
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule
from langgraph.types import Command


class ApprovalProtocolTwoApprovers(ApprovalProtocol):
    """The same protocol with `approvals_required=2`: two distinct finance members, neither the requester."""

    APPROVALS_REQUIRED = 2


lossy_payments = st.lists(st.tuples(st.integers(1, 9), st.just(LOSSY)), min_size=1, max_size=1)


class ApprovalProtocolUnknownOutcomes(ApprovalProtocol):
    """The same protocol where every payment loses its connection after taking the money: each approved call
    leads to the question about its unknown outcome (done / not_done / abandon), asked by `execute`, or by `model`
    when a new message arrives meanwhile."""

    @initialize(actor=senders, payments=lossy_payments)
    def starts(self, actor: str, payments: list[tuple[int, str]]) -> None:
        super().starts(actor, payments)

    @rule(actor=senders, payments=lossy_payments)
    def says(self, actor: str, payments: list[tuple[int, str]]) -> None:
        super().says(actor, payments)


class ApprovalProtocolWithRaces(ApprovalProtocol):
    """The same protocol ending with one more step when a request is pending: two raw resumes racing in two threads.
    Which one runs first is up to the scheduler, so a failure found here may not replay exactly, and this variant
    is not shrunk. A `FlakyFailure` from it is still a failure: the race went the bad way once (its sub-exception
    says how).

    The race is the example's last step (in `teardown`, its reviewers and kind drawn at the start): raced mid-run,
    the scheduler decided what was pending after it, so the next steps' preconditions did too, and Hypothesis
    stopped with `FlakyStrategyDefinition` (its generation depending on external state) once in a CI run."""

    @initialize(first=reviewers, second=reviewers, how=st.sampled_from(["both approve", "approve and no input"]))
    def plans_a_race(self, first: str, second: str, how: str) -> None:
        self.race_plan = (first, second, how)

    def teardown(self) -> None:
        try:
            if self.pending_kind() == "approval" and hasattr(self, "race_plan"):
                self.race(*self.race_plan)
                self.every_payment_was_approved_by_its_own_authorized_senders()
                self.no_payment_twice_unless_an_authorized_person_said_not_done()
                self.every_recorded_decision_was_sent_by_its_actor()
                self.the_requester_is_the_sender_of_the_message()
        finally:
            super().teardown()

    def race(self, first: str, second: str, how: str) -> None:
        """Two raw resumes at once, each on its own connection and graph: one approval naming the call, and a
        second approval (or a resume with no input)."""
        assert self.pending is not None
        ids = [a["tool_call_id"] for a in self.pending_calls()]
        decisions = [{"type": "approve", "tool_call_id": i} for i in ids]
        named = {"request_id": self.pending["request_id"], "decisions": decisions}
        self.note_sent(first, "approve", ids)
        payloads: list[Any] = [Command(resume=named), None]
        if how == "both approve":
            self.note_sent(second, "approve", ids)
            payloads[1] = Command(resume=named)
        with contextlib.ExitStack() as other:
            _, second_graph = self.new_graph(other)
            graphs = [self.graph, second_graph]
            barrier = threading.Barrier(2)
            failures: list[BaseException] = []

            def run(index: int, actor: str) -> None:
                barrier.wait()
                try:
                    graphs[index].invoke(payloads[index], CFG, context=ACTORS[actor], durability="sync")
                except BaseException as exc:  # reported below, in the test's thread
                    failures.append(exc)

            also = "approves them" if how == "both approve" else "resumes with no input"
            self.bank.step = f"race: {first} approves {ids} by name | {second} {also}"
            self.log.append(self.bank.step)
            threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate((first, second))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert not failures, failures
        self.refresh()


ApprovalProtocol.TestCase.settings = SETTINGS
ApprovalProtocolTwoApprovers.TestCase.settings = settings(SETTINGS, max_examples=max(1, EXAMPLES * 2 // 5))
ApprovalProtocolUnknownOutcomes.TestCase.settings = settings(SETTINGS, max_examples=EXAMPLES * 6 // 5)
ApprovalProtocolWithRaces.TestCase.settings = settings(
    SETTINGS, max_examples=max(1, EXAMPLES // 5), phases=[Phase.explicit, Phase.reuse, Phase.generate]
)
TestApprovalProtocol = ApprovalProtocol.TestCase
TestApprovalProtocolTwoApprovers = ApprovalProtocolTwoApprovers.TestCase
TestApprovalProtocolUnknownOutcomes = ApprovalProtocolUnknownOutcomes.TestCase
TestApprovalProtocolWithRaces = ApprovalProtocolWithRaces.TestCase
