"""Receipts: one JSON line per decision and per executed write, checkable without the database.

A receipt carries its summary (request id, tool, arguments and their digest, policy digest, requester, decider or
"policy", time, verdict, the reason of a rejection or refusal, justification, outcome digest, chain position and
hash), the evidence rows the summary is read from (values a receipt may show; a tool's result and a secret edit only
as hashes), and the chain segment from its first row to the signed head that covers it. `verify_receipt` recomputes
every content hash, every chain hash and the summary from the rows, and checks the head's signature with the public
key: any byte changed in a line makes it fail (a line must also be the canonical JSON of what it says, so not even
spacing can change).

Only rows whose chain entry matches them are put in a receipt (a row from before the chain began is left out, and
the summary says nothing it does not prove). Every field of a receipt is derived from its rows and its chain
segment, so none can be changed without `verify_receipt` noticing.

The rows are shown as they are stored, since their hashes are what the chain holds: epoch times, JSON text inside
columns. The summary is where an auditor reads them (version 2: ISO-8601 UTC times, arguments as objects, who as
`{"user_id", "roles"}`); an export of version 1, whose summary repeats the stored forms, still verifies against the
summary of its own version. A write a standing grant approved carries the grant's use row, and its summary the
grant's id (`grant`; absent from every other receipt, so those of earlier exports read the same).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gatedloop.checkpoints.chain import (
    CHAINED,
    ChainEntry,
    Report,
    Signer,
    Verifier,
    canonical,
    check_links,
    content_hash,
    content_hash_of,
    row_key,
    withheld_hash,
)

RECEIPT_VERSION = 2
"""The version `build_receipts` writes; `SUMMARIES` holds every version `verify_receipt` reads."""
DECISION_PREFIXES = ("decision", "refused", "unknown_outcome_decision", "graph_upgraded")
"""Audit events a decision receipt is made for (an approval, edit, rejection or response; a policy's refusal at
validation; the answer about a write of unknown outcome; an operator's upgrade)."""


class ChainSource(Protocol):
    def chain(self, since_seq: int = 0) -> list[ChainEntry]: ...
    def chained_rows(self, table: str) -> list[dict[str, Any]]: ...
    def sign_head(self) -> int: ...


@dataclass
class _Rows:
    """The chained evidence as it is now: each row with its latest chain entry (only rows that match it)."""

    entries: list[ChainEntry]
    rows: dict[str, list[tuple[dict[str, Any], ChainEntry | None]]] = field(default_factory=dict)

    @classmethod
    def read(cls, source: ChainSource) -> _Rows:
        entries = source.chain()
        latest = {(e.table, e.key): e for e in entries[1:]}
        found = cls(entries)
        for table in CHAINED:
            listed = []
            for row in source.chained_rows(table):
                entry = latest.get((table, row_key(table, row)))
                matches = entry is not None and entry.content_hash == content_hash(table, row)
                listed.append((row, entry if matches else None))
            found.rows[table] = listed
        return found

    def find(self, table: str, **match: Any) -> list[tuple[dict[str, Any], ChainEntry | None]]:
        return [(r, e) for r, e in self.rows[table] if all(r[k] == v for k, v in match.items())]


def _is_decision(event: str) -> bool:
    return event.split(":", 1)[0] in DECISION_PREFIXES


def _shown(table: str, row: Mapping[str, Any], entry: ChainEntry) -> dict[str, Any]:
    withheld = CHAINED[table].withheld
    return {
        "seq": entry.seq,
        "table": table,
        "values": {k: v for k, v in row.items() if k not in withheld},
        "withheld": {k: withheld_hash(v) for k, v in row.items() if k in withheld},
    }


def summarize_v1(kind: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a receipt says, read only from its rows (as shown: values, or hashes of withheld ones), in the stored
    forms: version 1's summary, which version 2's builds on and which exports of version 1 are checked against."""
    by_table = _first_shown(rows)
    audit = by_table.get("gatedloop_audit", {}).get("values", {})
    calls = by_table.get("gatedloop_calls", {}).get("values", {})
    approval = by_table.get("gatedloop_approvals", {}).get("values", {})
    ledger = by_table.get("gatedloop_ledger", {})
    policies_row = by_table.get("gatedloop_thread_policies", {})
    policies = policies_row.get("values", {})
    detail = json.loads(audit["detail"]) if audit.get("detail") else {}
    requester = json.loads(calls["requester"]).get("user_id") if calls.get("requester") else None
    event = str(audit.get("event") or "")
    anchor = by_table.get("gatedloop_audit" if kind == "decision" else "gatedloop_ledger", {})
    # the thread's policies as recorded before this row (an upgrade since replaced them: their digest is unknown)
    in_force = policies.get("policy_digest") if policies_row.get("seq", 1 << 62) < (anchor.get("seq") or 0) else None
    summary: dict[str, Any] = {
        "request_id": detail.get("request_id"),
        "tool": calls.get("tool") or approval.get("tool") or ledger.get("values", {}).get("tool") or detail.get("tool"),
        "args_digest": approval.get("args_digest")
        or ledger.get("values", {}).get("args_digest")
        or calls.get("args_digest"),
        "policy_digest": in_force,
        "requester": requester,
        "position": anchor.get("seq"),
    }
    if kind == "decision":
        summary.update(
            decider="policy" if event.split(":", 1)[0] == "refused" else audit.get("actor"),
            at=audit.get("at"),
            verdict=detail.get("decision") or event.split(":", 1)[0],
            justification=detail.get("justification"),
            outcome_digest=None,
        )
    else:
        values = ledger.get("values", {})
        summary.update(
            decider=None,
            at=values.get("finished_at"),
            verdict=values.get("state"),
            justification=None,
            outcome_digest=ledger.get("withheld", {}).get("result"),
        )
    return summary


def summarize(kind: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Version 2: version 1's facts in the forms an auditor reads: the time in ISO-8601 UTC, the arguments (as
    decided, an edit's proposal beside them; secret ones masked, as the audit row keeps them) as objects, the
    requester and the decider as `{"user_id", "roles"}` (roles null where the row did not record them), and what the
    model was told instead of a result (a rejection's reason, a policy's refusal)."""
    summary = summarize_v1(kind, rows)
    by_table = _first_shown(rows)
    detail = _object(by_table.get("gatedloop_audit", {}).get("values", {}).get("detail"))
    requester = _object(by_table.get("gatedloop_calls", {}).get("values", {}).get("requester"))
    decided = kind == "decision" and summary["decider"] != "policy"
    summary.update(
        at=iso_utc(summary["at"]),
        args=detail.get("args"),
        proposed_args=detail.get("proposed") if detail.get("decision") == "edit" else None,
        requester=_who(requester.get("user_id"), requester.get("roles")) if requester else None,
        decider=_who(summary["decider"], detail.get("roles")) if decided else summary["decider"],
        message=(detail.get("message") or detail.get("error")) if kind == "decision" else None,
    )
    granted = by_table.get("gatedloop_grant_uses", {}).get("values", {}).get("grant_id")
    if granted is not None:
        summary["grant"] = granted
    return summary


SUMMARIES = {1: summarize_v1, 2: summarize}


def iso_utc(epoch: float | None) -> str | None:
    """A stored epoch time as an auditor reads it, to the millisecond: "2026-12-06T04:02:12.123Z"."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _first_shown(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each table's first row shown (for the anchor's own table: the anchor)."""
    by_table: dict[str, Mapping[str, Any]] = {}
    for shown in rows:
        by_table.setdefault(str(shown["table"]), shown)
    return by_table


def _object(text: Any) -> dict[str, Any]:
    """A JSON column's object ({} for none)."""
    return dict(json.loads(text)) if text else {}


def _who(user_id: Any, roles: Any) -> dict[str, Any]:
    return {"user_id": user_id, "roles": sorted(roles) if roles is not None else None}


def _segment(entries: list[ChainEntry], first: int, last: int) -> list[ChainEntry]:
    """Entries from `first` to the first signed one at or after `last` (the head, if none is signed)."""
    end = last
    for entry in entries[last - 1 :]:
        end = entry.seq
        if entry.signature is not None:
            break
    return entries[first - 1 : end]


def build_receipts(
    source: ChainSource, *, thread: str | None = None, since: float | None = None, signer: Signer | None = None
) -> list[dict[str, Any]]:
    """Every decision's and executed write's receipt (of `thread`, at or after `since`), the head signed first
    when a key is given so that every receipt is covered by a signature."""
    if signer is not None:
        source.sign_head()
    found = _Rows.read(source)
    anchors: list[tuple[str, str, dict[str, Any], ChainEntry]] = []
    for row, entry in found.rows["gatedloop_audit"]:
        if entry is not None and _is_decision(str(row["event"])):
            anchors.append(("decision", "gatedloop_audit", row, entry))
    for row, entry in found.rows["gatedloop_ledger"]:
        if entry is not None and row["state"] != "claimed":
            anchors.append(("write", "gatedloop_ledger", row, entry))
    anchors.sort(key=lambda anchor: anchor[3].seq)
    receipts = []
    for kind, table, row, entry in anchors:
        when = row["at"] if kind == "decision" else row["finished_at"]
        if (thread is not None and row["thread_id"] != thread) or (since is not None and (when or 0) < since):
            continue
        receipts.append(_receipt(found, kind, table, row, entry))
    return receipts


def _receipt(found: _Rows, kind: str, table: str, row: dict[str, Any], entry: ChainEntry) -> dict[str, Any]:
    thread_id, call_id = row["thread_id"], row["call_id"]
    support: list[tuple[str, list[tuple[dict[str, Any], ChainEntry | None]]]] = [
        ("gatedloop_calls", found.find("gatedloop_calls", thread_id=thread_id, call_id=call_id)),
        ("gatedloop_thread_policies", found.find("gatedloop_thread_policies", thread_id=thread_id)),
    ]
    if kind == "decision":
        detail = json.loads(row["detail"])
        approvals = found.find("gatedloop_approvals", thread_id=thread_id, call_id=call_id, reviewer=row["actor"])
        approvals = [a for a in approvals if a[0]["decision"] == detail.get("decision")]
        # the one recorded with this audit row (its chain entry follows the row's): a reviewer may decide a call
        # again in a later round (checkpoints/approval_rounds.py)
        recorded_with = [a for a in approvals if a[1] is not None and a[1].seq > entry.seq][:1]
        support.append(("gatedloop_approvals", recorded_with or approvals[-1:]))
    else:
        support.append(
            ("gatedloop_audit", found.find("gatedloop_audit", thread_id=thread_id, call_id=call_id, event="executed"))
        )
        support.append(
            ("gatedloop_grant_uses", found.find("gatedloop_grant_uses", thread_id=thread_id, call_id=call_id))
        )
    shown = [_shown(table, row, entry)]
    for name, matches in support:
        for support_row, support_entry in matches[-1:]:
            if support_entry is not None:  # a row from before the chain began proves nothing: left out
                shown.append(_shown(name, support_row, support_entry))
    seqs = [s["seq"] for s in shown]
    segment = _segment(found.entries, min(seqs), max(seqs))
    return {
        "receipt": RECEIPT_VERSION,
        "kind": kind,
        "thread_id": thread_id,
        "call_id": call_id,
        "summary": {**summarize(kind, shown), "chain_hash": entry.chain_hash},
        "rows": shown,
        "chain": [e.as_json() for e in segment],
        "signed": segment[-1].signature is not None,
    }


def receipt_line(receipt: Mapping[str, Any]) -> str:
    return canonical(receipt)


# --- offline verification ------------------------------------------------------------------------------------


def verify_receipt(line: str, verifier: Verifier | None) -> str | None:
    """None if the receipt holds (with a key: its head is signed by that key); else what does not."""
    text = line.rstrip("\n")
    try:
        receipt = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(receipt, dict) or receipt.get("receipt") not in SUMMARIES:
        return f"not a receipt of a version this gatedloop reads ({', '.join(map(str, SUMMARIES))})"
    try:
        if canonical(receipt) != text:
            return "not in canonical form: the line was changed"
        return _check(receipt, verifier)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return f"malformed ({type(exc).__name__}: {exc})"


RECEIPT_FIELDS = {"receipt", "kind", "thread_id", "call_id", "summary", "rows", "chain", "signed"}
ANCHORS = {"decision": "gatedloop_audit", "write": "gatedloop_ledger"}


def _check(receipt: dict[str, Any], verifier: Verifier | None) -> str | None:
    chain = [ChainEntry.from_json(e) for e in receipt["chain"]]
    if not chain:
        return "no chain segment"
    if set(receipt) != RECEIPT_FIELDS:
        return "its fields are not a receipt's"
    anchor_row = receipt["rows"][0]
    if ANCHORS.get(receipt["kind"]) != anchor_row["table"]:
        return f"a {receipt['kind']!r} receipt must start with its {ANCHORS.get(receipt['kind'], '?')} row"
    for shown in receipt["rows"]:
        if set(shown) != {"seq", "table", "values", "withheld"}:
            return "a row shown has the wrong fields"
        values = shown["values"]
        if (
            values.get("thread_id") != receipt["thread_id"]
            or values.get("call_id", receipt["call_id"]) != (receipt["call_id"])
        ):
            return f"row {shown['seq']} ({shown['table']}) is not of this receipt's thread and call"
    links = Report()
    if check_links(chain, verifier, links, first=chain[0].seq) is not None:
        return links.problems[0]
    by_seq = {e.seq: e for e in chain}
    for shown in receipt["rows"]:
        table, values, withheld = shown["table"], shown["values"], shown["withheld"]
        spec = CHAINED[table]
        shown_columns, required = set(values) | set(withheld), set(spec.columns) - set(spec.added)
        # a receipt made before a column was added shows its rows without it (`ChainedTable.added`)
        if not required <= shown_columns <= set(spec.columns) or set(withheld) - set(spec.withheld):
            return f"row {shown['seq']} ({table}): its columns are not that table's"
        entry = by_seq.get(shown["seq"])
        if entry is None or entry.table != table:
            return f"row {shown['seq']} ({table}): not in the receipt's chain segment"
        if content_hash_of(table, values, withheld) != entry.content_hash or row_key(table, values) != entry.key:
            return f"{entry.where()}: the row shown does not match its chained hash"
    summary = dict(receipt["summary"])
    anchor = by_seq.get(int(summary.get("position") or 0))
    if anchor is None or summary.pop("chain_hash") != anchor.chain_hash:
        return "its chain position or hash is not the chain's"
    if summary != SUMMARIES[receipt["receipt"]](receipt["kind"], receipt["rows"]):
        return "its summary is not what its rows say"
    head = chain[-1]
    if receipt["signed"] != (head.signature is not None):
        return "its 'signed' flag is not the head's"
    if verifier is not None and head.signature is None:
        return f"{head.where()}: the head that covers it is not signed"
    return None


@dataclass
class FileReport:
    receipts: int = 0
    unsigned: int = 0
    problems: list[str] = field(default_factory=list)


def verify_lines(lines: Iterable[str], verifier: Verifier | None) -> FileReport:
    """Every receipt of an export; a problem names its line, thread and call."""
    report = FileReport()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        report.receipts += 1
        wrong = verify_receipt(line, verifier)
        if wrong is not None:
            where = _where(line)
            report.problems.append(f"line {number}{where}: {wrong}")
        elif '"signed":false' in line:
            report.unsigned += 1
    return report


def _where(line: str) -> str:
    try:
        body = json.loads(line)
        return f" (thread {body['thread_id']}, call {body['call_id']}, {body['kind']})"
    except (ValueError, KeyError, TypeError):
        return ""
