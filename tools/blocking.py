"""A call that may block (a policy's own function: a `validator`, an approval predicate, a `preview`; the Postgres
worker lock's own connection) made from the gate's synchronous work, kept off the event loop when that work runs
on one.

Under `ainvoke` on Postgres the gate's ledger work runs on the event loop inside greenback's portal
(`PostgresLedger.run_from_async`), so a call that blocks (a user's HTTP call or query, a round trip on a
synchronous connection) would hold every run the loop serves. Made through `call_blocking` it runs on a worker
thread there, awaited through the portal; anywhere else (a sync node, a worker thread, SQLite's on-loop path,
which has no portal) it runs in place. Hand-written: greenback lets synchronous code await; where a blocking call
runs is ours to choose.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def call_blocking(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, on a worker thread when called inside greenback's portal on an event loop."""
    greenback = sys.modules.get("greenback")  # imported only with the Postgres ledger: without it, no portal
    if greenback is not None and greenback.has_portal():
        result: T = greenback.await_(asyncio.to_thread(function, *args))
        return result
    return function(*args)
