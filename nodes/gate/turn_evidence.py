"""A turn's evidence, read once per run of a node, and every call of the turn admitted from it.

Two nodes admit, and for different reasons, so a call is admitted up to three times:

- `approve`, on each of its runs: when it builds the request, and again when the answer comes back (the node runs
  again from the start then). The state may have been written between the two (`update_state`, a forged verdict),
  and the request it rebuilds must be exactly the one that was answered, so it is rebuilt from the evidence.
- `execute`, once more before anything runs: the state between `approve` and `execute` is just as untrusted, and
  the approvals recorded since may now let a call run (or its policy no longer accept them).

Each run reads the ledger once for the whole turn (`TurnEvidence.read`); `TurnEvidence.admit` is then a pure
function of that evidence, the registry and the plan (nodes/gate/admission.py). `execute` also reads the open
standing grants of the turn's grantable tools (a grant lets a call run; `approve` asks a person, who needs none).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.messages import ToolMessage

from gatedloop.checkpoints.evidence import ApprovalRecord, CallRecord
from gatedloop.checkpoints.grants import Grant
from gatedloop.checkpoints.ledger import Audit, Evidence, Grants
from gatedloop.nodes.gate.admission import SENT_BACK, Admission, admit, audit_refusal, edited_ids
from gatedloop.nodes.gate.answers import error_message
from gatedloop.nodes.state import CallPlan, Verdict
from gatedloop.tools.registry import ToolRegistry

log = logging.getLogger("gatedloop.gate")


class AdmissionLedger(Evidence, Audit, Grants, Protocol):
    """What admitting a turn touches: the evidence and grants it reads, and the audit trail a refusal worth noting
    goes to."""


@dataclass(frozen=True)
class TurnEvidence:
    """The recorded facts about a turn's calls of one verdict: their registrations, every reviewer's decision on
    them, the latest recorded edit of each edited call, the grants open at `now` of `grant_tools` and the grant uses
    the calls' claims already took, and why each call sent back to a person was (`SENT_BACK`: the audit row's
    reason, for the request)."""

    records: Mapping[str, CallRecord]
    approvals: Sequence[ApprovalRecord]
    edited_args: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    grants: Sequence[Grant] = ()
    now: float = 0.0
    sent_back: Mapping[str, str] = field(default_factory=dict)
    grant_uses: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        ledger: AdmissionLedger,
        thread_id: str,
        calls: Sequence[CallPlan],
        verdict: Verdict,
        grant_tools: Sequence[str] = (),
    ) -> TurnEvidence:
        ids = [c["id"] for c in calls if c["verdict"] == verdict]
        edited = ledger.edited_args(thread_id, edited_ids(calls))
        approvals = ledger.approvals(thread_id, ids)
        grants, now = open_grants(ledger, grant_tools)
        sent_back = _sent_back(ledger, thread_id, approvals)
        uses = ledger.grant_uses(thread_id, ids) if grant_tools else {}
        return cls(ledger.calls(thread_id, ids), approvals, edited, grants, now, sent_back, uses)

    def admit(self, registry: ToolRegistry, plan: CallPlan) -> Admission:
        record, used = self.records.get(plan["id"]), self.grant_uses.get(plan["id"])
        return admit(registry, plan, record, self.approvals, self.edited_args, self.grants, self.now, used)

    def approvals_of(self, call_id: str) -> list[ApprovalRecord]:
        return [a for a in self.approvals if a.call_id == call_id]


@dataclass(frozen=True)
class AdmittedTurn:
    """The turn's calls in the model's order, each with its admission (None: not of the verdict admitted), the
    refused calls' answers, and the evidence they were admitted from."""

    evidence: TurnEvidence
    admissions: list[tuple[CallPlan, Admission | None]]
    refused: list[ToolMessage]


def _sent_back(ledger: Audit, thread_id: str, approvals: Sequence[ApprovalRecord]) -> dict[str, str]:
    """call id -> why it was sent back to a person (its latest `sent_back:*` audit row); the trail is read only for
    a turn that has such a call."""
    if not any(a.decision == SENT_BACK for a in approvals):
        return {}
    return {
        row["call_id"]: str(row["detail"].get("reason", ""))
        for row in ledger.audit(thread_id)
        if str(row["event"]).startswith(SENT_BACK)
    }


def open_grants(ledger: Grants, tools: Sequence[str]) -> tuple[list[Grant], float]:
    """The grants of `tools` open now (not revoked, expired or used up), and now: wall-clock time, as the claim
    checks a grant's expiry by it. Nothing is read when no tool opts in to grants."""
    now = time.time()
    return (ledger.grants(tools, open_at=now) if tools else []), now


def grantable_tools(registry: ToolRegistry, calls: Sequence[CallPlan]) -> list[str]:
    """The tools of `calls` whose policy opts in to grants: only a turn with one reads the grants."""
    names = {c["name"] for c in calls if c["name"] in registry}
    return sorted(name for name in names if registry.policy(name).grantable)


def admit_turn(
    registry: ToolRegistry, ledger: AdmissionLedger, thread_id: str, calls: Sequence[CallPlan], verdict: Verdict
) -> AdmittedTurn:
    """Admit every call the state gives `verdict`; a refused one (tampered, never validated, its tool changed
    since) is answered now and, where an operator should know, audited."""
    # Only `execute` (the calls it would run) weighs grants; `approve` asks a person, whom no grant replaces.
    granted = grantable_tools(registry, [c for c in calls if c["verdict"] == "run"]) if verdict == "run" else []
    evidence = TurnEvidence.read(ledger, thread_id, calls, verdict, granted)
    admissions: list[tuple[CallPlan, Admission | None]] = []
    refused: list[ToolMessage] = []
    for plan in calls:
        admission = evidence.admit(registry, plan) if plan["verdict"] == verdict else None
        if admission is not None and admission.refusal is not None:
            log.warning("not running call %s (%s): %s", plan["id"], plan["name"], admission.refusal.message)
            audit_refusal(ledger, thread_id, plan, admission.refusal, registry)
            refused.append(error_message(plan["id"], plan["name"], admission.refusal))
        admissions.append((plan, admission))
    return AdmittedTurn(evidence, admissions, refused)
