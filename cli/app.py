"""Opening what every CLI command works on: the database (a SQLite file or a Postgres URL), the demo tools' data
beside it, and the graph built over them; with the exit codes and the one-line errors these can raise.

Separate from `cli.main` so the `demo` command (cli/demo.py) opens the same app without importing the command
line it is part of.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.contract import POSTGRES_PREFIXES
from gatedloop.checkpoints.sqlite import open_sqlite_readonly
from gatedloop.demo import DemoStore, build_demo_tools, choose_model, demo_model, demo_policies
from gatedloop.graph import build_graph
from gatedloop.graph.build import with_saver
from gatedloop.graph.contexts import unreachable_roles
from gatedloop.graph.load import GraphNotFound, NamedGraph, choose_graph
from gatedloop.graph.parts_of import parts_of

EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED, EXIT_NOT_FOUND, EXIT_BUSY, EXIT_REFUSED = 0, 1, 2, 3, 4, 5, 6
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader closed the pipe
EXIT_CODES = {
    EXIT_COMPLETED: "completed (or the command did what it said)",
    EXIT_FAILED: "failed: the request stopped without an answer, or the database or model could not be used",
    EXIT_USAGE: "usage: a bad option, argument, thread id or JSON, or a model that is not configured",
    EXIT_PAUSED: "paused: the thread waits for a person (answer with gatedloop resume)",
    EXIT_NOT_FOUND: "not found: no such thread, or no database at --db",
    EXIT_BUSY: "busy: another process is running the thread or holds the database",
    EXIT_REFUSED: "refused: the answer was not accepted (malformed, not allowed, cancelled, or nothing pending)",
    EXIT_INTERRUPTED: "interrupted by Ctrl-C while running; resume goes on from the last saved step",
    EXIT_BROKEN_PIPE: "the output's reader closed it (e.g. | head); a run stopped at its last saved step",
}
DEMO_DATA_ENV = "GATEDLOOP_DEMO_DATA"


class CliError(Exception):
    """A failure the user can act on: printed as one line, exits with `code`."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class DatabaseUnavailable(RuntimeError):
    """The database named by --db / GATEDLOOP_DB cannot be opened."""


def is_postgres(db: str) -> bool:
    return db.startswith(POSTGRES_PREFIXES)


def shown_db(db: str) -> str:
    """The database as printed: a Postgres URL without its password."""
    if not is_postgres(db):
        return db
    parts = urlsplit(db)
    if parts.password is None:
        return db
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def demo_data_path(db: str) -> Path:
    """The demo tools' data: beside a SQLite database; for Postgres, `GATEDLOOP_DEMO_DATA` or the working folder."""
    if is_postgres(db):
        return Path(os.environ.get(DEMO_DATA_ENV) or "gatedloop.demo-data.sqlite")
    path = Path(db)
    return path.with_name(f"{path.stem}.demo-data.sqlite")


def require_db_folder(db: str) -> None:
    """A SQLite `--db` whose folder does not exist is refused: a mistyped path would otherwise become a new, empty
    database in a new folder (`open_sqlite` creates both), where the thread just run can never be found again."""
    if is_postgres(db) or db == ":memory:":
        return
    folder = Path(db).parent
    if not folder.is_dir():
        raise CliError(
            f"the folder {folder} of --db {db} does not exist: create it (mkdir -p {folder}) or fix --db "
            "(or GATEDLOOP_DB)",
            EXIT_NOT_FOUND,
        )


@contextmanager
def open_saver(db: str, *, read_only: bool = False) -> Iterator[Any]:
    """`open_sqlite(db)` (read-only: `open_sqlite_readonly`), or `open_postgres(db)` for a `postgresql://` URL."""
    if not is_postgres(db):
        require_db_folder(db)
        if read_only and not Path(db).is_file():
            raise CliError(f"no database at {db}: check --db (or GATEDLOOP_DB)", EXIT_NOT_FOUND)
        with ExitStack() as stack:
            try:
                saver = stack.enter_context(open_sqlite_readonly(db) if read_only else open_sqlite(db))
            except sqlite3.OperationalError as exc:
                raise DatabaseUnavailable(f"cannot open the database {db}: {exc}{writable_hint(exc)}") from exc
            yield saver
        return
    try:
        from psycopg import OperationalError

        from gatedloop.checkpoints.postgres import open_postgres
    except ImportError as exc:
        raise DatabaseUnavailable(
            f"{shown_db(db)} needs the postgres extra: pip install 'gatedloop[postgres]'"
        ) from exc
    with ExitStack() as stack:
        try:
            pg_saver = stack.enter_context(open_postgres(db))
        except OperationalError as exc:
            raise DatabaseUnavailable(f"cannot open {shown_db(db)}: {str(exc).strip().splitlines()[0]}") from exc
        yield pg_saver


def writable_hint(exc: sqlite3.OperationalError) -> str:
    text = str(exc)
    if "unable to open" in text or "readonly" in text:
        return " (the file and its folder must be writable; threads and show also read a read-only copy)"
    return ""


def demo_store(db: str) -> DemoStore:
    path = demo_data_path(db)
    try:
        return DemoStore(path)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            raise CliError(
                f"the demo tools' data file {path} is busy (another process holds it); try again", EXIT_BUSY
            ) from exc
        raise DatabaseUnavailable(f"cannot open the demo tools' data file {path} (beside --db): {exc}") from exc


def named_graph(given: str | None) -> NamedGraph | None:
    """The user's graph (`--graph`, `GATEDLOOP_GRAPH`, or the working folder's langgraph.json), or None: the demo."""
    try:
        return choose_graph(given, dict(os.environ), Path.cwd())
    except GraphNotFound as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc


def require_reachable_roles(named: NamedGraph) -> None:
    """The CLI and the inbox say who you are in the graph's context: in a schema without `roles`, `--roles` would
    be dropped and every role-based rule refuse everyone, one approval at a time. `build_graph` lets such a graph
    through without a checkpointer, as a served graph may take its roles from the server's auth; here none does."""
    parts = parts_of(named.graph)
    problem = unreachable_roles(parts.context_schema, parts.registry.policies) if parts is not None else None
    if problem is not None:
        raise CliError(f"--graph {named.reference}: {problem} (the CLI and the inbox send --roles there)", EXIT_USAGE)


@contextmanager
def open_app(
    db: str, *, named: NamedGraph | None = None, with_model: bool = True, read_only: bool = False
) -> Iterator[tuple[CompiledStateGraph, Any]]:
    """The CLI's graph over the database: the user's `named` graph, or else the demo (the configured model, the
    demo tools with their data beside the database). Commands that only read or flag threads
    (`with_model=False`) get the demo's offline model and leave its data file alone: reading state never calls
    either, so they need no API key and touch no data file. What the CLI prints is shown through
    `Display.for_graph(graph)`, which masks the graph's own `secret_args`. A graph that runs here must be able to
    receive the caller's roles (`require_reachable_roles`); reading a thread needs none."""
    if named is not None:
        if with_model:
            require_reachable_roles(named)
        with open_saver(db, read_only=read_only) as saver:
            yield with_saver(named.graph, saver), saver
        return
    model = choose_model() if with_model else demo_model()
    with open_saver(db, read_only=read_only) as saver:
        store = demo_store(db) if with_model else DemoStore(demo_data_path(db), prepare=False)
        policies = demo_policies(store)
        yield build_graph(model, build_demo_tools(store), policies=policies, checkpointer=saver), saver
