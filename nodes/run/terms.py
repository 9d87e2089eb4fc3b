"""The terms a write is claimed on, and what becomes of it when they cannot be had.

Admission decides what lets a call run besides a person (a standing grant) and what its write is charged against
its policy's limits (nodes/gate/admission.py, on the plan); the ledger takes both with the claim, or none of it
(checkpoints/grants.py). A claim refused its terms never started the write, so nothing is unknown: the call goes
back to a person (a lapsed grant, a limit that asks: a `SENT_BACK` record, which her approval must follow, and an
audit row saying why, which the request shows), or is answered `limit_exceeded` (a limit that refuses).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent
from gatedloop.checkpoints.grants import ClaimRefused, ClaimTerms, OverLimit
from gatedloop.checkpoints.ledger import Audit, Evidence
from gatedloop.nodes.gate.admission import LIMIT_SENDER, SENT_BACK
from gatedloop.nodes.gate.outcomes import Outcome, error_outcome
from gatedloop.nodes.state import CallPlan
from gatedloop.tools.errors import ToolFailure

log = logging.getLogger("gatedloop.execute")

SENT_BACK_ERROR = "sent_back"
"""The `error_type` of a write task's outcome when the call went back to a person: `execute` does not answer it,
and runs nothing after it until she has decided it."""


class TermsLedger(Evidence, Audit, Protocol):
    """What a refused claim leaves: the sent-back record (evidence) and the audit row."""


def terms_of(plan: CallPlan) -> ClaimTerms:
    return ClaimTerms(tuple(plan.get("grants") or ()), tuple(plan.get("charges") or ()), bool(plan.get("past_limit")))


def claim_refused(ledger: TermsLedger, thread_id: str, plan: CallPlan, refused: ClaimRefused) -> Outcome:
    """The call's outcome when its claim was refused its terms (nothing was written by the claim)."""
    detail = {"tool": plan["name"], "reason": refused.reason, **refused.detail}
    if refused.over == "refuse":
        ledger.record(thread_id, plan["id"], "limit_refused", detail)
        return error_outcome(ToolFailure(f"Not run: {refused.reason}.", error_type="limit_exceeded"))
    sender = f"{LIMIT_SENDER}{refused.detail['limit']}" if isinstance(refused, OverLimit) else "grant:lapsed"
    record = ApprovalRecord(plan["id"], plan["name"], plan["digest"], sender, frozenset(), SENT_BACK, time.time())
    ledger.record_approvals(thread_id, [record], [AuditEvent(plan["id"], f"{SENT_BACK}:{sender}", detail)])
    log.info("write %s (call %s) goes back to a person: %s", plan["name"], plan["id"], refused.reason)
    return {"status": "error", "content": refused.reason, "error_type": SENT_BACK_ERROR, "duration_ms": 0.0}
