"""A turn's evidence, read once per run of a node, and every call of the turn admitted from it.

Two nodes admit, and for different reasons, so a call is admitted up to three times:

- `approve`, on each of its runs: when it builds the request, and again when the answer comes back (the node runs
  again from the start then). The state may have been written between the two (`update_state`, a forged verdict),
  and the request it rebuilds must be exactly the one that was answered, so it is rebuilt from the evidence.
- `execute`, once more before anything runs: the state between `approve` and `execute` is just as untrusted, and
  the approvals recorded since may now let a call run (or its policy no longer accept them).

Each run reads the ledger once for the whole turn (`TurnEvidence.read`); `TurnEvidence.admit` is then a pure
function of that evidence, the registry and the plan (nodes/gate/admission.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.messages import ToolMessage

from gatedloop.checkpoints.evidence import ApprovalRecord, CallRecord
from gatedloop.checkpoints.ledger import Audit, Evidence
from gatedloop.nodes.gate.admission import Admission, admit, audit_refusal, edited_ids
from gatedloop.nodes.gate.answers import error_message
from gatedloop.nodes.state import CallPlan, Verdict
from gatedloop.tools.registry import ToolRegistry

log = logging.getLogger("gatedloop.gate")


class AdmissionLedger(Evidence, Audit, Protocol):
    """What admitting a turn touches: the evidence it reads, and the audit trail a refusal worth noting goes to."""


@dataclass(frozen=True)
class TurnEvidence:
    """The recorded facts about a turn's calls of one verdict: their registrations, every reviewer's decision on
    them, and the latest recorded edit of each edited call."""

    records: Mapping[str, CallRecord]
    approvals: Sequence[ApprovalRecord]
    edited_args: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def read(cls, ledger: Evidence, thread_id: str, calls: Sequence[CallPlan], verdict: Verdict) -> TurnEvidence:
        ids = [c["id"] for c in calls if c["verdict"] == verdict]
        edited = ledger.edited_args(thread_id, edited_ids(calls))
        return cls(ledger.calls(thread_id, ids), ledger.approvals(thread_id, ids), edited)

    def admit(self, registry: ToolRegistry, plan: CallPlan) -> Admission:
        return admit(registry, plan, self.records.get(plan["id"]), self.approvals, self.edited_args)

    def approvals_of(self, call_id: str) -> list[ApprovalRecord]:
        return [a for a in self.approvals if a.call_id == call_id]


@dataclass(frozen=True)
class AdmittedTurn:
    """The turn's calls in the model's order, each with its admission (None: not of the verdict admitted), the
    refused calls' answers, and the evidence they were admitted from."""

    evidence: TurnEvidence
    admissions: list[tuple[CallPlan, Admission | None]]
    refused: list[ToolMessage]


def admit_turn(
    registry: ToolRegistry, ledger: AdmissionLedger, thread_id: str, calls: Sequence[CallPlan], verdict: Verdict
) -> AdmittedTurn:
    """Admit every call the state gives `verdict`; a refused one (tampered, never validated, its tool changed
    since) is answered now and, where an operator should know, audited."""
    evidence = TurnEvidence.read(ledger, thread_id, calls, verdict)
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
