"""Standing grants and limits across threads, as the ledger keeps them: what a claim takes and charges.

A grant approves calls within bounds in a person's place, a set number of times; a limit bounds what a tool's
writes do together in a window. Neither may be checked in one transaction and used in another: two workers would
both see the last use, or both fit under the limit. So both are taken in the transaction that claims the write
(`SqlLedger.claim`), by conditional writes that hold on either backend (SQLite's `BEGIN IMMEDIATE` serializes
writers; under Postgres's READ COMMITTED an `UPDATE ... WHERE` or an upsert's `DO UPDATE ... WHERE` waits for a
concurrent writer of the row and re-checks its condition on the row it left):

- a grant's use: `UPDATE gatedloop_grants SET uses_taken = uses_taken + 1 WHERE` not revoked, not expired and a use
  left; its row in `gatedloop_grant_uses` (the call's approval record, naming the grant) and a `grant_used` audit row;
- a limit's charge: one row per (tool, limit, group, window), upserted only while the total stays within the limit.

When either cannot be had, the claim raises (`GrantLapsed`, `OverLimit`) and the transaction, claim included, is
rolled back: the write never started, and the gate asks a person or refuses (nodes/run/running.py). Whether a grant
covers a call, and what a call is charged, is decided by the gate (nodes/gate/grants.py); this module only keeps
the rows. Every table here is evidence, chained like the rest (checkpoints/chain.py).

A grant's creation, each further granter's confirmation, its revocation and each use queue their notice
(`grant_created`, `grant_confirmed`, `grant_revoked`, `grant_used`) in the transaction that writes them
(checkpoints/outbox.py): no grant is made, confirmed, revoked or used without its notice, and no notice tells of one
that was rolled back. Bounds hold argument values, which only the caller's policy can mask: the caller passes them
shown (`shown`); the rest of a notice is read from the rows written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from typing_extensions import TypedDict  # a plan field: pydantic (Studio's schemas) needs it on Python 3.11

from gatedloop.checkpoints.chain import CHAINED, row_values
from gatedloop.checkpoints.evidence import AuditEvent, audit_statements, placeholders, requester_from_json
from gatedloop.checkpoints.outbox import notification_insert
from gatedloop.checkpoints.pruning import Statements
from gatedloop.tools.usage import window_start, window_words

SCHEMA = """
CREATE TABLE IF NOT EXISTS gatedloop_grants (
    grant_id TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    bounds TEXT NOT NULL,
    requester TEXT,
    uses INTEGER NOT NULL,
    uses_taken INTEGER NOT NULL DEFAULT 0,
    expires_at REAL NOT NULL,
    note TEXT,
    granted_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    revoked_by TEXT
);
CREATE TABLE IF NOT EXISTS gatedloop_grant_confirmations (
    grant_id TEXT NOT NULL,
    granter TEXT NOT NULL,
    roles TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (grant_id, granter)
);
CREATE TABLE IF NOT EXISTS gatedloop_grant_uses (
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    grant_id TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (thread_id, call_id)
);
CREATE TABLE IF NOT EXISTS gatedloop_limit_usage (
    tool TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    group_key TEXT NOT NULL,
    window_start REAL NOT NULL,
    window_s REAL NOT NULL,
    total REAL NOT NULL,
    calls INTEGER NOT NULL,
    at_most REAL NOT NULL,
    PRIMARY KEY (tool, limit_key, group_key, window_start)
);
"""

GRANT_EVENTS_THREAD = ""
"""The audit trail's thread of a grant's own events (created, confirmed, revoked): a grant belongs to no thread, and
no thread id is empty. Its uses are audited in the thread of the call that used it. Its notices are queued under
the same thread (created, revoked) or the call's (used), named by the grant's id."""

GRANT_COLUMNS = ", ".join(f"g.{column}" for column in CHAINED["gatedloop_grants"].columns)
USAGE_COLUMNS = ", ".join(CHAINED["gatedloop_limit_usage"].columns)


class Confirmation(NamedTuple):
    """One granter's part of a grant: who, with which roles, when (the creator's is the first)."""

    granter: str
    roles: frozenset[str]
    at: float


@dataclass(frozen=True)
class Grant:
    """A standing approval of a tool's calls within `bounds` (argument -> constraint, see nodes/gate/grants.py), for
    `requester` (None: anyone), `uses` times, until `expires_at`. Live once enough authorized granters confirmed it
    (the gate judges them under the tool's policy in force), until revoked, expired or used up."""

    grant_id: str
    tool: str
    bounds: Mapping[str, Mapping[str, Any]]
    requester: str | None
    uses: int
    expires_at: float
    granted_by: str
    created_at: float
    note: str | None = None
    uses_taken: int = 0
    revoked_at: float | None = None
    revoked_by: str | None = None
    confirmations: tuple[Confirmation, ...] = field(default=(), compare=False)

    @property
    def uses_left(self) -> int:
        return max(0, self.uses - self.uses_taken)

    def open_at(self, now: float) -> bool:
        """Not revoked, not expired, a use left: what the claim itself checks again (confirmations aside)."""
        return self.revoked_at is None and now < self.expires_at and self.uses_left > 0

    @classmethod
    def from_row(cls, values: Sequence[Any], confirmations: Sequence[Confirmation] = ()) -> Grant:
        row = dict(zip(CHAINED["gatedloop_grants"].columns, values, strict=True))
        return cls(
            grant_id=row["grant_id"],
            tool=row["tool"],
            bounds=json.loads(row["bounds"]),
            requester=row["requester"],
            uses=int(row["uses"]),
            expires_at=float(row["expires_at"]),
            granted_by=row["granted_by"],
            created_at=float(row["created_at"]),
            note=row["note"],
            uses_taken=int(row["uses_taken"]),
            revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
            revoked_by=row["revoked_by"],
            confirmations=tuple(confirmations),
        )


class Charge(TypedDict):
    """What one write is charged against one limit (nodes/gate/grants.py computes it from the policy, the arguments
    and the requester): JSON, so it rides on the call's plan into the write's task."""

    limit: str
    """The limit's counter key (`UsageLimit.key`)."""
    described: str
    """The limit in words, for a request or a refusal."""
    group: str
    """The value the counter is kept per ("" when the limit is kept for every call together)."""
    window_s: float
    amount: float
    at_most: float
    over: Literal["ask", "refuse"]


@dataclass(frozen=True)
class ClaimTerms:
    """What a claim takes besides the claim: a use of the first of `grants` that still has one (none: the call needs
    no grant), and each of `charges`. `past_limit`: a person approved the call after a limit sent it back to her, so
    limits that ask may be gone past (those that refuse never)."""

    grants: tuple[str, ...] = ()
    charges: tuple[Charge, ...] = ()
    past_limit: bool = False


class ClaimRefused(Exception):
    """The claim was rolled back: what it needed besides the claim could not be had. `over` says what the gate does
    now: `ask` a person, or `refuse` the call. `reason` is for the model, the reviewer and the audit trail."""

    over: Literal["ask", "refuse"] = "ask"

    def __init__(self, reason: str, detail: Mapping[str, Any]):
        super().__init__(reason)
        self.reason = reason
        self.detail = dict(detail)


class GrantLapsed(ClaimRefused):
    """Every grant that covered the call was revoked, expired or used up before its claim: a person decides it."""


class OverLimit(ClaimRefused):
    """The write would go past a limit across threads."""

    def __init__(self, charge: Charge, total: float):
        over_by = total + charge["amount"] - charge["at_most"]
        group = f" ({charge['group']})" if charge["group"] else ""
        reason = (
            f"limit {charge['described']}{group}: {total:g} used in this {window_words(charge['window_s'])} window and"
            f" this call adds {charge['amount']:g}, {over_by:g} over"
        )
        detail = {"limit": charge["limit"], "group": charge["group"], "total": total, "over_by": over_by}
        super().__init__(reason, detail)
        self.over = charge["over"]


def lapse_reason(grants: Sequence[Grant], now: float) -> str:
    """Why none of the grants that covered a call could approve it at its claim."""
    reasons = []
    for grant in grants:
        if grant.revoked_at is not None:
            why = f"revoked by {grant.revoked_by}"
        elif now >= grant.expires_at:
            why = "expired"
        else:
            why = "used up"
        reasons.append(f"{grant.grant_id} {why}")
    return "the standing grant that covered this call lapsed before it started: " + ("; ".join(reasons) or "gone")


def take_grant_use(
    thread_id: str, call_id: str, args_digest: str, grant_ids: Sequence[str], now: float
) -> Statements[str]:
    """Take one use of the first grant (in the gate's order) that is open at the claim, with its use row and audit
    row; `GrantLapsed` if none is."""
    for grant_id in grant_ids:
        taken = yield (
            "UPDATE gatedloop_grants SET uses_taken = uses_taken + 1"
            " WHERE grant_id = ? AND revoked_at IS NULL AND expires_at > ? AND uses_taken < uses",
            (grant_id, now),
            True,
        )
        if taken:
            grant = Grant.from_row(row_values(taken[0]))
            yield (
                "INSERT INTO gatedloop_grant_uses (thread_id, call_id, grant_id, args_digest, at)"
                " VALUES (?, ?, ?, ?, ?)",
                (thread_id, call_id, grant_id, args_digest, now),
                False,
            )
            asked = yield (
                "SELECT requester FROM gatedloop_calls WHERE thread_id = ? AND call_id = ?",
                (thread_id, call_id),
                True,
            )
            requester = requester_from_json(str(row_values(asked[0])[0])).user_id if asked else None
            detail = {"grant": grant_id, "tool": grant.tool, "uses_left": grant.uses_left, "requester": requester}
            for statement in audit_statements(thread_id, [AuditEvent(call_id, "grant_used", detail)]):
                yield (*statement, False)
            notice = {
                "grant_id": grant_id,
                "tool": grant.tool,
                "requester": requester,
                "thread_id": thread_id,
                "tool_call_id": call_id,
                "uses": grant.uses,
                "uses_left": grant.uses_left,
                "used_at": now,
            }
            query, params = notification_insert(
                thread_id, grant_id, "grant_used", notice, created_at=now, expires_at=None, part=call_id
            )
            yield query, params, False
            return grant_id
    rows = yield (
        f"SELECT {GRANT_COLUMNS} FROM gatedloop_grants g WHERE g.grant_id IN ({placeholders(len(grant_ids))})",
        tuple(grant_ids),
        True,
    )
    grants = [Grant.from_row(row_values(row)) for row in rows]
    raise GrantLapsed(lapse_reason(grants, now), {"grants": list(grant_ids)})


def charge_limit(tool: str, charge: Charge, now: float, past_limit: bool) -> Statements[None]:
    """Add the write to its limit's window counter if it fits (`OverLimit` if not); a limit that asks is charged
    past its bound when a person approved the call after it sent the call back (`past_limit`)."""
    start = window_start(now, charge["window_s"])
    key = (tool, charge["limit"], charge["group"], start)
    capped = charge["over"] == "refuse" or not past_limit
    if not capped or charge["amount"] <= charge["at_most"]:
        charged = yield (
            "INSERT INTO gatedloop_limit_usage (tool, limit_key, group_key, window_start, window_s, total, calls,"
            " at_most) VALUES (?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT (tool, limit_key, group_key, window_start)"
            " DO UPDATE SET total = gatedloop_limit_usage.total + excluded.total,"
            " calls = gatedloop_limit_usage.calls + 1, at_most = excluded.at_most"
            + (" WHERE gatedloop_limit_usage.total + excluded.total <= excluded.at_most" if capped else ""),
            (*key, float(charge["window_s"]), float(charge["amount"]), float(charge["at_most"])),
            True,
        )
        if charged:
            return
    found = yield (
        "SELECT total FROM gatedloop_limit_usage"
        " WHERE tool = ? AND limit_key = ? AND group_key = ? AND window_start = ?",
        key,
        True,
    )
    raise OverLimit(charge, float(row_values(found[0])[0]) if found else 0.0)


@dataclass(frozen=True)
class LimitUsage:
    """One window's counter of one limit (`gatedloop limits`)."""

    tool: str
    limit: str
    group: str
    window_start: float
    window_s: float
    total: float
    calls: int
    at_most: float
    """The limit's bound when it was last charged."""

    @property
    def window_end(self) -> float:
        return self.window_start + self.window_s


class GrantStore:
    """The grant and limit queries, over a backend's `_run` (one read) and `_steps` (a statements generator run in
    one transaction, every evidence row it writes chained)."""

    def _run(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _steps(self, body: Statements[Any]) -> Any:
        raise NotImplementedError

    def create_grant(
        self, grant: Grant, roles: frozenset[str], detail: Mapping[str, Any], shown: Mapping[str, Any] | None = None
    ) -> None:
        """A new grant, its creator's confirmation, its `grant_created` audit row (`detail`) and its notice (with
        `shown`: its bounds masked, its status), in one transaction."""
        self._steps(_statements(_create(grant, roles, detail, shown or {})))

    def confirm_grant(
        self, grant_id: str, granter: str, roles: frozenset[str], at: float, shown: Mapping[str, Any] | None = None
    ) -> bool:
        """A further granter's confirmation (False: she had confirmed it already), with its audit row and its notice
        (with `shown`: the bounds masked, the status it leaves the grant in)."""
        return bool(self._steps(_confirm(grant_id, granter, roles, at, shown or {})))

    def revoke_grant(self, grant_id: str, by: str, at: float, shown: Mapping[str, Any] | None = None) -> bool:
        """Revoke a grant (False: it was revoked already), with its audit row and its notice (with `shown`: its bounds
        masked); from the next claim on it covers nothing."""
        return bool(self._steps(_revoke(grant_id, by, at, shown or {})))

    def grants(self, tools: Sequence[str] | None = None, *, open_at: float | None = None) -> list[Grant]:
        """Every grant (of `tools`; with `open_at`, only those not revoked, expired or used up then), newest first,
        each with its confirmations in order."""
        where: list[str] = []
        params: list[Any] = []
        if tools is not None:
            if not tools:
                return []
            where.append(f"g.tool IN ({placeholders(len(tools))})")
            params += list(tools)
        if open_at is not None:
            where.append("g.revoked_at IS NULL AND g.expires_at > ? AND g.uses_taken < g.uses")
            params.append(open_at)
        return self._grants(where, params)

    def grant(self, grant_id: str) -> Grant | None:
        found = self._grants(["g.grant_id = ?"], [grant_id])
        return found[0] if found else None

    def _grants(self, where: Sequence[str], params: Sequence[Any]) -> list[Grant]:
        rows = self._run(
            f"SELECT {GRANT_COLUMNS}, c.granter, c.roles, c.at FROM gatedloop_grants g"
            " JOIN gatedloop_grant_confirmations c ON c.grant_id = g.grant_id"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY g.created_at DESC, g.grant_id, c.at",
            params,
        )
        width = len(CHAINED["gatedloop_grants"].columns)
        found: dict[str, tuple[Sequence[Any], list[Confirmation]]] = {}
        for row in rows:
            grant_row, (granter, granter_roles, at) = row[:width], row[width:]
            entry = found.setdefault(str(grant_row[0]), (grant_row, []))
            entry[1].append(Confirmation(granter, frozenset(json.loads(granter_roles)), float(at)))
        return [Grant.from_row(values, confirmations) for values, confirmations in found.values()]

    def grant_uses(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """call id -> (grant id, arguments' digest) of each call whose claim took a grant's use: its approval, for as
        long as the write it claimed is settled (a crash between claim and outcome, a resume)."""
        if not call_ids:
            return {}
        rows = self._run(
            "SELECT call_id, grant_id, args_digest FROM gatedloop_grant_uses WHERE thread_id = ? AND call_id IN"
            f" ({placeholders(len(call_ids))})",
            (thread_id, *call_ids),
        )
        return {str(call_id): (str(grant_id), str(digest)) for call_id, grant_id, digest in rows}

    def limit_usage(self, since: float | None = None) -> list[LimitUsage]:
        """Every limit's window counters whose window ends after `since` (None: all), newest window first."""
        rows = self._run(
            f"SELECT {USAGE_COLUMNS} FROM gatedloop_limit_usage"
            + (" WHERE window_start + window_s > ?" if since is not None else "")
            + " ORDER BY window_start DESC, tool, limit_key, group_key",
            (since,) if since is not None else (),
        )
        return [
            LimitUsage(str(t), str(k), str(g), float(s), float(w), float(total), int(n), float(m))
            for t, k, g, s, w, total, n, m in rows
        ]


def _statements(statements: Sequence[tuple[str, Sequence[Any]]]) -> Statements[None]:
    for query, params in statements:
        yield query, params, False


def _create(
    grant: Grant, roles: frozenset[str], detail: Mapping[str, Any], shown: Mapping[str, Any]
) -> list[tuple[str, Sequence[Any]]]:
    bounds = json.dumps(grant.bounds, sort_keys=True, ensure_ascii=False)
    notice = {**shown, **_told(grant), "granted_by": grant.granted_by, "created_at": grant.created_at}
    return [
        (
            "INSERT INTO gatedloop_grants (grant_id, tool, bounds, requester, uses, uses_taken, expires_at, note,"
            " granted_by, created_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)",
            (
                grant.grant_id,
                grant.tool,
                bounds,
                grant.requester,
                grant.uses,
                grant.expires_at,
                grant.note,
                grant.granted_by,
                grant.created_at,
            ),
        ),
        (
            "INSERT INTO gatedloop_grant_confirmations (grant_id, granter, roles, at) VALUES (?, ?, ?, ?)",
            (grant.grant_id, grant.granted_by, json.dumps(sorted(roles)), grant.created_at),
        ),
        *audit_statements(
            GRANT_EVENTS_THREAD, [AuditEvent(grant.grant_id, "grant_created", dict(detail), grant.granted_by)]
        ),
        notification_insert(
            GRANT_EVENTS_THREAD,
            grant.grant_id,
            "grant_created",
            notice,
            created_at=grant.created_at,
            expires_at=grant.expires_at,
        ),
    ]


def _told(grant: Grant) -> dict[str, Any]:
    """What a grant's notice says of it from its row (its bounds only as the caller shows them, masked)."""
    return {
        "grant_id": grant.grant_id,
        "tool": grant.tool,
        "requester": grant.requester,
        "uses": grant.uses,
        "uses_left": grant.uses_left,
        "expires_at": grant.expires_at,
        "note": grant.note,
    }


def _confirm(
    grant_id: str, granter: str, roles: frozenset[str], at: float, shown: Mapping[str, Any]
) -> Statements[bool]:
    added = yield (
        "INSERT INTO gatedloop_grant_confirmations (grant_id, granter, roles, at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (grant_id, granter) DO NOTHING",
        (grant_id, granter, json.dumps(sorted(roles)), at),
        True,
    )
    if not added:
        return False
    event = AuditEvent(grant_id, f"grant_confirmed:{granter}", {"roles": sorted(roles)}, granter)
    yield from _statements(audit_statements(GRANT_EVENTS_THREAD, [event]))
    rows = yield (f"SELECT {GRANT_COLUMNS} FROM gatedloop_grants g WHERE g.grant_id = ?", (grant_id,), True)
    granters = yield (
        "SELECT granter FROM gatedloop_grant_confirmations WHERE grant_id = ? ORDER BY at, granter",
        (grant_id,),
        True,
    )
    grant = Grant.from_row(row_values(rows[0]))
    notice = {
        **shown,
        **_told(grant),
        "confirmed_by": granter,
        "granted_by": [str(row_values(row)[0]) for row in granters],
        "confirmed_at": at,
    }
    query, params = notification_insert(
        GRANT_EVENTS_THREAD,
        grant_id,
        "grant_confirmed",
        notice,
        created_at=at,
        expires_at=grant.expires_at,
        part=granter,
    )
    yield query, params, False
    return True


def _revoke(grant_id: str, by: str, at: float, shown: Mapping[str, Any]) -> Statements[bool]:
    revoked = yield (
        "UPDATE gatedloop_grants SET revoked_at = ?, revoked_by = ? WHERE grant_id = ? AND revoked_at IS NULL",
        (at, by, grant_id),
        True,
    )
    if revoked:
        grant = Grant.from_row(row_values(revoked[0]))
        detail = {"tool": grant.tool, "uses_left": grant.uses_left}
        notice = {**shown, **_told(grant), "revoked_by": by, "revoked_at": at}
        yield from _statements(
            [
                *audit_statements(GRANT_EVENTS_THREAD, [AuditEvent(grant_id, "grant_revoked", detail, by)]),
                notification_insert(
                    GRANT_EVENTS_THREAD, grant_id, "grant_revoked", notice, created_at=at, expires_at=None
                ),
            ]
        )
    return bool(revoked)
