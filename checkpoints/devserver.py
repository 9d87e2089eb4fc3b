"""gatedloop's SQLite checkpointer for `langgraph dev` (the LangGraph API server's custom checkpointer hook).

Wire it in `langgraph.json` with a DOTTED path (module, then attribute; the `module:attr` form is read as a
file path by langgraph-api)::

    "checkpointer": {"path": "gatedloop.checkpoints.devserver.studio_checkpointer"}

What it needs:

* langgraph-api with custom-checkpointer support (checked with langgraph-cli 0.4.40 / langgraph-api 0.16.7);
  the server enters this async context manager once per event-loop thread and closes it on shutdown.
* `GATEDLOOP_DB`: the SQLite file (default `.gatedloop/studio.sqlite`, relative to the server's working
  directory; the parent folder is created), or a `postgresql://` URL: then checkpoints go to Postgres through
  `open_async_postgres` (needs the `postgres` extra). `gatedloop.demo.studio` puts its execution ledger in the same
  file by default, so checkpoints, ledger and audit trail live together as with `open_sqlite`.
* The graph itself is compiled with no checkpointer (the server refuses one that has its own).

The server's own records (threads, runs, assistants) stay in its in-memory runtime (`.langgraph_api/` in
its working directory); only checkpoints go to SQLite. The saver implements every method the server looks
for (`adelete_thread`, `adelete_for_runs` for `multitask_strategy="rollback"`, `acopy_thread` for
`threads.copy`, `aprune`), so it starts without warnings. The in-memory runtime itself refuses
`threads.prune(strategy="keep_latest")` (422) before it reaches the saver; `saver.prune` does it directly.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver

from gatedloop.checkpoints.contract import POSTGRES_PREFIXES
from gatedloop.checkpoints.ledger import Ledger, SqliteLedger
from gatedloop.checkpoints.sqlite import open_async_sqlite

DB_ENV = "GATEDLOOP_DB"
DEFAULT_DB = ".gatedloop/studio.sqlite"


def studio_db_path() -> Path:
    """The file `langgraph dev` keeps checkpoints (and, by default, the studio graph's ledger) in."""
    return Path(os.environ.get(DB_ENV) or DEFAULT_DB).expanduser()


@asynccontextmanager
async def studio_checkpointer() -> AsyncIterator[BaseCheckpointSaver]:
    """Open `open_async_sqlite(GATEDLOOP_DB, on_loop=False)` for the server's lifetime (WAL, busy timeout, ledger
    tables), or `open_async_postgres` when `GATEDLOOP_DB` is a Postgres URL."""
    target = os.environ.get(DB_ENV) or ""
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import open_async_postgres

        async with open_async_postgres(target) as pg_saver:
            yield pg_saver
        return
    # Through aiosqlite: the server's loop serves every client, and `langgraph dev` refuses blocking calls on it.
    async with open_async_sqlite(studio_db_path(), on_loop=False) as saver:
        yield saver


@lru_cache(maxsize=1)
def served_ledger() -> Ledger:
    """The ledger in the database `studio_checkpointer` keeps the server's checkpoints in (`GATEDLOOP_DB`), one per
    process: `build_graph(..., ledger=served_ledger())` names it explicitly. A graph built without a checkpointer
    finds the same ledger by itself, through the checkpointer each run is given (`ledger_for.LedgerOfTheRun`)."""
    target = os.environ.get(DB_ENV) or ""
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import PostgresLedger

        return PostgresLedger(target)
    path = studio_db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteLedger(path)
