"""The demo tools' authoritative system: a small SQLite file, so writes persist and can be reconciled.

A connection is opened per operation (WAL, busy timeout), so the store is safe from worker threads and from
several processes on one file. Writes take an idempotency key with a UNIQUE constraint: a repeated key returns
the first result and changes nothing, which is what lets the loop reconcile a write whose outcome is unknown.
Values only ever reach SQL as bound parameters.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gatedloop.checkpoints.ledger import switch_to_wal
from gatedloop.tools.errors import ToolFailure

BUSY_TIMEOUT_S = 10.0
WORKDAY = ("09:00", "18:00")
NOT_FOUND = "{what} {key!r} was not found."
WORKSHOP_FULL = "Workshop {event_id} is full."

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY COLLATE NOCASE, status TEXT NOT NULL, tracking_no TEXT);
CREATE TABLE IF NOT EXISTS logistics (
    tracking_no TEXT PRIMARY KEY COLLATE NOCASE, status TEXT NOT NULL, latest_event TEXT NOT NULL,
    updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS weather (
    city TEXT PRIMARY KEY, temperature NUMERIC NOT NULL, unit TEXT NOT NULL, condition TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS city_aliases (
    alias TEXT PRIMARY KEY COLLATE NOCASE, city TEXT NOT NULL REFERENCES weather(city));
CREATE TABLE IF NOT EXISTS contacts (name TEXT PRIMARY KEY COLLATE NOCASE, email TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS busy_slots (
    user TEXT NOT NULL COLLATE NOCASE, date TEXT NOT NULL, start TEXT NOT NULL, end TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
    date TEXT NOT NULL, start TEXT NOT NULL, end TEXT NOT NULL, attendees TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workshops (
    event_id TEXT PRIMARY KEY COLLATE NOCASE, title TEXT NOT NULL, date TEXT NOT NULL,
    capacity INTEGER NOT NULL CHECK (capacity >= 0));
CREATE TABLE IF NOT EXISTS reservations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL UNIQUE,
    event_id TEXT NOT NULL REFERENCES workshops(event_id), participant TEXT NOT NULL,
    seats_left INTEGER NOT NULL, UNIQUE (event_id, participant));
CREATE TABLE IF NOT EXISTS trains (train_no TEXT PRIMARY KEY COLLATE NOCASE);
CREATE TABLE IF NOT EXISTS train_delays (
    train_no TEXT NOT NULL REFERENCES trains(train_no), date TEXT NOT NULL, delay_minutes INTEGER NOT NULL,
    PRIMARY KEY (train_no, date));
"""

_SEED: dict[str, list[tuple[Any, ...]]] = {
    "orders": [
        ("ORD-2026-001", "shipped", "SF123456"),
        ("ORD-2026-002", "processing", None),
        ("ORD-2026-003", "delivered", "SF654321"),
    ],
    "logistics": [
        ("SF123456", "in_transit", "杭州转运中心已发出", "2026-09-18T09:20:00+08:00"),
        ("SF654321", "delivered", "深圳南山区已签收", "2026-09-15T14:05:00+08:00"),
    ],
    "weather": [
        ("北京", 22, "celsius", "晴"),
        ("上海", 25, "celsius", "多云"),
        ("深圳", 29, "celsius", "小雨"),
        ("杭州", 24, "celsius", "阴"),
    ],
    "city_aliases": [
        (alias, city)
        for city, english in (
            ("北京", "Beijing"),
            ("上海", "Shanghai"),
            ("深圳", "Shenzhen"),
            ("杭州", "Hangzhou"),
        )
        for alias in (city, f"{city}市", english)
    ],
    "contacts": [
        ("张伟", "zhangwei@example.com"),
        ("李娜", "lina@example.com"),
        ("Alice", "alice@example.com"),
        ("Bob", "bob@example.com"),
    ],
    "busy_slots": [
        ("me", "2026-03-06", "09:00", "10:00"),
        ("me", "2026-03-06", "14:00", "15:30"),
        ("me", "2026-03-09", "12:00", "13:00"),
        ("张伟", "2026-03-06", "11:00", "12:30"),
        ("Alice", "2026-03-06", "12:00", "13:00"),
    ],
    "workshops": [
        ("WS-101", "Agent 工具调用工作坊", "2026-03-20", 20),
        ("WS-102", "LangGraph 实战", "2026-03-27", 2),
        ("WS-103", "提示词工程", "2026-04-03", 1),
    ],
    "reservations": [("seed:WS-103:张伟", "WS-103", "张伟", 0)],
    "trains": [("G1234",), ("G7",), ("D2345",)],
    "train_delays": [("G1234", "2026-03-07", 25), ("D2345", "2026-03-06", 12)],
}

_SEED_SQL = {
    "orders": "INSERT INTO orders (order_id, status, tracking_no) VALUES (?, ?, ?)",
    "logistics": "INSERT INTO logistics (tracking_no, status, latest_event, updated_at) VALUES (?, ?, ?, ?)",
    "weather": "INSERT INTO weather (city, temperature, unit, condition) VALUES (?, ?, ?, ?)",
    "city_aliases": "INSERT INTO city_aliases (alias, city) VALUES (?, ?)",
    "contacts": "INSERT INTO contacts (name, email) VALUES (?, ?)",
    "busy_slots": "INSERT INTO busy_slots (user, date, start, end) VALUES (?, ?, ?, ?)",
    "workshops": "INSERT INTO workshops (event_id, title, date, capacity) VALUES (?, ?, ?, ?)",
    "reservations": (
        "INSERT INTO reservations (idempotency_key, event_id, participant, seats_left) VALUES (?, ?, ?, ?)"
    ),
    "trains": "INSERT INTO trains (train_no) VALUES (?)",
    "train_delays": "INSERT INTO train_delays (train_no, date, delay_minutes) VALUES (?, ?, ?)",
}


class DemoStore:
    """Orders, logistics, weather, calendars, contacts, events, workshops and trains in one SQLite file."""

    def __init__(self, path: str | os.PathLike[str], *, prepare: bool = True) -> None:
        """`prepare=False` leaves the file alone (for code that builds the tools only to read threads)."""
        self.path = os.fspath(path)
        if not prepare:
            return
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if self._seeded():
            return  # nothing to create: opening never waits on another process's write lock
        with self._connect() as conn:
            switch_to_wal(conn)
            conn.executescript(_SCHEMA)
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM meta WHERE key = 'seeded'").fetchone() is None:
                for table, rows in _SEED.items():
                    conn.executemany(_SEED_SQL[table], rows)
                conn.execute("INSERT INTO meta (key, value) VALUES ('seeded', '1')")

    def _seeded(self) -> bool:
        if self.path == ":memory:" or not os.path.exists(self.path):
            return False
        with self._connect() as conn:
            try:
                return conn.execute("SELECT 1 FROM meta WHERE key = 'seeded'").fetchone() is not None
            except sqlite3.OperationalError:
                return False

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys=ON")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE takes the write lock first, so check-then-insert is race-free across processes."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _one(self, sql: str, params: tuple[Any, ...]) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(sql, params).fetchone()
        return dict(row) if row is not None else None

    def get_order(self, order_id: str) -> dict[str, Any] | None:
        return self._one("SELECT status, tracking_no FROM orders WHERE order_id = ?", (order_id.strip(),))

    def get_logistics(self, tracking_no: str) -> dict[str, Any] | None:
        return self._one(
            "SELECT status, latest_event, updated_at FROM logistics WHERE tracking_no = ?",
            (tracking_no.strip(),),
        )

    def get_weather(self, city: str) -> dict[str, Any] | None:
        return self._one(
            "SELECT w.city, w.temperature, w.unit, w.condition"
            " FROM city_aliases a JOIN weather w ON w.city = a.city WHERE a.alias = ?",
            (city.strip(),),
        )

    def get_contact(self, name: str) -> dict[str, Any] | None:
        return self._one("SELECT name, email FROM contacts WHERE name = ?", (name.strip(),))

    def get_calendar(self, date: str, user: str) -> dict[str, Any] | None:
        """Busy and free workday slots; created events are on the calendar of "me". None: unknown user."""
        user = user.strip()
        with self._connect() as conn:
            known = user.casefold() == "me" or conn.execute("SELECT 1 FROM contacts WHERE name = ?", (user,)).fetchone()
            if not known:
                return None
            slots = [
                (row["start"], row["end"])
                for row in conn.execute("SELECT start, end FROM busy_slots WHERE user = ? AND date = ?", (user, date))
            ]
            if user.casefold() == "me":
                slots += [
                    (row["start"], row["end"])
                    for row in conn.execute("SELECT start, end FROM events WHERE date = ?", (date,))
                ]
        busy = _merge(slots)
        return {
            "date": date,
            "user": user,
            "busy": [{"start": s, "end": e} for s, e in busy],
            "free": [{"start": s, "end": e} for s, e in _free(busy)],
        }

    def create_event(
        self, *, title: str, date: str, start: str, end: str, attendees: list[str], idempotency_key: str
    ) -> dict[str, Any]:
        with self._transaction() as conn:
            if (existing := _event_by_key(conn, idempotency_key)) is not None:
                return existing
            conn.execute(
                "INSERT INTO events (idempotency_key, title, date, start, end, attendees) VALUES (?, ?, ?, ?, ?, ?)",
                (idempotency_key, title, date, start, end, json.dumps(attendees, ensure_ascii=False)),
            )
            created = _event_by_key(conn, idempotency_key)
        assert created is not None
        return created

    def find_event_by_key(self, idempotency_key: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            return _event_by_key(conn, idempotency_key)

    def get_workshop(self, event_id: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            return _workshop(conn, event_id.strip())

    def reserve_seat(self, *, event_id: str, participant: str, idempotency_key: str) -> dict[str, Any]:
        """One seat per key; ToolFailure for an unknown workshop, a full one, or a participant already in."""
        event_id, participant = event_id.strip(), participant.strip()
        with self._transaction() as conn:
            if (existing := _reservation_by_key(conn, idempotency_key)) is not None:
                return existing
            workshop = _workshop(conn, event_id)
            if workshop is None:
                raise ToolFailure(NOT_FOUND.format(what="Workshop", key=event_id), error_type="invalid_arguments")
            if conn.execute(
                "SELECT 1 FROM reservations WHERE event_id = ? AND participant = ?",
                (workshop["event_id"], participant),
            ).fetchone():
                raise ToolFailure(f"{participant!r} already holds a seat at {workshop['event_id']}.", retryable=False)
            if workshop["seats_left"] <= 0:
                raise ToolFailure(WORKSHOP_FULL.format(event_id=workshop["event_id"]), retryable=False)
            conn.execute(
                "INSERT INTO reservations (idempotency_key, event_id, participant, seats_left) VALUES (?, ?, ?, ?)",
                (idempotency_key, workshop["event_id"], participant, workshop["seats_left"] - 1),
            )
            created = _reservation_by_key(conn, idempotency_key)
        assert created is not None
        return created

    def find_reservation_by_key(self, idempotency_key: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            return _reservation_by_key(conn, idempotency_key)

    def get_train_status(self, train_no: str, date: str) -> dict[str, Any] | None:
        """A known train runs on time unless a delay is recorded for that date. None: no such train."""
        with self._connect() as conn:
            train = conn.execute("SELECT train_no FROM trains WHERE train_no = ?", (train_no.strip(),)).fetchone()
            if train is None:
                return None
            delay = conn.execute(
                "SELECT delay_minutes FROM train_delays WHERE train_no = ? AND date = ?",
                (train["train_no"], date),
            ).fetchone()
        minutes = delay["delay_minutes"] if delay else 0
        return {
            "train_no": train["train_no"],
            "date": date,
            "status": "delayed" if minutes else "on_time",
            "delay_minutes": minutes,
        }

    def count_events(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])

    def count_reservations(self, event_id: str | None = None) -> int:
        with self._connect() as conn:
            if event_id is None:
                return int(conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0])
            return int(conn.execute("SELECT COUNT(*) FROM reservations WHERE event_id = ?", (event_id,)).fetchone()[0])


def _event_by_key(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT seq, title, date, start, end, attendees FROM events WHERE idempotency_key = ?", (key,)
    ).fetchone()
    if row is None:
        return None
    return {
        "event_id": f"EVT-{row['seq']:04d}",
        "title": row["title"],
        "date": row["date"],
        "start": row["start"],
        "end": row["end"],
        "attendees": json.loads(row["attendees"]),
    }


def _reservation_by_key(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT seq, event_id, participant, seats_left FROM reservations WHERE idempotency_key = ?", (key,)
    ).fetchone()
    if row is None:
        return None
    return {
        "reservation_id": f"RSV-{row['seq']:04d}",
        "event_id": row["event_id"],
        "participant": row["participant"],
        "seats_left": row["seats_left"],
    }


def _workshop(conn: sqlite3.Connection, event_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT w.event_id, w.title, w.date, w.capacity, w.capacity - COUNT(r.seq) AS seats_left"
        " FROM workshops w LEFT JOIN reservations r ON r.event_id = w.event_id"
        " WHERE w.event_id = ? GROUP BY w.event_id",
        (event_id,),
    ).fetchone()
    return dict(row) if row is not None else None


def _merge(slots: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Overlapping or touching HH:MM intervals joined (zero-padded times compare correctly as strings)."""
    merged: list[tuple[str, str]] = []
    for start, end in sorted(slots):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _free(busy: list[tuple[str, str]]) -> list[tuple[str, str]]:
    day_start, day_end = WORKDAY
    free: list[tuple[str, str]] = []
    cursor = day_start
    for start, end in busy:
        if start > cursor:
            free.append((cursor, min(start, day_end)))
        cursor = max(cursor, end)
        if cursor >= day_end:
            break
    if cursor < day_end:
        free.append((cursor, day_end))
    return [(s, e) for s, e in free if s < e]
