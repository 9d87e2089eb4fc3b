"""A limit across threads: how much of a tool every thread and process on one database may use in a window.

A policy's `limits` bound what its writes do together (at most 500 refunded per tenant per day, at most 20 emails
per requester per hour), which no per-request budget can: each limit is charged in the ledger in the transaction
that claims the write (checkpoints/grants.py), so concurrent workers cannot overshoot it between a check and a use.
Windows are fixed, aligned to the epoch in UTC (a day is a UTC day), so a window's counter is one row that one
conditional upsert both checks and charges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

OverLimit = Literal["ask", "refuse"]
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
PER_FORMS = ("requester", "context:FIELD", "arg:NAME")


@dataclass(frozen=True)
class UsageLimit:
    """At most `at_most` per `window_s` seconds of a tool's writes, across every thread on the database.

    - `sums`: the argument whose value is summed (a number); None counts calls.
    - `per`: what the counter is kept per: None (every call of the tool together), `"requester"` (each requester's
      own), `"context:FIELD"` (a field of the requester's context, e.g. `context:tenant`; calls without it share
      one counter), or `"arg:NAME"` (each value of an argument, e.g. `arg:to`).
    - `over`: a write that would go past the limit goes back to a person (`"ask"`: the request says which limit and
      by how much, and her approval lets it go past), or is answered `limit_exceeded` and never runs (`"refuse"`).
    - `name`: how requests and `gatedloop limits` name it, and the counter's key (default: described from the
      fields above, so changing `at_most` keeps the window's counter).
    """

    at_most: float
    window_s: float = DAY
    sums: str | None = None
    per: str | None = None
    over: OverLimit = "ask"
    name: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("at_most", "window_s"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"UsageLimit.{field_name} must be a positive number, not {value!r}")
        if self.over not in ("ask", "refuse"):
            raise ValueError(f"UsageLimit.over must be 'ask' or 'refuse', not {self.over!r}")
        if self.per is not None and self.per != "requester":
            kind, _, name = self.per.partition(":")
            if kind not in ("context", "arg") or not name:
                raise ValueError(f"UsageLimit.per must be None or one of {PER_FORMS}, not {self.per!r}")
        if self.sums is not None and not self.sums:
            raise ValueError("UsageLimit.sums must name an argument (or be None: count calls)")

    @property
    def key(self) -> str:
        """The counter's name in the ledger: stable while what is counted, per what and over which window is."""
        if self.name:
            return self.name
        counted = f"sum:{self.sums}" if self.sums else "calls"
        return f"{counted}/{self.per or 'all'}/{self.window_s:g}s"

    def describe(self) -> str:
        """In words, for a request and `gatedloop limits`: "at most 500 of amount per context:tenant per 1 d"."""
        what = f"of {self.sums}" if self.sums else "calls"
        per = f" per {self.per}" if self.per else ""
        named = f"{self.name}: " if self.name else ""
        return f"{named}at most {self.at_most:g} {what}{per} per {window_words(self.window_s)}"


def window_words(seconds: float) -> str:
    """A window's length as a person reads it: 1 d, 1 h, 15 min, 90 s."""
    for unit, size in (("d", DAY), ("h", HOUR), ("min", MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def window_start(now: float, window_s: float) -> float:
    """The start of the fixed window `now` falls in (aligned to the epoch: a day starts at 00:00 UTC)."""
    return math.floor(now / window_s) * window_s
