"""Evidence kept outside the graph state: which calls a model proposed, which were validated, who decided what,
which answer each got.

Anything in the state can be rewritten (`update_state`, LangGraph Server's state API, a bug), so the gate does
not trust it. `model` records the calls each model response proposed (`validate` accepts no other), `validate`
registers each call it accepted (tool, exact-argument digest, requester, verdict), `approve` records each
accepted decision (reviewer identity from the runtime context, never from the answer) and, for a tool with
`secret_args`, the arguments a reviewer's edit produced (the state holds them masked), and every node that
answers a call records the digest of that answer. `execute` runs a call only against these rows, and a
`ToolMessage` whose digest is not recorded is foreign and dropped.

One description for both backends: the tables (in SQLite's dialect, part of the ledger's `SCHEMA`) and the
queries are written once with `?` placeholders; each ledger supplies `_run(query, params)` (one read) and
`_run_batch` (writes in one transaction).
Hand-written because no LangGraph component keeps per-call approval evidence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gatedloop.checkpoints.approval_rounds import APPROVALS_TABLE, ROUND_COLUMN, ROUND_KEY, ROUND_OF_INSERT
from gatedloop.checkpoints.review_stats import ReviewHistory, review_history
from gatedloop.tools.policy import CallContext

CallVerdict = Literal["run", "ask", "refused"]

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS gatedloop_calls (
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    verdict TEXT NOT NULL,
    requester TEXT NOT NULL,
    requested_at REAL NOT NULL,
    answer_digest TEXT,
    answer_source TEXT,
    answered_at REAL,
    PRIMARY KEY (thread_id, call_id)
);
CREATE TABLE IF NOT EXISTS gatedloop_proposals (
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    proposed_at REAL NOT NULL,
    PRIMARY KEY (thread_id, call_id)
);
"""
    + APPROVALS_TABLE
    + """CREATE TABLE IF NOT EXISTS gatedloop_tool_pins (
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool_digest TEXT NOT NULL,
    PRIMARY KEY (thread_id, call_id)
);
CREATE TABLE IF NOT EXISTS gatedloop_thread_graphs (
    thread_id TEXT PRIMARY KEY,
    graph_name TEXT NOT NULL,
    graph_digest TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS gatedloop_thread_policies (
    thread_id TEXT PRIMARY KEY,
    policy_digest TEXT NOT NULL,
    policies TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS gatedloop_edited_args (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    args TEXT NOT NULL,
    UNIQUE (thread_id, call_id, args_digest)
);
"""
)

SUPERSEDED_SOURCE = "superseded"
"""`answer_source` of a call answered because a new user message arrived while it was open."""

CALL_COLUMNS = "call_id, tool, args_digest, verdict, requester, requested_at, answer_digest, answer_source"
APPROVAL_COLUMNS = f"call_id, tool, args_digest, reviewer, roles, decision, at, {ROUND_COLUMN}"


def requester_json(who: CallContext) -> str:
    """Who proposed a call (the runtime context of the run that validated it), as the ledger stores it."""
    body = {"user_id": who.user_id, "roles": sorted(who.roles), "extra": dict(who.extra)}
    return json.dumps(body, ensure_ascii=False, default=str, sort_keys=True)


def requester_from_json(text: str) -> CallContext:
    body = json.loads(text)
    return CallContext(body.get("user_id"), frozenset(body.get("roles") or ()), body.get("extra") or {})


@dataclass(frozen=True)
class CallRecord:
    """A call as `validate` accepted or refused it, and the answer it got (if any)."""

    call_id: str
    tool: str
    args_digest: str
    verdict: CallVerdict
    requester: CallContext
    requested_at: float
    answer_digest: str | None
    answer_source: str | None
    tool_digest: str | None = None  # the tool's definition when validated (None: before pins, or refused)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> CallRecord:
        call_id, tool, digest, verdict, requester, requested_at, answer_digest, answer_source, pin = row
        who = requester_from_json(requester)
        return cls(call_id, tool, digest, verdict, who, requested_at, answer_digest, answer_source, pin)


@dataclass(frozen=True)
class ApprovalRecord:
    """One accepted decision by one identified reviewer on one exact set of arguments."""

    call_id: str
    tool: str
    args_digest: str
    reviewer: str
    roles: frozenset[str]
    decision: str
    at: float
    sent_back_round: int = 0
    """How many times the call had been sent back to a person before it: the ledger sets it as it records the
    decision (checkpoints/approval_rounds.py); a record not read from the ledger holds 0."""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ApprovalRecord:
        call_id, tool, digest, reviewer, roles, decision, at, sent_back_round = row
        return cls(call_id, tool, digest, reviewer, frozenset(json.loads(roles)), decision, at, int(sent_back_round))


@dataclass(frozen=True)
class GraphIdentity:
    """The graph that made a thread: its name, a digest of its tools (names, descriptions, argument schemas,
    annotations) and a digest of their policies (`ToolPolicy.summary` per tool), with those summaries.

    Two identities are the same graph when name and both digests are equal (`policies` is what the digest is
    of, kept to say what changed). The policies live in a table of their own (`gatedloop_thread_policies`) beside
    `gatedloop_thread_graphs`, whose rows and columns stay as they were: a thread recorded before policies were
    reads back with `policy_digest=None`, and is never the same graph as one whose policies are known (see
    `gatedloop.graph.thread_graph.claim_thread`)."""

    name: str
    digest: str
    policy_digest: str | None = None
    policies: Mapping[str, Mapping[str, Any]] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.name!r} ({self.digests()})"

    def digests(self) -> str:
        """Its digests, short: all that tells apart two graphs of one name."""
        policies = f"policies {self.policy_digest[:8]}" if self.policy_digest else "policies not recorded"
        return f"tools {self.digest[:8]}, {policies}"


@dataclass(frozen=True)
class Proposal:
    """One call of a model response, as the `model` node received it."""

    call_id: str
    tool: str
    args_digest: str


@dataclass(frozen=True)
class NewCall:
    call_id: str
    tool: str
    args_digest: str
    verdict: CallVerdict
    requester: CallContext
    tool_digest: str = ""  # the tool's definition when the call was validated (pinned; "" for a refused call)


@dataclass(frozen=True)
class Answer:
    call_id: str
    tool: str
    digest: str
    source: str


@dataclass(frozen=True)
class AuditEvent:
    """An audit-trail entry, written in the same transaction as the evidence it describes."""

    call_id: str
    event: str
    detail: dict[str, Any]
    actor: str | None = None


AUDIT_INSERT = (
    "INSERT INTO gatedloop_audit (thread_id, call_id, event, actor, at, detail) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, call_id, event) DO NOTHING"
)
"""The same (call, event) is kept once, so re-run nodes do not duplicate it."""


def audit_statements(thread_id: str, events: Iterable[AuditEvent]) -> list[tuple[str, Sequence[Any]]]:
    now = time.time()
    return [
        (
            AUDIT_INSERT,
            (thread_id, e.call_id, e.event, e.actor, now, json.dumps(e.detail, ensure_ascii=False, default=str)),
        )
        for e in events
    ]


def placeholders(count: int) -> str:
    return ", ".join("?" for _ in range(count))


class DeferredWriteError(RuntimeError):
    """A write whose result is read was made on a `one_commit` view, whose writes wait for its commit."""


class EvidenceStore:
    """The evidence queries, over a backend's `_run(query, params) -> rows` (one read) and `_run_batch`."""

    def _run(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _run_batch(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Several writes in one transaction (one commit per node, not one per call)."""
        raise NotImplementedError

    @property
    def _defers_writes(self) -> bool:
        """Whether this is a `one_commit` view, whose writes wait for its commit."""
        return False

    def record_proposals(self, thread_id: str, proposals: Iterable[Proposal]) -> None:
        """The calls a model response proposed. A `model` node run again after a crash (its response never reached
        a checkpoint) replaces them: the response that enters the history is the last one recorded."""
        now = time.time()
        self._run_batch(
            [
                (
                    "INSERT INTO gatedloop_proposals (thread_id, call_id, tool, args_digest, proposed_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (thread_id, call_id) DO UPDATE SET tool=excluded.tool,"
                    " args_digest=excluded.args_digest, proposed_at=excluded.proposed_at",
                    (thread_id, p.call_id, p.tool, p.args_digest, now),
                )
                for p in proposals
            ]
        )

    def proposals(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, Proposal]:
        if not call_ids:
            return {}
        rows = self._run(
            "SELECT call_id, tool, args_digest FROM gatedloop_proposals WHERE thread_id=? AND call_id IN"
            f" ({placeholders(len(call_ids))})",
            (thread_id, *call_ids),
        )
        return {row[0]: Proposal(*row) for row in rows}

    def register_calls(
        self, thread_id: str, calls: Iterable[NewCall], events: Sequence[AuditEvent] = ()
    ) -> dict[str, CallRecord]:
        """Record calls as validated, with the definition of their tool (pinned), and the audit `events` of their
        validation, in one transaction; a call id registered before keeps its first record and pin (returned as
        is)."""
        if self._defers_writes:
            raise DeferredWriteError("register_calls reads back what it wrote: call it outside one_commit")
        now = time.time()
        calls = list(calls)
        pins: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO gatedloop_tool_pins (thread_id, call_id, tool_digest) VALUES (?, ?, ?)"
                " ON CONFLICT (thread_id, call_id) DO NOTHING",
                (thread_id, c.call_id, c.tool_digest),
            )
            for c in calls
            if c.tool_digest
        ]
        registered: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO gatedloop_calls (thread_id, call_id, tool, args_digest, verdict, requester,"
                " requested_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, call_id) DO NOTHING",
                (thread_id, c.call_id, c.tool, c.args_digest, c.verdict, requester_json(c.requester), now),
            )
            for c in calls
        ]
        self._run_batch(audit_statements(thread_id, events) + registered + pins)
        return self.calls(thread_id, [c.call_id for c in calls])

    def calls(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, CallRecord]:
        if not call_ids:
            return {}
        columns = ", ".join(f"c.{column.strip()}" for column in CALL_COLUMNS.split(","))
        rows = self._run(
            f"SELECT {columns}, p.tool_digest FROM gatedloop_calls c LEFT JOIN gatedloop_tool_pins p"
            " ON p.thread_id = c.thread_id AND p.call_id = c.call_id"
            f" WHERE c.thread_id=? AND c.call_id IN ({placeholders(len(call_ids))})",
            (thread_id, *call_ids),
        )
        return {row[0]: CallRecord.from_row(row) for row in rows}

    def record_answers(self, thread_id: str, answers: Iterable[Answer], events: Sequence[AuditEvent] = ()) -> None:
        """The answer each call got, by digest, and the audit `events` of the step that gave them, in one
        transaction. A node that answers again after a crash (its first answer never reached a checkpoint)
        replaces the digest; nodes never answer a call that has a recorded answer."""
        now = time.time()
        self._run_batch(
            audit_statements(thread_id, events)
            + [
                (
                    "INSERT INTO gatedloop_calls (thread_id, call_id, tool, args_digest, verdict, requester,"
                    " requested_at, answer_digest, answer_source, answered_at)"
                    " VALUES (?, ?, ?, '', 'refused', '{}', ?, ?, ?, ?)"
                    " ON CONFLICT (thread_id, call_id) DO UPDATE SET answer_digest=excluded.answer_digest,"
                    " answer_source=excluded.answer_source, answered_at=excluded.answered_at",
                    (thread_id, a.call_id, a.tool, now, a.digest, a.source, now),
                )
                for a in answers
            ]
        )

    def answer_digests(self, thread_id: str, call_ids: Sequence[str] | None = None) -> dict[str, str]:
        """call id -> digest of the one answer gatedloop gave it: every answered call of the thread, or those of
        `call_ids`."""
        query = "SELECT call_id, answer_digest FROM gatedloop_calls WHERE thread_id=? AND answer_digest IS NOT NULL"
        if call_ids is None:
            rows = self._run(query, (thread_id,))
        else:
            rows = self._run(f"{query} AND call_id IN ({placeholders(len(call_ids))})", (thread_id, *call_ids))
        return {call_id: digest for call_id, digest in rows}

    def record_approvals(
        self, thread_id: str, records: Sequence[ApprovalRecord], events: Sequence[AuditEvent] = ()
    ) -> None:
        """One answer's decisions (and their audit `events`), in one transaction. Each is kept once per (call,
        arguments, reviewer, decision, round): a replayed answer does not count twice, and a reviewer may decide
        again a call sent back to a person since her decision. The round is counted by the INSERT itself
        (checkpoints/approval_rounds.py); a record's own `sent_back_round` is not read."""
        self._run_batch(
            audit_statements(thread_id, events)
            + [
                (
                    "INSERT INTO gatedloop_approvals (thread_id, call_id, tool, args_digest, reviewer, roles,"
                    f" decision, at, {ROUND_COLUMN}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {ROUND_OF_INSERT})"
                    f" ON CONFLICT ({ROUND_KEY}) DO NOTHING",
                    (
                        thread_id,
                        r.call_id,
                        r.tool,
                        r.args_digest,
                        r.reviewer,
                        json.dumps(sorted(r.roles)),
                        r.decision,
                        r.at,
                        thread_id,
                        r.call_id,
                    ),
                )
                for r in records
            ]
        )

    def approvals(self, thread_id: str, call_ids: Sequence[str]) -> list[ApprovalRecord]:
        if not call_ids:
            return []
        rows = self._run(
            f"SELECT {APPROVAL_COLUMNS} FROM gatedloop_approvals WHERE thread_id=? AND call_id IN"
            f" ({placeholders(len(call_ids))}) ORDER BY seq",
            (thread_id, *call_ids),
        )
        return [ApprovalRecord.from_row(row) for row in rows]

    def review_history(self, since: float | None = None) -> ReviewHistory:
        """The approval requests asked since `since` (epoch seconds; None: all), with their decisions and expiries:
        what `gatedloop stats` counts (checkpoints/review_stats.py)."""
        return review_history(self._run, since)

    def replaced_request(self, thread_id: str, requested_at: float) -> bool:
        """Whether the gated calls answered last before `requested_at` were answered by a new user message
        (`superseded`): the approval request they were in was replaced, unanswered, by a later one."""
        rows = self._run(
            "SELECT answer_source FROM gatedloop_calls WHERE thread_id=? AND verdict='ask'"
            " AND answered_at IS NOT NULL AND answered_at <= ? ORDER BY answered_at DESC LIMIT 1",
            (thread_id, requested_at),
        )
        return bool(rows) and rows[0][0] == SUPERSEDED_SOURCE

    def record_edited_args(self, thread_id: str, edits: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """(call id, digest, arguments) of reviewers' edits of calls to tools with `secret_args`: the graph state
        shows such arguments masked, and `execute` runs the call with these."""
        self._run_batch(
            [
                (
                    "INSERT INTO gatedloop_edited_args (thread_id, call_id, args_digest, args) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (thread_id, call_id, args_digest) DO NOTHING",
                    (thread_id, call_id, digest, json.dumps(args, ensure_ascii=False)),
                )
                for call_id, digest, args in edits
            ]
        )

    def edited_args(self, thread_id: str, call_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """call id -> the arguments of the latest recorded edit of it (see `record_edited_args`)."""
        if not call_ids:
            return {}
        rows = self._run(
            "SELECT call_id, args FROM gatedloop_edited_args WHERE thread_id=? AND call_id IN"
            f" ({placeholders(len(call_ids))}) ORDER BY seq",
            (thread_id, *call_ids),
        )
        return {call_id: json.loads(args) for call_id, args in rows}

    def thread_graph(self, thread_id: str) -> GraphIdentity | None:
        """The graph recorded as the one that made `thread_id` (None for a thread from before it was recorded;
        `policy_digest` None for one recorded before policies were)."""
        rows = self._run(
            "SELECT g.graph_name, g.graph_digest, p.policy_digest, p.policies FROM gatedloop_thread_graphs g"
            " LEFT JOIN gatedloop_thread_policies p ON p.thread_id = g.thread_id WHERE g.thread_id=?",
            (thread_id,),
        )
        if not rows:
            return None
        name, tools, policy_digest, policies = rows[0]
        return GraphIdentity(name, tools, policy_digest, json.loads(policies) if policies is not None else None)

    def record_thread_graph(
        self, thread_id: str, graph: GraphIdentity, *, replace: bool = False, events: Sequence[AuditEvent] = ()
    ) -> None:
        """Remember which graph made a thread (its policies too), and the audit `events` of that, in one
        transaction; the first one recorded stays unless `replace` (an upgrade)."""
        now = time.time()
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO gatedloop_thread_graphs (thread_id, graph_name, graph_digest, recorded_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) "
                + (
                    "DO UPDATE SET graph_name=excluded.graph_name, graph_digest=excluded.graph_digest,"
                    " recorded_at=excluded.recorded_at"
                    if replace
                    else "DO NOTHING"
                ),
                (thread_id, graph.name, graph.digest, now),
            )
        ]
        if graph.policy_digest is not None:
            policies = json.dumps(graph.policies or {}, ensure_ascii=False)
            statements.append(
                (
                    "INSERT INTO gatedloop_thread_policies (thread_id, policy_digest, policies, recorded_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) "
                    + (
                        "DO UPDATE SET policy_digest=excluded.policy_digest, policies=excluded.policies,"
                        " recorded_at=excluded.recorded_at"
                        if replace
                        else "DO NOTHING"
                    ),
                    (thread_id, graph.policy_digest, policies, now),
                )
            )
        self._run_batch(audit_statements(thread_id, events) + statements)
