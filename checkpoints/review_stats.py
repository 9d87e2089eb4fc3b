"""Reviewer telemetry (`gatedloop stats`): how approval requests fared, per tool and per reviewer, read from the
ledger's evidence alone.

A gated call is a request (`gatedloop_calls` with verdict `ask`, timed from its registration); each reviewer's
decision on it is an approval record (`gatedloop_approvals`, the rows the `decision` audit events describe, in the
same transaction); a call nobody decided in time has the audit event `approval_expired`. Extensions (`extend`) are
not decisions. Everything is counted for the calls made since a moment, so a window shows what became of them.

Standing grants and limits (docs/grants.md) put some calls to a person differently, and each is counted once, as
what it is:

- a call a grant approved (`gatedloop_grant_uses`) is `granted`: never asked, no reviewer's decision;
- a call sent back to a person (the `sent_back` record: a limit that asks, or a grant that lapsed before the write's
  claim) counts in `sent_back` each time; it is asked once however often it comes back (a call that was not gated,
  whose grant lapsed or that a limit sent back, is asked from then on), and a decision on it is timed from the
  moment it was last put to a person, not from its first request;
- a decision stays its reviewer's even when nothing ran after it (a limit sent the call back, or refused it:
  `limit_refused`): the approval rate is about what people decided, and these columns say what the gate did next.

A reviewer is flagged as a possible rubber stamp when she approved nearly everything she was asked, fast, often
enough for it to mean something (`RUBBER_STAMP_*`): an edit, a rejection or a response counts against the flag,
since each shows that she read the call. The flag is a prompt to look, not a verdict.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

RUBBER_STAMP_MIN_DECISIONS = 20
"""Fewer decisions than this say nothing about a reviewer's habits."""
RUBBER_STAMP_MIN_APPROVAL_RATE = 0.95
"""The share of plain approvals (not edits) at or above which approving looks automatic."""
RUBBER_STAMP_MAX_MEDIAN_S = 5.0
"""A median time to decision under this many seconds is too short to have read the call."""

DECISION_KINDS = ("approve", "edit", "reject", "respond")

DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SINCE_FORMS = "a duration back from now (90m, 24h, 7d), an ISO 8601 time (2026-01-31T12:00Z) or epoch seconds"

SENT_BACK = "sent_back"
"""The decision of the gate's own record of a call it sent back to a person (nodes/gate/admission.py); no reviewer's."""
GRANT_USES = "gatedloop_grant_uses"

ASKED_SQL = (
    "SELECT c.thread_id, c.call_id, c.tool FROM gatedloop_calls c WHERE c.requested_at >= ? AND (c.verdict = 'ask'"
    " OR EXISTS (SELECT 1 FROM gatedloop_approvals s"
    " WHERE s.thread_id = c.thread_id AND s.call_id = c.call_id AND s.decision = ?))"
)
# Timed from the request, or from the call's latest send-back before the decision.
DECIDED_SQL = (
    "SELECT a.thread_id, a.call_id, a.tool, a.reviewer, a.decision, a.at - COALESCE((SELECT MAX(s.at)"
    " FROM gatedloop_approvals s WHERE s.thread_id = a.thread_id AND s.call_id = a.call_id AND s.decision = ?"
    " AND s.seq < a.seq), c.requested_at)"
    " FROM gatedloop_approvals a JOIN gatedloop_calls c ON c.thread_id = a.thread_id AND c.call_id = a.call_id"
    " WHERE c.requested_at >= ? AND a.decision IN (?, ?, ?, ?) ORDER BY a.seq"
)
SENT_BACK_SQL = (
    "SELECT c.thread_id, c.call_id, c.tool FROM gatedloop_approvals a"
    " JOIN gatedloop_calls c ON c.thread_id = a.thread_id AND c.call_id = a.call_id"
    " WHERE a.decision = ? AND c.requested_at >= ?"
)
GRANTED_SQL = (
    f"SELECT c.thread_id, c.call_id, c.tool FROM {GRANT_USES} u"
    " JOIN gatedloop_calls c ON c.thread_id = u.thread_id AND c.call_id = u.call_id WHERE c.requested_at >= ?"
)


def _audited(event: str) -> str:
    return (
        "SELECT c.thread_id, c.call_id, c.tool FROM gatedloop_audit e"
        " JOIN gatedloop_calls c ON c.thread_id = e.thread_id AND c.call_id = e.call_id"
        f" WHERE e.event = '{event}' AND c.requested_at >= ?"
    )


EXPIRED_SQL = _audited("approval_expired")
LIMIT_REFUSED_SQL = _audited("limit_refused")

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Decided:
    """One reviewer's decision on one request, and how long after the request it came."""

    thread_id: str
    call_id: str
    tool: str
    reviewer: str
    decision: str
    waited_s: float


Call = tuple[str, str, str]
"""thread, call id, tool."""


@dataclass(frozen=True)
class ReviewHistory:
    """The calls put to a person since `since`, their decisions, those that expired; and what the gate did besides:
    the send-backs (one per time), the calls a grant approved, the calls a limit refused."""

    since: float | None
    asked: list[Call]
    decided: list[Decided]
    expired: list[Call]
    sent_back: list[Call] = field(default_factory=list)
    granted: list[Call] = field(default_factory=list)
    limit_refused: list[Call] = field(default_factory=list)


def since_moment(text: str, now: float) -> float:
    """The start of a window as `gatedloop stats --since` and the inbox's Stats page take it (`SINCE_FORMS`); an
    ISO time without a zone is UTC. `ValueError` naming the forms for anything else."""
    text = text.strip()
    found = DURATION.fullmatch(text)
    if found:
        return now - float(found.group(1)) * UNIT_S[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected {SINCE_FORMS}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def review_history(run: Query, since: float | None = None) -> ReviewHistory:
    """Six reads over a ledger's `run(query, params)` (either backend: `?` placeholders)."""
    start = since if since is not None else 0.0

    def calls(query: str, *params: Any) -> list[Call]:
        return [(str(t), str(c), str(tool)) for t, c, tool in run(query, params)]

    decided = [
        Decided(str(t), str(c), str(tool), str(who), str(kind), max(0.0, float(waited)))
        for t, c, tool, who, kind, waited in run(DECIDED_SQL, (SENT_BACK, start, *DECISION_KINDS))
    ]
    return ReviewHistory(
        since,
        asked=calls(ASKED_SQL, start, SENT_BACK),
        decided=decided,
        expired=calls(EXPIRED_SQL, start),
        sent_back=calls(SENT_BACK_SQL, SENT_BACK, start),
        granted=calls(GRANTED_SQL, start),
        limit_refused=calls(LIMIT_REFUSED_SQL, start),
    )


def p90(values: Sequence[float]) -> float:
    """The 90th percentile by nearest rank: a time some decision actually took, never an interpolation."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def decision_summary(decided: Sequence[Decided]) -> dict[str, Any]:
    """Counts per kind, the approval rate (plain approvals over decisions) and the median and p90 wait."""
    waits = [d.waited_s for d in decided]
    kinds = {kind: sum(d.decision == kind for d in decided) for kind in DECISION_KINDS}
    return {
        "decisions": len(decided),
        "approved": kinds["approve"],
        "edited": kinds["edit"],
        "rejected": kinds["reject"],
        "responded": kinds["respond"],
        "approval_rate": round(kinds["approve"] / len(decided), 4) if decided else None,
        "median_s": round(statistics.median(waits), 3) if waits else None,
        "p90_s": round(p90(waits), 3) if waits else None,
    }


def rubber_stamp(summary: dict[str, Any]) -> bool:
    return (
        summary["decisions"] >= RUBBER_STAMP_MIN_DECISIONS
        and summary["approval_rate"] >= RUBBER_STAMP_MIN_APPROVAL_RATE
        and summary["median_s"] < RUBBER_STAMP_MAX_MEDIAN_S
    )


def _grouped(items: Iterable[Any], key: Callable[[Any], str]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def tool_stats(history: ReviewHistory) -> list[dict[str, Any]]:
    """Per tool: calls asked, calls decided (by at least one reviewer), the decisions on them, expired; sent back
    (times), granted and refused by a limit (calls)."""
    asked = _grouped(history.asked, lambda row: row[2])
    decided = _grouped(history.decided, lambda d: d.tool)
    others = {
        name: _grouped(rows, lambda row: row[2])
        for name, rows in (
            ("expired", history.expired),
            ("sent_back", history.sent_back),
            ("granted", history.granted),
            ("limit_refused", history.limit_refused),
        )
    }
    rows = []
    for tool in sorted({*asked, *decided, *(t for groups in others.values() for t in groups)}):
        calls = {(d.thread_id, d.call_id) for d in decided.get(tool, [])}
        rows.append(
            {
                "tool": tool,
                "asked": len(asked.get(tool, [])),
                "decided": len(calls),
                **decision_summary(decided.get(tool, [])),
                **{name: len(groups.get(tool, [])) for name, groups in others.items()},
            }
        )
    return rows


def reviewer_stats(history: ReviewHistory) -> list[dict[str, Any]]:
    """Per reviewer: her decisions, the tools she decided, and the rubber-stamp flag."""
    rows = []
    for reviewer, decided in sorted(_grouped(history.decided, lambda d: d.reviewer).items()):
        summary = decision_summary(decided)
        tools = sorted({d.tool for d in decided})
        rows.append({"reviewer": reviewer, **summary, "tools": tools, "rubber_stamp": rubber_stamp(summary)})
    return rows


def thresholds() -> dict[str, float]:
    """The rubber-stamp rule, as `--json` reports it beside the flags."""
    return {
        "min_decisions": RUBBER_STAMP_MIN_DECISIONS,
        "min_approval_rate": RUBBER_STAMP_MIN_APPROVAL_RATE,
        "max_median_s": RUBBER_STAMP_MAX_MEDIAN_S,
    }
