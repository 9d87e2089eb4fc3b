"""The notification outbox: rows saying "a reviewer should hear of this request", beside the ledger.

The graph never talks to the network. The gate inserts one row per request a person must answer (the transactional
outbox pattern: the row is in the same database as the evidence the request is built from, written before the
interrupt, and re-inserting it when the node re-runs on resume changes nothing): `request` for an approval request,
`unknown` for a question about a write of unknown outcome, `reminder` and `escalated` queued with a request and
due later, `decided` and `finished` when it is decided and when it ends (nodes/run/notices.py), and
`grant_created`, `grant_confirmed`, `grant_revoked` and `grant_used` in the transaction that makes, confirms, revokes
or uses a standing grant
(checkpoints/grants.py, with `notification_insert`); the deliverer adds
`expiring` for an approval request close to its expiry, one per deadline: an approver's extension moves the
`request` row's `expires_at` (`extend_notification`, the one update of a notice), and the request is warned again
before the new deadline. A deliverer
(`gatedloop.inbox.notify`) reads the rows and POSTs them to webhooks. Delivery state is kept per (notification,
endpoint) with a lease, so two deliverers never post the same row at once and a killed deliverer's claim passes
to the next one: every endpoint gets each notification at least once, under a stable id it can de-duplicate by.

An endpoint is stored as a digest of its URL (a Slack webhook URL is a credential) and a shortened form to show.
Hand-written because neither LangGraph nor the stdlib has an outbox; the queries are `SqlLedger`'s (`?`
placeholders, both backends).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gatedloop.checkpoints.evidence import placeholders

NotificationKind = Literal[
    "request",
    "expiring",
    "unknown",
    "decided",
    "finished",
    "reminder",
    "escalated",
    "grant_created",
    "grant_revoked",
    "grant_used",
    "grant_confirmed",
]
KINDS: tuple[str, ...] = NotificationKind.__args__  # type: ignore[attr-defined]
DeliveryState = Literal["pending", "delivered", "failed", "skipped"]

KIND_CHECK = "CHECK (kind IN (" + ", ".join(f"'{k}'" for k in KINDS) + "))"
OUTBOX_TABLE = """CREATE TABLE IF NOT EXISTS gatedloop_outbox (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL {check},
    thread_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL
);
"""
SCHEMA = (
    OUTBOX_TABLE.format(check=KIND_CHECK)
    + """
CREATE TABLE IF NOT EXISTS gatedloop_outbox_deliveries (
    notification_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    shown_url TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    leased_by TEXT,
    lease_until REAL,
    last_error TEXT,
    updated_at REAL NOT NULL,
    PRIMARY KEY (notification_id, endpoint)
);
"""
)

NOTIFICATION_COLUMNS = "id, kind, thread_id, request_id, payload, created_at, expires_at"
DELIVERY_COLUMNS = (
    "notification_id, endpoint, shown_url, state, attempts, next_attempt_at, leased_by, lease_until, last_error,"
    " updated_at"
)


POSTGRES_KIND_CHECK = (
    "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE conrelid = to_regclass('gatedloop_outbox') AND conname = 'gatedloop_outbox_kind_check'"
)
"""The CHECK on *this* search path's outbox: by name alone it would read another schema's too, and one dropped
meanwhile fails `pg_get_constraintdef` ("could not open relation with OID")."""
POSTGRES_KIND_UPGRADE = (
    "ALTER TABLE gatedloop_outbox DROP CONSTRAINT IF EXISTS gatedloop_outbox_kind_check",
    f"ALTER TABLE gatedloop_outbox ADD CONSTRAINT gatedloop_outbox_kind_check {KIND_CHECK}",
)
"""A database made before the `decided`, `finished` or grant notices takes them (Postgres names a column's CHECK
`<table>_<column>_check`); run under `prepare_database`'s lock, only when `POSTGRES_KIND_CHECK` lacks a kind."""


def sqlite_kind_upgrade(conn: sqlite3.Connection) -> None:
    """A file made before the `decided`, `finished` or grant notices takes them: SQLite cannot alter a CHECK, so the
    table is copied into one with the new CHECK, in one transaction (the rows keep their ids)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='gatedloop_outbox'").fetchone()
    if row is None or all(f"'{k}'" in row[0] for k in KINDS):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(OUTBOX_TABLE.format(check=KIND_CHECK).replace("gatedloop_outbox", "gatedloop_outbox_upgraded"))
        conn.execute(
            f"INSERT INTO gatedloop_outbox_upgraded ({NOTIFICATION_COLUMNS})"
            f" SELECT {NOTIFICATION_COLUMNS} FROM gatedloop_outbox"
        )
        conn.execute("DROP TABLE gatedloop_outbox")
        conn.execute("ALTER TABLE gatedloop_outbox_upgraded RENAME TO gatedloop_outbox")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def notification_id(thread_id: str, request_id: str, kind: NotificationKind, part: str = "") -> str:
    """Stable for one kind of notice about one request of one thread (request ids alone repeat across threads);
    `part` tells apart notices of one kind about one request (each reviewer's decision, each deadline warned of)."""
    key = f"{thread_id}\0{request_id}\0{kind}" + (f"\0{part}" if part else "")
    return "ntf-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def notification_insert(
    thread_id: str,
    request_id: str,
    kind: NotificationKind,
    payload: dict[str, Any],
    *,
    created_at: float,
    expires_at: float | None,
    part: str = "",
) -> tuple[str, tuple[Any, ...]]:
    """The statement that queues a notice once (`ON CONFLICT DO NOTHING`), for a transaction that writes the evidence
    the notice tells of in the same commit (a grant made, revoked or used: checkpoints/grants.py)."""
    return (
        f"INSERT INTO gatedloop_outbox ({NOTIFICATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (id) DO NOTHING",
        (
            notification_id(thread_id, request_id, kind, part),
            kind,
            thread_id,
            request_id,
            json.dumps(payload, ensure_ascii=False, sort_keys=True),
            created_at,
            expires_at,
        ),
    )


@dataclass(frozen=True)
class Notification:
    id: str
    kind: NotificationKind
    thread_id: str
    request_id: str
    payload: dict[str, Any]
    created_at: float
    expires_at: float | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Notification:
        id_, kind, thread_id, request_id, payload, created_at, expires_at = row
        return cls(id_, kind, thread_id, request_id, json.loads(payload), created_at, expires_at)


@dataclass(frozen=True)
class Delivery:
    notification_id: str
    endpoint: str
    shown_url: str
    state: DeliveryState
    attempts: int
    next_attempt_at: float
    leased_by: str | None
    lease_until: float | None
    last_error: str | None
    updated_at: float


class OutboxStore:
    """The outbox queries, over a backend's `_run` (one read), `_write` (one atomic write) and `_run_batch`."""

    def _run(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _write(self, query: str, params: Sequence[Any]) -> int:
        raise NotImplementedError

    def _run_batch(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        raise NotImplementedError

    @property
    def _defers_writes(self) -> bool:
        """Whether this is a `one_commit` view, whose writes wait for its commit."""
        return False

    def record_notification(
        self,
        thread_id: str,
        request_id: str,
        kind: NotificationKind,
        payload: dict[str, Any],
        *,
        created_at: float,
        expires_at: float | None,
        part: str = "",
    ) -> bool:
        """Queue a notice once per (thread, request, kind, part); False if it was queued before (kept as first
        written). On a `one_commit` view it is queued with the view's commit, and "before" means committed
        before."""
        row = notification_insert(
            thread_id, request_id, kind, payload, created_at=created_at, expires_at=expires_at, part=part
        )
        if self._defers_writes:
            queued_before = bool(self._run("SELECT 1 FROM gatedloop_outbox WHERE id=?", (row[1][0],)))
            self._run_batch([row])
            return not queued_before
        return self._write(*row) == 1

    def notification(self, notice_id: str) -> Notification | None:
        rows = self._run(f"SELECT {NOTIFICATION_COLUMNS} FROM gatedloop_outbox WHERE id=?", (notice_id,))
        return Notification.from_row(rows[0]) if rows else None

    def undispatched(self, endpoint: str, now: float, limit: int = 100) -> list[Notification]:
        """Notifications due by `now` (a reminder or an escalation is queued ahead, due at its time) with no
        delivery row for this endpoint yet, oldest first."""
        rows = self._run(
            f"SELECT {NOTIFICATION_COLUMNS} FROM gatedloop_outbox o WHERE created_at <= ? AND NOT EXISTS (SELECT 1"
            " FROM gatedloop_outbox_deliveries d WHERE d.notification_id = o.id AND d.endpoint = ?)"
            " ORDER BY created_at LIMIT ?",
            (now, endpoint, limit),
        )
        return [Notification.from_row(row) for row in rows]

    def unwarned(self, now: float) -> list[Notification]:
        """Request notices still open (the row's `expires_at`, its calls' last deadline as extended:
        `extend_notification`, is ahead) that no expiry notice warns of as late yet; the deliverer warns before each
        of their calls' deadlines in turn. Only requests still open are read, never every request ever queued."""
        rows = self._run(
            f"SELECT {NOTIFICATION_COLUMNS} FROM gatedloop_outbox o WHERE kind='request' AND expires_at > ?"
            " AND NOT EXISTS (SELECT 1 FROM gatedloop_outbox e WHERE e.kind='expiring'"
            " AND e.thread_id = o.thread_id AND e.request_id = o.request_id AND e.expires_at >= o.expires_at)"
            " ORDER BY expires_at",
            (now,),
        )
        return [Notification.from_row(row) for row in rows]

    def extend_notification(self, thread_id: str, request_id: str, until: float) -> bool:
        """An approver extended the request to `until`: its `request` notice's `expires_at` moves there (never
        back), so `unwarned` selects it again for a warning before the new deadline. Its payload stays as queued
        (the deliverer derives the deadline from the evidence); False if it had no such notice or a later one (on
        a `one_commit` view: as committed before)."""
        notice_id = notification_id(thread_id, request_id, "request")
        update = ("UPDATE gatedloop_outbox SET expires_at=? WHERE id=? AND expires_at < ?", (until, notice_id, until))
        if self._defers_writes:
            moves = bool(self._run("SELECT 1 FROM gatedloop_outbox WHERE id=? AND expires_at < ?", (notice_id, until)))
            self._run_batch([update])
            return moves
        return self._write(*update) == 1

    def dispatch(self, rows: Sequence[tuple[str, str, str, DeliveryState, str | None]], now: float) -> None:
        """Delivery rows (notification id, endpoint, shown URL, state, note), once each, in one transaction."""
        self._run_batch(
            [
                (
                    f"INSERT INTO gatedloop_outbox_deliveries ({DELIVERY_COLUMNS})"
                    " VALUES (?, ?, ?, ?, 0, ?, NULL, NULL, ?, ?) ON CONFLICT (notification_id, endpoint) DO NOTHING",
                    (notice_id, endpoint, shown, state, now, note, now),
                )
                for notice_id, endpoint, shown, state, note in rows
            ]
        )

    def due_deliveries(self, endpoints: Sequence[str], now: float, limit: int = 100) -> list[Delivery]:
        """Pending deliveries to these endpoints whose next attempt is due (leased or not; see `claim_delivery`)."""
        if not endpoints:
            return []
        rows = self._run(
            f"SELECT {DELIVERY_COLUMNS} FROM gatedloop_outbox_deliveries WHERE state='pending'"
            f" AND next_attempt_at <= ? AND endpoint IN ({placeholders(len(endpoints))}) ORDER BY next_attempt_at"
            " LIMIT ?",
            (now, *endpoints, limit),
        )
        return [Delivery(*row) for row in rows]

    def claim_delivery(
        self, notice_id: str, endpoint: str, claimant: str, now: float, lease_until: float, dead: str | None
    ) -> bool:
        """Take the delivery for one attempt: it is unleased, its lease ran out, or its holder `dead` was seen to
        have died (a conditional UPDATE: of two deliverers, one wins)."""
        return (
            self._write(
                "UPDATE gatedloop_outbox_deliveries SET leased_by=?, lease_until=?, updated_at=?"
                " WHERE notification_id=? AND endpoint=? AND state='pending' AND next_attempt_at <= ?"
                " AND (leased_by IS NULL OR lease_until <= ? OR leased_by = ?)",
                (claimant, lease_until, now, notice_id, endpoint, now, now, dead or ""),
            )
            == 1
        )

    def finish_delivery(
        self,
        notice_id: str,
        endpoint: str,
        claimant: str,
        state: DeliveryState,
        *,
        now: float,
        next_attempt_at: float,
        error: str | None,
    ) -> bool:
        """Record one attempt by the deliverer holding the lease (False if it lost the lease meanwhile)."""
        return (
            self._write(
                "UPDATE gatedloop_outbox_deliveries SET state=?, attempts=attempts+1, next_attempt_at=?,"
                " last_error=?, leased_by=NULL, lease_until=NULL, updated_at=?"
                " WHERE notification_id=? AND endpoint=? AND state='pending' AND leased_by=?",
                (state, next_attempt_at, error, now, notice_id, endpoint, claimant),
            )
            == 1
        )

    def deliveries(self, states: Sequence[DeliveryState]) -> list[tuple[Delivery, Notification]]:
        """Deliveries in these states with their notifications, oldest first (`gatedloop notify --status`)."""
        columns = ", ".join(f"d.{c.strip()}" for c in DELIVERY_COLUMNS.split(","))
        notice = ", ".join(f"o.{c.strip()}" for c in NOTIFICATION_COLUMNS.split(","))
        rows = self._run(
            f"SELECT {columns}, {notice} FROM gatedloop_outbox_deliveries d JOIN gatedloop_outbox o"
            f" ON o.id = d.notification_id WHERE d.state IN ({placeholders(len(states))})"
            " ORDER BY o.created_at, d.endpoint",
            tuple(states),
        )
        width = len(DELIVERY_COLUMNS.split(","))
        return [(Delivery(*row[:width]), Notification.from_row(row[width:])) for row in rows]
