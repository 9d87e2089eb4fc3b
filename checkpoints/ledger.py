"""The execution ledger: at most one start per (thread, tool call id), and what became of it.

A checkpoint is written after a step; a process can die between a tool changing the world and that
write. The ledger closes the gap: a write is *claimed* (a unique row) before it starts and *finished*
after, in the same database as the checkpoints. A claim with no outcome is an unknown outcome, never
a reason to run again. The same database holds the audit trail, cancellation requests and the notification
outbox (checkpoints/outbox.py).

One description for both backends: the schema (`SCHEMA`, SQLite's dialect; `POSTGRES_SCHEMA` derives
Postgres's from it) and every query (`SqlLedger`, with `?` placeholders) are written once. `SqliteLedger`
here and `PostgresLedger` (checkpoints/postgres.py) supply only the mechanics: connection, transaction,
placeholder, and how a claimant is named and checked.

Hand-written because no LangGraph or LangChain component records side-effect claims; the UNIQUE row per
(thread, call id) is the whole concurrency story (one INSERT wins, across threads, processes and hosts).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, ParamSpec, Protocol, Self, TypeVar

from gatedloop.checkpoints.approval_rounds import sqlite_rounds_upgrade, sqlite_rounds_view
from gatedloop.checkpoints.chain import (
    CHAIN_COLUMNS,
    CHAIN_SCHEMA,
    CHAINED,
    POSTGRES_LOCKED_HEAD_FUNCTION,
    ChainEntry,
    Report,
    Signer,
    Verifier,
    append,
    as_row,
    chained_statements,
    chained_table,
    chaining,
    drive,
    row_values,
    signer_from_env,
    verify_chain,
)
from gatedloop.checkpoints.evidence import (
    APPROVAL_COLUMNS,
    Answer,
    ApprovalRecord,
    AuditEvent,
    CallRecord,
    DeferredWriteError,
    EvidenceStore,
    GraphIdentity,
    NewCall,
    Proposal,
    audit_statements,
)
from gatedloop.checkpoints.evidence import SCHEMA as EVIDENCE_SCHEMA
from gatedloop.checkpoints.grants import SCHEMA as GRANTS_SCHEMA
from gatedloop.checkpoints.grants import ClaimTerms, Grant, GrantStore, LimitUsage, charge_limit, take_grant_use
from gatedloop.checkpoints.outbox import SCHEMA as OUTBOX_SCHEMA
from gatedloop.checkpoints.outbox import Notification, NotificationKind, OutboxStore, sqlite_kind_upgrade
from gatedloop.checkpoints.pruning import Statements
from gatedloop.checkpoints.witness import publish, witness_from_env

T = TypeVar("T")
P = ParamSpec("P")

FinishedState = Literal["done", "failed", "abandoned"]  # a finished row; `running.finished_state` maps outcomes
ClaimState = Literal["claimed", "done", "failed", "abandoned"]

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS gatedloop_ledger (
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('claimed', 'done', 'failed', 'abandoned')),
    result TEXT,
    claimed_at REAL NOT NULL,
    finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 1,
    claimant TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, call_id)
);
CREATE TABLE IF NOT EXISTS gatedloop_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    event TEXT NOT NULL,
    actor TEXT,
    at REAL NOT NULL,
    detail TEXT NOT NULL,
    UNIQUE (thread_id, call_id, event)
);
CREATE TABLE IF NOT EXISTS gatedloop_cancel (
    thread_id TEXT PRIMARY KEY,
    requested_at REAL NOT NULL
);
"""
    + EVIDENCE_SCHEMA
    + GRANTS_SCHEMA
    + OUTBOX_SCHEMA
    + CHAIN_SCHEMA
)
"""Every table of the ledger, in SQLite's dialect (the tables both backends have)."""

SQLITE_META_SCHEMA = """
CREATE TABLE IF NOT EXISTS gatedloop_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
"""SQLite only: where a lost and recreated ledger is remembered (`SqliteLedger.recreated`)."""

ABSENT_TABLES = "gatedloop_absent"
"""The empty tables a read-only ledger falls back on for tables its file predates (`SqliteLedger`)."""

# The two dialect differences, named: SQLite's REAL and AUTOINCREMENT key are Postgres's DOUBLE PRECISION
# and identity column.
POSTGRES_TYPES = (
    ("REAL", "DOUBLE PRECISION"),
    ("seq INTEGER PRIMARY KEY AUTOINCREMENT", "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
)


def postgres_statements(schema: str) -> list[str]:
    """A SQLite schema text as Postgres statements (psycopg runs one statement per `execute`)."""
    for sqlite_type, postgres_type in POSTGRES_TYPES:
        schema = schema.replace(sqlite_type, postgres_type)
    return [statement.strip() for statement in schema.split(";") if statement.strip()]


POSTGRES_SCHEMA = [*postgres_statements(SCHEMA), POSTGRES_LOCKED_HEAD_FUNCTION]

ENTRY_COLUMNS = (
    "thread_id, call_id, tool, args_digest, idempotency_key, state, result, claimed_at, finished_at, attempts, claimant"
)

LEDGER_LOST = (
    "the execution ledger (table gatedloop_ledger) is missing from {path}, which holds checkpoints: writes that "
    "were already started could run again. Restore it from a backup, or open with recreate_ledger=True: every "
    "write is then reconciled with its system before it runs"
)

BUSY_TIMEOUT_MS = 10_000


def switch_to_wal(conn: sqlite3.Connection) -> None:
    """`PRAGMA journal_mode=WAL`, retried for up to `BUSY_TIMEOUT_MS`: on a fresh file that another process is
    switching at the same moment, SQLite answers "database is locked" at once, without calling the busy handler
    (a lock escalation it refuses to wait on), so two servers or CLIs opening a new file together failed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class LedgerError(RuntimeError):
    """The ledger could not be read or written; nothing was half-recorded."""


@dataclass(frozen=True)
class LedgerEntry:
    thread_id: str
    call_id: str
    tool: str
    args_digest: str
    idempotency_key: str
    state: ClaimState
    result: str | None
    claimed_at: float
    finished_at: float | None
    attempts: int
    claimant: str


def _process_identity(pid: int) -> str:
    """host:pid:start-time, so a recycled pid is not mistaken for the process that made a claim."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            started = stat.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        started = "?"
    return f"{socket.gethostname()}:{pid}:{started}"


@functools.cache
def _claimant_for(pid: int) -> str:
    return _process_identity(pid)


def current_claimant() -> str:
    """This process's identity (recomputed after a fork, since the pid changes)."""
    return _claimant_for(os.getpid())


def claimant_alive(claimant: str) -> bool:
    """Whether the process that made a claim may still be running (unknown hosts count as alive; a killed
    process not yet reaped by its parent, a zombie, is dead)."""
    host, _, rest = claimant.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    return _process_identity(int(pid_text)) == claimant and _process_state(int(pid_text)) not in ("Z", "X")


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def idempotency_key(thread_id: str, call_id: str) -> str:
    """Stable for a tool call within its thread: the same on every retry, resume and process."""
    return hashlib.sha256(f"gatedloop:{thread_id}:{call_id}".encode()).hexdigest()[:32]


# What a copied thread carries from its source (`copy_thread` on the savers):
# - each started write's ledger row as it stands, with the key the write was started with, so a write done
#   in the source is reported in the copy and never run again (calls the copy starts get keys of its own id);
# - the call evidence (validation verdicts, the digest of each answer given), so the copied history is
#   gatedloop's own and not "foreign";
# - the approvals of writes started before the copy only (a person's, or the grant use a claim took): an approval
#   authorizes one write, so a gated call not started yet is asked again in the copy (it would run there under a
#   new key);
# - the graph that made it, its policies included (`gatedloop_thread_graphs`, `gatedloop_thread_policies`);
# - the audit trail. Cancel requests stay with the source.
LEDGER_COLUMNS_COPIED = (
    "call_id, tool, args_digest, idempotency_key, state, result, claimed_at, finished_at, attempts, claimant"
)
CALL_COLUMNS_COPIED = (
    "call_id, tool, args_digest, verdict, requester, requested_at, answer_digest, answer_source, answered_at"
)
AUDIT_COLUMNS_COPIED = "call_id, event, actor, at, detail"
EDITED_COLUMNS_COPIED = "call_id, args_digest, args"
GRANT_USE_COLUMNS_COPIED = "call_id, grant_id, args_digest, at"


def refuse_taken_copy_target(source: str, target: str, placeholder: str) -> Statements[None]:
    """`copy_thread`'s precondition on either backend: two different ids, and a target with no checkpoints and
    no ledger rows yet (`placeholder`: the backend's `?` or `%s`)."""
    if source == target:
        raise ValueError("copy_thread needs two different thread ids")
    p = placeholder
    taken = yield (
        f"SELECT 1 AS found FROM checkpoints WHERE thread_id = {p}"
        f" UNION ALL SELECT 1 FROM gatedloop_ledger WHERE thread_id = {p} LIMIT 1",
        (target, target),
        True,
    )
    if taken:
        raise ValueError(f"thread {target!r} already has checkpoints or ledger rows; copy into a new thread id")


def copy_ledger_rows(source: str, target: str, placeholder: str) -> Statements[None]:
    """INSERT ... SELECT statements copying a thread's ledger, evidence and audit rows (see above)."""
    p = placeholder
    copies: list[tuple[str, Sequence[Any]]] = []
    for statement in (
        f"INSERT INTO gatedloop_ledger (thread_id, {LEDGER_COLUMNS_COPIED}) "
        f"SELECT {p}, {LEDGER_COLUMNS_COPIED} FROM gatedloop_ledger WHERE thread_id = {p}",
        f"INSERT INTO gatedloop_calls (thread_id, {CALL_COLUMNS_COPIED}) "
        f"SELECT {p}, {CALL_COLUMNS_COPIED} FROM gatedloop_calls WHERE thread_id = {p}",
        f"INSERT INTO gatedloop_approvals (thread_id, {APPROVAL_COLUMNS}) "
        f"SELECT {p}, {APPROVAL_COLUMNS} FROM gatedloop_approvals a WHERE a.thread_id = {p} AND EXISTS "
        "(SELECT 1 FROM gatedloop_ledger l WHERE l.thread_id = a.thread_id AND l.call_id = a.call_id) ORDER BY seq",
        f"INSERT INTO gatedloop_grant_uses (thread_id, {GRANT_USE_COLUMNS_COPIED}) "
        f"SELECT {p}, {GRANT_USE_COLUMNS_COPIED} FROM gatedloop_grant_uses u WHERE u.thread_id = {p} AND EXISTS "
        "(SELECT 1 FROM gatedloop_ledger l WHERE l.thread_id = u.thread_id AND l.call_id = u.call_id)",
        f"INSERT INTO gatedloop_edited_args (thread_id, {EDITED_COLUMNS_COPIED}) "
        f"SELECT {p}, {EDITED_COLUMNS_COPIED} FROM gatedloop_edited_args e WHERE e.thread_id = {p} AND EXISTS "
        "(SELECT 1 FROM gatedloop_ledger l WHERE l.thread_id = e.thread_id AND l.call_id = e.call_id) ORDER BY seq",
        f"INSERT INTO gatedloop_tool_pins (thread_id, call_id, tool_digest) "
        f"SELECT {p}, call_id, tool_digest FROM gatedloop_tool_pins WHERE thread_id = {p}",
        f"INSERT INTO gatedloop_thread_graphs (thread_id, graph_name, graph_digest, recorded_at) "
        f"SELECT {p}, graph_name, graph_digest, recorded_at FROM gatedloop_thread_graphs WHERE thread_id = {p}",
        f"INSERT INTO gatedloop_thread_policies (thread_id, policy_digest, policies, recorded_at) "
        f"SELECT {p}, policy_digest, policies, recorded_at FROM gatedloop_thread_policies WHERE thread_id = {p}",
        f"INSERT INTO gatedloop_audit (thread_id, {AUDIT_COLUMNS_COPIED}) "
        f"SELECT {p}, {AUDIT_COLUMNS_COPIED} FROM gatedloop_audit WHERE thread_id = {p} ORDER BY seq",
    ):
        copies.append((statement, (target, source)))
    # The copied rows are new evidence rows of the target thread: chained like any other, in this transaction.
    yield from chained_statements(placeholder, placeholder == "%s", copies, None, started=False)


def _claim_steps(
    thread_id: str, call_id: str, tool: str, args_digest: str, claimant: str, terms: ClaimTerms
) -> Statements[LedgerEntry | None]:
    """A claim, and only if it is new, the grant's use and the limits' charges it comes with (`SqlLedger.claim`):
    the new claim as stored (the chain's RETURNING gives its row), or None if the call was claimed before."""
    now = time.time()
    claimed = yield (
        "INSERT INTO gatedloop_ledger (thread_id, call_id, tool, args_digest, idempotency_key, state, claimed_at,"
        " claimant) VALUES (?, ?, ?, ?, ?, 'claimed', ?, ?) ON CONFLICT (thread_id, call_id) DO NOTHING",
        (thread_id, call_id, tool, args_digest, idempotency_key(thread_id, call_id), now, claimant),
        True,
    )
    if not claimed:
        return None
    if terms.grants:
        yield from take_grant_use(thread_id, call_id, args_digest, terms.grants, now)
    for charge in terms.charges:
        yield from charge_limit(tool, charge, now, terms.past_limit)
    return LedgerEntry(*row_values(claimed[0]))


class Claims(Protocol):
    """The at-most-once record of each write: its claim before it starts, its outcome when it finishes.

    `claimant` names this process in the claims it makes, in a form `claimant_alive` of any process using
    the same ledger can check: host:pid:start-time for SQLite (one host), a held advisory lock for Postgres.
    """

    @property
    def claimant(self) -> str: ...
    @property
    def recreated(self) -> bool:
        """True once the ledger was lost and recreated: a won claim may then be a write that already happened."""
        ...

    def claimant_alive(self, claimant: str) -> bool: ...
    def claim(
        self, thread_id: str, call_id: str, tool: str, args_digest: str, terms: ClaimTerms | None = None
    ) -> tuple[bool, LedgerEntry]: ...
    def reclaim(self, thread_id: str, call_id: str, seen_attempts: int) -> bool: ...
    def finish(self, thread_id: str, call_id: str, state: FinishedState, result: Any) -> None: ...
    def get(self, thread_id: str, call_id: str) -> LedgerEntry | None: ...
    def entries(self, thread_id: str) -> list[LedgerEntry]: ...


class Audit(Protocol):
    """The audit trail: one row per event worth an operator's attention, kept once per (call, event)."""

    def record(
        self, thread_id: str, call_id: str, event: str, detail: dict[str, Any], actor: str | None = None
    ) -> None: ...
    def audit(self, thread_id: str) -> list[dict[str, Any]]: ...
    def has_event(self, thread_id: str, call_id: str, event: str) -> bool: ...


class CancelFlags(Protocol):
    """A thread's cancel request, read at each node boundary."""

    def request_cancel(self, thread_id: str) -> None: ...
    def cancel_requested(self, thread_id: str) -> bool: ...
    def clear_cancel(self, thread_id: str) -> None: ...


class Evidence(Protocol):
    """What the gate weighs the state against: proposals, each call's registration and answer, reviewers'
    decisions (and extensions), and edits of secret arguments."""

    def record_proposals(self, thread_id: str, proposals: Iterable[Proposal]) -> None: ...
    def proposals(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, Proposal]: ...
    def register_calls(
        self, thread_id: str, calls: Iterable[NewCall], events: Sequence[AuditEvent] = ()
    ) -> dict[str, CallRecord]: ...
    def calls(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, CallRecord]: ...
    def record_answers(self, thread_id: str, answers: Iterable[Answer], events: Sequence[AuditEvent] = ()) -> None: ...
    def answer_digests(self, thread_id: str, call_ids: Sequence[str] | None = None) -> dict[str, str]: ...
    def record_approvals(
        self, thread_id: str, records: Sequence[ApprovalRecord], events: Sequence[AuditEvent] = ()
    ) -> None: ...
    def approvals(self, thread_id: str, call_ids: Sequence[str]) -> list[ApprovalRecord]: ...
    def replaced_request(self, thread_id: str, requested_at: float) -> bool: ...
    def record_edited_args(self, thread_id: str, edits: Sequence[tuple[str, str, dict[str, Any]]]) -> None: ...
    def edited_args(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...


class ThreadGraphs(Protocol):
    """Which graph (and policies) made each thread, so another never resumes it unnoticed."""

    def thread_graph(self, thread_id: str) -> GraphIdentity | None: ...
    def record_thread_graph(
        self, thread_id: str, graph: GraphIdentity, *, replace: bool = False, events: Sequence[AuditEvent] = ()
    ) -> None: ...


class Outbox(Protocol):
    """The notification outbox the gate writes (a deliverer reads and sends it: `SqlLedger`'s `OutboxStore`)."""

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
    ) -> bool: ...
    def extend_notification(self, thread_id: str, request_id: str, until: float) -> bool: ...
    def notification(self, notice_id: str) -> Notification | None: ...


class Grants(Protocol):
    """Standing grants and the counters of limits across threads (checkpoints/grants.py); a claim takes a grant's
    use and charges limits itself (`Claims.claim`'s `terms`)."""

    def create_grant(
        self, grant: Grant, roles: frozenset[str], detail: Mapping[str, Any], shown: Mapping[str, Any] | None = None
    ) -> None: ...
    def confirm_grant(
        self, grant_id: str, granter: str, roles: frozenset[str], at: float, shown: Mapping[str, Any] | None = None
    ) -> bool: ...
    def revoke_grant(self, grant_id: str, by: str, at: float, shown: Mapping[str, Any] | None = None) -> bool: ...
    def grants(self, tools: Sequence[str] | None = None, *, open_at: float | None = None) -> list[Grant]: ...
    def grant(self, grant_id: str) -> Grant | None: ...
    def grant_uses(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, tuple[str, str]]: ...
    def limit_usage(self, since: float | None = None) -> list[LimitUsage]: ...


class Ledger(Claims, Audit, CancelFlags, Evidence, ThreadGraphs, Outbox, Grants, Protocol):
    """What the graph needs from a ledger, every part of it; `SqliteLedger` here, `PostgresLedger` for Postgres.
    A function that needs one part names that part (`Claims`, `Evidence`, ...), so what it may touch is in its
    signature; docs/development.md says how to add a backend."""

    async def run_from_async(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`work`, synchronous code that uses this ledger, run from async code (an async node, `GatedGraph.astream`)
        so that none of the ledger's waits holds the event loop: in place where a statement costs less than a
        hand-off (`SqlLedger.run_from_async`), each statement awaited on an async driver (`PostgresLedger`), or on
        a worker thread."""
        ...

    def one_commit(self) -> AbstractContextManager[Ledger]:
        """A view whose writes are committed together when the block ends (`SqlLedger.one_commit`)."""
        ...


class SqlLedger(EvidenceStore, OutboxStore, GrantStore):
    """Every ledger query (with the evidence's and the outbox's), written once with `?` placeholders, over a
    backend's mechanics: `_run` (the rows of one read), `_write_plain` (one atomic write; the number of rows it
    changed), `_transaction` (a statements generator run in one transaction), and the claimant's name and
    liveness check.

    Every write to an evidence or audit table goes through `_chained`: in the same transaction, each row written
    is appended to the evidence chain (checkpoints/chain.py), and the head is signed after a decision when a key
    is configured (`signer`: `GATEDLOOP_SIGNING_KEY` unless set); each head signed is then appended to the witness
    file, if there is one (`witness`: `GATEDLOOP_AUDIT_WITNESS` unless set; checkpoints/witness.py)."""

    recreated = False
    """See `Ledger.recreated`; only `SqliteLedger` can tell that its ledger was lost."""

    postgres = False
    """Whether appenders must take the chain's advisory lock (Postgres); SQLite's write lock serializes them."""

    on_loop = False
    """Whether `run_from_async` runs work in place, on the event loop's thread: True only for the ledger of
    `open_async_sqlite`'s on-loop saver (a local SQLite file whose every statement runs there)."""

    _chain_started = False
    _signer: Signer | None = None
    _signer_loaded = False
    _witness: str | None = None
    _witness_loaded = False
    _pending: list[tuple[str, Sequence[Any]]] | None = None
    """On a view from `one_commit`: the writes waiting for its commit (None: each write commits at once)."""

    @property
    def signer(self) -> Signer | None:
        """The key that signs chain heads (None: the chain is hash-checked only)."""
        if not self._signer_loaded:
            self._signer, self._signer_loaded = signer_from_env(), True
        return self._signer

    @signer.setter
    def signer(self, value: Signer | None) -> None:
        self._signer, self._signer_loaded = value, True

    @property
    def witness(self) -> str | None:
        """The file each signed head is appended to once committed (None: heads stay in the database only)."""
        if not self._witness_loaded:
            self._witness, self._witness_loaded = witness_from_env(), True
        return self._witness

    @witness.setter
    def witness(self, value: str | None) -> None:
        self._witness, self._witness_loaded = value, True

    async def run_from_async(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """See `Ledger.run_from_async`: in place on an on-loop ledger, else on a worker thread (`asyncio.to_thread`,
        the caller's context copied)."""
        if self.on_loop:
            return work(*args, **kwargs)
        return await asyncio.to_thread(work, *args, **kwargs)

    def _write_plain(self, query: str, params: Sequence[Any]) -> int:
        raise NotImplementedError

    def _transaction(self, statements: Statements[T]) -> T:
        raise NotImplementedError

    def _write(self, query: str, params: Sequence[Any]) -> int:
        """One atomic write; the number of rows it changed (an evidence write is chained with its row). On a view
        from `one_commit`, a write whose count matters cannot wait for the commit: use `_write_or_defer`."""
        if self._pending is not None:
            raise DeferredWriteError("a write whose row count is read cannot wait for one_commit's commit")
        if chained_table(query) is None:
            return self._write_plain(query, params)
        return self._chained([(query, params)])

    @property
    def _defers_writes(self) -> bool:
        return self._pending is not None

    def _write_or_defer(self, query: str, params: Sequence[Any]) -> bool:
        """One write whose count nobody reads: now, or with the commit of a `one_commit` view (True: deferred)."""
        if self._pending is not None:
            self._pending.append((query, params))
            return True
        self._write(query, params)
        return False

    def _run_batch(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        if self._pending is not None:
            self._pending.extend(statements)
        elif statements:
            self._chained(statements)

    @contextmanager
    def one_commit(self) -> Iterator[Self]:
        """A view of this ledger for one decision: every write made through it (evidence, audit rows, notices) is
        committed once, in one transaction, when the block ends without an exception, and none if it raises; a
        crash lands between decisions, never inside one (issue 52). Its reads see what is committed, not its own
        pending writes, so a decision reads first and writes last; a write whose result is read (a claim, a
        registration) refuses to wait (`DeferredWriteError`). Taken on a view, it is that view: one commit."""
        if self._pending is not None:  # already a view: its writes join the commit it waits for
            yield self
            return
        view = copy.copy(self)
        view._pending = []
        yield view
        if view._pending:
            self._chained(view._pending)

    def _chained(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> int:
        done = self._transaction(
            chained_statements("?", self.postgres, statements, self.signer, started=self._chain_started)
        )
        self._chain_started = True
        publish(self.witness, done.signed)
        return done.written

    def _steps(self, body: Statements[T]) -> T:
        """`body` in one transaction, each evidence row it writes chained (`chain.chaining`); what it returned. An
        exception from `body` rolls the whole transaction back and is raised here."""
        if self._pending is not None:
            raise DeferredWriteError("a transaction whose result is read cannot wait for one_commit's commit")
        result, done = self._transaction(chaining("?", self.postgres, body, self.signer, started=self._chain_started))
        self._chain_started = True
        publish(self.witness, done.signed)
        return result

    def sign_head(self) -> int:
        """Sign the chain's head now (`gatedloop audit sign`); its seq (0: no chain yet). Needs a key."""
        if self.signer is None:
            raise LedgerError("no signing key: set GATEDLOOP_SIGNING_KEY (see `gatedloop keys init`)")
        done = self._transaction(append("?", self.postgres, [], self.signer, sign=True))
        publish(self.witness, done.signed)
        return done.head

    def chain(self, since_seq: int = 0) -> list[ChainEntry]:
        rows = self._run(f"SELECT {CHAIN_COLUMNS} FROM gatedloop_chain WHERE seq > ? ORDER BY seq", (since_seq,))
        return [ChainEntry(int(s), t, k, c, p, h, float(at), sig) for s, t, k, c, p, h, at, sig in rows]

    def chained_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of an evidence table, as the chain hashes it."""
        return [as_row(table, row) for row in self._run(f"SELECT {', '.join(CHAINED[table].columns)} FROM {table}", ())]

    def verify_chain(self, verifier: Verifier | None = None) -> Report:
        """Check every chain entry, hash and signature against the rows as they are (see `chain.verify_chain`)."""
        return verify_chain(self.chain(), self.chained_rows, verifier)

    @property
    def claimant(self) -> str:
        raise NotImplementedError

    def claimant_alive(self, claimant: str) -> bool:
        raise NotImplementedError

    def claim(
        self, thread_id: str, call_id: str, tool: str, args_digest: str, terms: ClaimTerms | None = None
    ) -> tuple[bool, LedgerEntry]:
        """Claim the right to start this call. Returns (True, entry) for the one winner, else the existing row.

        With `terms`, a new claim also takes a use of a grant and charges limits, in the same transaction: if it
        cannot (`grants.ClaimRefused`), nothing is written, the claim included, and the exception is raised. A claim
        that already existed takes and charges nothing (its first claim did)."""
        claimant = self.claimant  # on Postgres a round trip of its own: before the transaction, not inside it
        new = self._steps(_claim_steps(thread_id, call_id, tool, args_digest, claimant, terms or ClaimTerms()))
        if new is not None:
            return True, new
        existing = self.get(thread_id, call_id)
        assert existing is not None
        return False, existing

    def reclaim(self, thread_id: str, call_id: str, seen_attempts: int) -> bool:
        """Allow one more start of a call known not to have happened (reconciled, or decided by a person).

        Conditional on the attempt count the caller saw, so of two resumers only one starts it again.
        """
        changed = self._write(
            "UPDATE gatedloop_ledger SET attempts=attempts+1, claimed_at=?, claimant=? "
            "WHERE thread_id=? AND call_id=? AND state='claimed' AND attempts=?",
            (time.time(), self.claimant, thread_id, call_id, seen_attempts),
        )
        return changed == 1

    def finish(self, thread_id: str, call_id: str, state: FinishedState, result: Any) -> None:
        """Record how the claimed call finished, once; a second finish of the same call is ignored."""
        self._write_or_defer(
            "UPDATE gatedloop_ledger SET state=?, result=?, finished_at=? "
            "WHERE thread_id=? AND call_id=? AND state='claimed'",
            (state, json.dumps(result, ensure_ascii=False, default=str), time.time(), thread_id, call_id),
        )

    def get(self, thread_id: str, call_id: str) -> LedgerEntry | None:
        rows = self._run(
            f"SELECT {ENTRY_COLUMNS} FROM gatedloop_ledger WHERE thread_id=? AND call_id=?", (thread_id, call_id)
        )
        return LedgerEntry(*rows[0]) if rows else None

    def entries(self, thread_id: str) -> list[LedgerEntry]:
        rows = self._run(
            f"SELECT {ENTRY_COLUMNS} FROM gatedloop_ledger WHERE thread_id=? ORDER BY claimed_at", (thread_id,)
        )
        return [LedgerEntry(*row) for row in rows]

    def record(
        self, thread_id: str, call_id: str, event: str, detail: dict[str, Any], actor: str | None = None
    ) -> None:
        """Append an audit event; the same (call, event) is kept once, so re-run nodes do not duplicate it."""
        self._write_or_defer(*audit_statements(thread_id, [AuditEvent(call_id, event, detail, actor)])[0])

    def audit(self, thread_id: str) -> list[dict[str, Any]]:
        rows = self._run(
            "SELECT call_id, event, actor, at, detail FROM gatedloop_audit WHERE thread_id=? ORDER BY seq", (thread_id,)
        )
        return [{"call_id": c, "event": e, "actor": a, "at": at, "detail": json.loads(d)} for c, e, a, at, d in rows]

    def has_event(self, thread_id: str, call_id: str, event: str) -> bool:
        """Whether this (call, event) is recorded: one lookup on the trail's unique key, not the thread's trail."""
        query = "SELECT 1 FROM gatedloop_audit WHERE thread_id=? AND call_id=? AND event=?"
        return bool(self._run(query, (thread_id, call_id, event)))

    def request_cancel(self, thread_id: str) -> None:
        self._write(
            "INSERT INTO gatedloop_cancel (thread_id, requested_at) VALUES (?, ?)"
            " ON CONFLICT (thread_id) DO UPDATE SET requested_at=excluded.requested_at",
            (thread_id, time.time()),
        )

    def cancel_requested(self, thread_id: str) -> bool:
        return bool(self._run("SELECT 1 FROM gatedloop_cancel WHERE thread_id=?", (thread_id,)))

    def clear_cancel(self, thread_id: str) -> None:
        """Every new request does this: read first, so the usual case (no cancel) takes no write lock."""
        if self.cancel_requested(thread_id):
            self._write("DELETE FROM gatedloop_cancel WHERE thread_id=?", (thread_id,))

    def thread_ids(self) -> list[str]:
        """Threads with a checkpoint in the database beside the ledger (LangGraph's `checkpoints` table, which
        both backends name and key alike), oldest activity first."""
        rows = self._run(
            "SELECT thread_id FROM checkpoints WHERE checkpoint_ns='' GROUP BY thread_id ORDER BY MAX(checkpoint_id)",
            (),
        )
        return [row[0] for row in rows]


class SqliteLedger(SqlLedger):
    """Ledger, audit trail and cancel flags in one SQLite file (usually the checkpoint file)."""

    def __init__(
        self,
        path: str | Path,
        *,
        recreate: bool = False,
        connection: sqlite3.Connection | None = None,
        on_loop: bool = False,
    ):
        self.path, self.on_loop = str(path), on_loop
        if connection is not None:
            # Read-only use (`open_sqlite_readonly`): the caller's connection, nothing created or changed.
            self._lock, self._conn = threading.Lock(), connection
            self._write_lock, self._writer = self._lock, self._conn
            self._read_missing_tables_as_empty()
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if self.path != ":memory:":
            switch_to_wal(self._conn)
            # As the checkpointer's connection: a commit survives the process being killed (the threat the
            # ledger answers); FULL would add an fsync per commit, several per turn.
            self._conn.execute("PRAGMA synchronous=NORMAL")
        with self._lock:
            lost = self._missing("gatedloop_ledger") and not self._missing("checkpoints") and self._has_checkpoints()
            if lost and not recreate:
                self._conn.close()
                raise LedgerError(LEDGER_LOST.format(path=self.path))
            self._conn.executescript(SCHEMA + SQLITE_META_SCHEMA)
            sqlite_kind_upgrade(self._conn)
            sqlite_rounds_upgrade(self._conn)
            if lost:
                self._conn.execute(
                    "INSERT OR REPLACE INTO gatedloop_meta (key, value) VALUES ('recreated_at', ?)", (str(time.time()),)
                )
            row = self._conn.execute("SELECT 1 FROM gatedloop_meta WHERE key='recreated_at'").fetchone()
            wal = self._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        self.recreated = row is not None
        self._write_lock, self._writer = self._lock, self._conn
        if wal:
            # Writes get a connection of their own that waits for the write lock in short steps (`_begin`), and
            # reads no longer queue behind a write that waits.
            self._write_lock = threading.Lock()
            self._writer = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._writer.execute("PRAGMA busy_timeout=0")
            self._writer.execute("PRAGMA synchronous=NORMAL")

    @property
    def claimant(self) -> str:
        return current_claimant()

    def claimant_alive(self, claimant: str) -> bool:
        return claimant_alive(claimant)

    def _read_missing_tables_as_empty(self) -> None:
        """A file written before a table existed (by an older gatedloop, never opened for writing since) reads as if
        that table were empty, and nothing is written to it: the whole schema in an in-memory database attached
        behind the file's own, where SQLite finds a table the file lacks (an unqualified name resolves to the
        main database first, then to attached ones in the order attached); a table it has without a column added
        since reads with it, at its default (`approval_rounds.sqlite_rounds_view`)."""
        self._conn.execute(f"ATTACH DATABASE ':memory:' AS {ABSENT_TABLES}")
        self._conn.executescript(SCHEMA.replace("CREATE TABLE IF NOT EXISTS ", f"CREATE TABLE {ABSENT_TABLES}."))
        sqlite_rounds_view(self._conn)

    def _missing(self, table: str) -> bool:
        found = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
        return found is None

    def _has_checkpoints(self) -> bool:
        return self._conn.execute("SELECT 1 FROM checkpoints LIMIT 1").fetchone() is not None

    def close(self) -> None:
        with self._write_lock:
            if self._writer is not self._conn:
                self._writer.close()
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (`BEGIN IMMEDIATE`) so it never fails half-way on a lock."""
        with self._write_lock:
            conn = self._writer
            try:
                self._begin()
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _begin(self) -> None:
        """`BEGIN IMMEDIATE`; on the writer's own connection (WAL), waiting for another writer in steps of 50 us to
        5 ms for up to the busy timeout. SQLite's busy handler sleeps 1, 2, 5, 10 ms... between tries, so a lock
        held for 100 us (the checkpoint write LangGraph makes in the background) cost a whole millisecond: about one
        ledger transaction per approval turn. Once begun, a WAL transaction takes no other lock: its statements
        and COMMIT never wait, so the connection's busy timeout of 0 is only ever met here."""
        if self._writer is self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            return
        deadline, pause = time.monotonic() + BUSY_TIMEOUT_MS / 1000, 50e-6
        while True:
            try:
                self._writer.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _run(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(query, tuple(params)).fetchall()

    def _write_plain(self, query: str, params: Sequence[Any]) -> int:
        with self._tx() as conn:
            return conn.execute(query, tuple(params)).rowcount

    def _transaction(self, statements: Statements[T]) -> T:
        """The statements in one `BEGIN IMMEDIATE` transaction: the write lock is held from the first statement,
        so the chain's head read and append cannot interleave with another writer."""
        with self._tx() as conn:

            def execute(query: str, params: Sequence[Any], fetch: bool) -> list[Any]:
                cursor = conn.execute(query, tuple(params))
                return cursor.fetchall() if fetch else []

            return drive(execute, statements)

    def thread_ids(self) -> list[str]:
        """See `SqlLedger.thread_ids`; a file without LangGraph's tables (yet) has no threads."""
        with self._lock:
            missing = self._missing("checkpoints")
        return [] if missing else super().thread_ids()
