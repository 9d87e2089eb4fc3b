"""The inbox's Stats page: reviewer telemetry for supervisors, the numbers of `gatedloop stats` (read by
checkpoints/review_stats.py from the ledger's evidence; nothing is computed twice)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gatedloop.checkpoints.review_stats import (
    RUBBER_STAMP_MAX_MEDIAN_S,
    RUBBER_STAMP_MIN_APPROVAL_RATE,
    RUBBER_STAMP_MIN_DECISIONS,
    SINCE_FORMS,
    ReviewHistory,
    reviewer_stats,
    since_moment,
    tool_stats,
)

WINDOWS = {
    "": "everything",
    "1h": "the last hour",
    "24h": "the last 24 hours",
    "7d": "the last 7 days",
    "30d": "the last 30 days",
}
"""The Stats page's quick choices of `since`; any of `SINCE_FORMS` may be typed instead."""
FLAG_WORDS = (
    f"rubber stamp? ({RUBBER_STAMP_MIN_DECISIONS}+ decisions, at least {RUBBER_STAMP_MIN_APPROVAL_RATE:.0%} approved"
    f" as shown, median under {RUBBER_STAMP_MAX_MEDIAN_S:g} s)"
)


@runtime_checkable
class ReviewHistories(Protocol):
    """A ledger that reads its review history (gatedloop's SQLite and Postgres ledgers)."""

    def review_history(self, since: float | None = None) -> ReviewHistory: ...


def stats_context(ledger: ReviewHistories, since_text: str, now: float) -> dict[str, Any]:
    """What the Stats page shows for `since_text` (empty: every request); `ValueError` naming the forms `since`
    takes."""
    try:
        since = since_moment(since_text, now) if since_text.strip() else None
    except ValueError:
        raise ValueError(f"since {since_text!r}: expected {SINCE_FORMS}") from None
    history = ledger.review_history(since)
    return {
        "since": since,
        "since_text": since_text.strip(),
        "tools": tool_stats(history),
        "reviewers": reviewer_stats(history),
        "windows": WINDOWS,
        "flag_words": FLAG_WORDS,
    }
