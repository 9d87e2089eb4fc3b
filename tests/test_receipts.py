"""Receipts an auditor reads (issue 50, item 6): a receipt's summary gives times in ISO-8601 UTC, the arguments as
JSON objects (secret ones masked), the requester and the decider as `{"user_id", "roles"}`, a rejection's reason
and the justification; the rows beside it stay as stored, since the chain holds their hashes. Receipts are
versioned: an export written before (version 1, tests/data/receipts_466c842.jsonl) still verifies, against its own
version's summary."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gate_app import build, effects_for

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.chain import Signer, canonical, load_verifier
from gatedloop.checkpoints.receipts import build_receipts, receipt_line, verify_lines, verify_receipt
from gatedloop.graph import runs
from gatedloop.tools import CallContext

DATA = Path(__file__).resolve().parent / "data"
ANA = {"user_id": "ana", "roles": ["staff"]}
BO = {"user_id": "bo", "roles": ["finance"]}
SUMMARY_FIELDS = {
    "request_id",
    "tool",
    "args",
    "proposed_args",
    "args_digest",
    "policy_digest",
    "requester",
    "decider",
    "at",
    "verdict",
    "message",
    "justification",
    "outcome_digest",
    "position",
    "chain_hash",
}
EDIT = {"type": "edit", "edited_action": {"name": "pay", "args": {"amount": 200.0, "to": "***"}}}
REJECT = {"type": "reject", "message": "not this month", "justification": "over the quarter's budget"}


def decided(saver: Any, thread_id: str, decision: dict[str, Any]) -> dict[str, Any]:
    """`pay` (its payee a secret argument) asked by ana and decided by bo; the request bo was shown."""
    graph = build(
        saver, effects_for(saver), approval="always", approvers=frozenset({"finance"}), secret_args=frozenset({"to"})
    )
    asked = runs.start(graph, thread_id, "pay 250 to bo-iban-4711 as c1", context=CallContext(**ANA))
    runs.resume(graph, thread_id, {"decisions": [decision]}, context=CallContext(**BO))
    return asked["__interrupt__"][0].value


def readable(summary: dict[str, Any]) -> dict[str, Any]:
    """The fields a person reads (the digests, position and chain hash are checked by `verify_receipt`)."""
    assert set(summary) == SUMMARY_FIELDS
    return {k: summary[k] for k in ("tool", "args", "proposed_args", "requester", "decider", "verdict", "message")}


def test_receipts_of_an_approve_an_edit_and_a_reject_give_times_arguments_and_people_as_an_auditor_reads_them(db):
    signer = Signer.generate()
    started = time.time()
    with open_sqlite(db) as saver:
        saver.ledger.signer = signer
        approved = decided(saver, "approved", {"type": "approve", "justification": "invoice 17"})
        decided(saver, "edited", EDIT)
        decided(saver, "rejected", REJECT)
        receipts = build_receipts(saver.ledger, signer=signer)
    lines = [receipt_line(r) for r in receipts]
    assert verify_lines(lines, signer.verifier).problems == []
    assert {r["receipt"] for r in receipts} == {2}
    assert "bo-iban-4711" not in "".join(lines)
    by = {(r["thread_id"], r["kind"]): r["summary"] for r in receipts}
    asked = {"amount": 250.0, "to": "***"}
    assert readable(by["approved", "decision"]) == {
        "tool": "pay",
        "args": asked,
        "proposed_args": None,
        "requester": ANA,
        "decider": BO,
        "verdict": "approve",
        "message": None,
    }
    assert by["approved", "decision"]["justification"] == "invoice 17"
    assert by["approved", "decision"]["request_id"] == approved["request_id"]
    assert readable(by["edited", "decision"]) == {
        "tool": "pay",
        "args": {"amount": 200.0, "to": "***"},
        "proposed_args": asked,
        "requester": ANA,
        "decider": BO,
        "verdict": "edit",
        "message": None,
    }
    assert readable(by["rejected", "decision"]) == {
        "tool": "pay",
        "args": asked,
        "proposed_args": None,
        "requester": ANA,
        "decider": BO,
        "verdict": "reject",
        "message": "not this month",
    }
    assert by["rejected", "decision"]["justification"] == "over the quarter's budget"
    assert ("rejected", "write") not in by
    write = by["edited", "write"]
    assert readable(write) == {
        "tool": "pay",
        "args": {"amount": 200.0, "to": "***"},
        "proposed_args": None,
        "requester": ANA,
        "decider": None,
        "verdict": "done",
        "message": None,
    }
    assert write["args_digest"] == by["edited", "decision"]["args_digest"] and write["outcome_digest"]
    for summary in by.values():
        at = summary["at"]
        assert len(at) == len("2026-12-06T04:02:12.123Z") and at.endswith("Z")
        assert started - 0.001 <= datetime.fromisoformat(at).timestamp() <= time.time()


def test_an_export_of_version_1_still_verifies_and_a_version_cannot_be_swapped():
    """tests/data/receipts_466c842.jsonl was exported (signed) by commit 466c842, before receipts were versioned 2:
    its summaries keep the stored forms (epoch times, the requester's id); it verifies as it did. Relabelled
    version 2, its summary is not what version 2 reads from its rows, so it fails."""
    lines = (DATA / "receipts_466c842.jsonl").read_text().splitlines()
    verifier = load_verifier(str(DATA / "receipts_466c842.pub"))
    report = verify_lines(lines, verifier)
    assert (report.receipts, report.problems) == (2, [])
    old = json.loads(lines[0])
    assert old["receipt"] == 1 and isinstance(old["summary"]["at"], float) and old["summary"]["requester"] == "ann"
    relabelled = canonical({**old, "receipt": 2})
    assert verify_receipt(relabelled, verifier) == "its summary is not what its rows say"
    assert verify_receipt(canonical({**old, "receipt": 3}), verifier) == (
        "not a receipt of a version this gatedloop reads (1, 2)"
    )
