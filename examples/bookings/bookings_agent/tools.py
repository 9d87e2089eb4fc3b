"""The bookings the agent makes: each real booking is a row in `bookings.sqlite` beside the server's database."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Annotated

from langchain_core.tools import InjectedToolArg, tool

from gatedloop.tools import ToolPolicy


def bookings_file() -> Path:
    """Beside the server's database (`GATEDLOOP_DB`, as `langgraph dev` serves this example)."""
    return Path(os.environ.get("GATEDLOOP_DB") or ".gatedloop/studio.sqlite").expanduser().with_name("bookings.sqlite")


def _book(kind: str, what: str, people: int, key: str) -> str:
    with sqlite3.connect(bookings_file()) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bookings (key TEXT PRIMARY KEY, kind TEXT, what TEXT, people INT)")
        conn.execute("INSERT OR IGNORE INTO bookings VALUES (?, ?, ?, ?)", (key, kind, what, people))
        (seq,) = conn.execute("SELECT rowid FROM bookings WHERE key=?", (key,)).fetchone()
    return f"{kind.upper()}-{seq:04d}"


@tool
def reserve_table(restaurant: str, people: int, idempotency_key: Annotated[str, InjectedToolArg]) -> str:
    """Reserve a table at a restaurant (a write: the restaurant holds it for us)."""
    return _book("table", restaurant, people, idempotency_key)


@tool
def book_room(hotel: str, nights: int, idempotency_key: Annotated[str, InjectedToolArg]) -> str:
    """Book a hotel room (a write: the hotel charges the company card)."""
    return _book("room", hotel, nights, idempotency_key)


@tool
def opening_hours(restaurant: str) -> str:
    """When a restaurant is open (a read)."""
    return f"{restaurant}: 12:00-15:00, 19:00-23:00"


POLICIES = {
    "reserve_table": ToolPolicy(effect="write", approval="always", approvers=frozenset({"hosts"})),
    "book_room": ToolPolicy(effect="write", approval="always", approvers=frozenset({"travel"})),
    "opening_hours": ToolPolicy(effect="read", approval="never"),
}
