"""The inbox's filters and order, from the page's query string, so a filtered view is a link and needs no script.

`?tool=reserve_seat&requester=rita&thread=t-4&older=30&expiring=1&order=expiry`: every field optional. A value
that does not parse is ignored and said so on the page, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from gatedloop.inbox.pending import PendingView

EXPIRING_SOON_S = 30 * 60
"""A request "expires soon" when less than this is left before it can no longer be approved."""

ORDERS = {"oldest": "oldest first", "newest": "newest first", "expiry": "expiring first"}
UNKNOWN_REQUESTER = "unknown"


@dataclass(frozen=True)
class Filters:
    tool: str = ""
    requester: str = ""
    thread: str = ""  # part of the thread id
    older_min: int | None = None  # waited at least this many minutes
    expiring: bool = False  # only requests that expire within EXPIRING_SOON_S
    order: str = "oldest"
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Filters:
        problems: list[str] = []
        older: int | None = None
        if (text := params.get("older", "").strip()) != "":
            try:
                older = int(text)
                if older < 0:
                    raise ValueError
            except ValueError:
                problems.append(f"waited at least: {text!r} is not a whole number of minutes; ignored")
                older = None
        order = params.get("order") or "oldest"
        if order not in ORDERS:
            problems.append(f"order: {order!r} is not one of {', '.join(ORDERS)}; oldest first")
            order = "oldest"
        return cls(
            tool=params.get("tool", "").strip(),
            requester=params.get("requester", "").strip(),
            thread=params.get("thread", "").strip(),
            older_min=older,
            expiring=params.get("expiring") in ("1", "on", "true"),
            order=order,
            problems=tuple(problems),
        )

    def query(self) -> str:
        """The query string of these filters (without "?"), only the fields that are set."""
        pairs = {
            "tool": self.tool,
            "requester": self.requester,
            "thread": self.thread,
            "older": "" if self.older_min is None else str(self.older_min),
            "expiring": "1" if self.expiring else "",
            "order": "" if self.order == "oldest" else self.order,
        }
        return urlencode({k: v for k, v in pairs.items() if v})

    @property
    def active(self) -> bool:
        return replace(self, order="oldest") != Filters()

    def keeps(self, view: PendingView, now: float) -> bool:
        if self.tool and self.tool not in view.tool_names:
            return False
        if self.requester and self.requester != (view.requested_by or UNKNOWN_REQUESTER):
            return False
        if self.thread and self.thread not in view.thread_id:
            return False
        if self.older_min is not None and (view.requested_at is None or now - view.requested_at < self.older_min * 60):
            return False
        return not self.expiring or (view.expires_at is not None and view.expires_at - now < EXPIRING_SOON_S)

    def apply(self, views: list[PendingView], now: float) -> list[PendingView]:
        kept = [v for v in views if self.keeps(v, now)]
        if self.order == "newest":
            return sorted(kept, key=lambda v: v.requested_at or 0.0, reverse=True)
        if self.order == "expiry":  # those that never expire last, oldest first among them
            return sorted(kept, key=lambda v: (v.expires_at is None, v.expires_at or 0.0, v.requested_at or 0.0))
        return sorted(kept, key=lambda v: v.requested_at or 0.0)


def choices(views: list[PendingView]) -> dict[str, list[str]]:
    """The values the filter form offers: the tools and requesters of the requests the reviewer may see."""
    return {
        "tool": sorted({name for v in views for name in v.tool_names}),
        "requester": sorted({v.requested_by or UNKNOWN_REQUESTER for v in views}),
    }
