"""Which graph made a thread (invariant 11): a thread is run only by the graph that made it, its policies included,
unless an operator upgrades it explicitly; the check every way into a run makes (`runs.*`, the CLI, and the
compiled graph's own entry, so a served graph is held to it too)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints.evidence import AuditEvent, GraphIdentity
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.ledger_for import LedgerOfTheRun
from gatedloop.graph.parts_of import graph_identity, parts_of
from gatedloop.nodes.wire.identity import client_context


class GraphMismatch(ValueError):
    """The thread was made by another graph (or by this one with other tools or other policies); nothing was run
    or changed. `changes` says what differs, in words."""

    def __init__(self, thread_id: str, recorded: GraphIdentity, offered: GraphIdentity):
        self.recorded, self.offered = recorded, offered
        self.changes = identity_changes(recorded, offered)
        super().__init__(
            f"thread {thread_id!r} was made by graph {recorded}, not by {offered_graph(recorded, offered)}"
            f" (changed: {'; '.join(self.changes)}): resume it with the graph that made it, or upgrade it to this"
            " one explicitly (upgrade=True; CLI: --upgrade-graph)"
        )


def offered_graph(recorded: GraphIdentity, offered: GraphIdentity) -> str:
    """The graph offered, named so it cannot be taken for the thread's: one of the same name (its tools or
    policies changed) is "this graph, another of that name" with its digests, never a second "graph 'x'"."""
    if offered.name != recorded.name:
        return f"graph {offered}"
    return f"this graph, another of that name ({offered.digests()})"


NOT_RECORDED = "policies not recorded for this thread (it was recorded before gatedloop kept them)"


def identity_changes(recorded: GraphIdentity, offered: GraphIdentity) -> list[str]:
    """What differs between two graph identities, one phrase each; a tool's policy as one phrase naming each
    changed field ("policy of pay: approvals_required 2 -> 1, ...")."""
    by_tool: dict[str, list[str]] = {}
    for tool, what in policy_field_changes(recorded, offered):
        by_tool.setdefault(tool, []).append(what)
    policies = [f"policy of {tool}: {', '.join(what)}" for tool, what in by_tool.items()]
    return _other_changes(recorded, offered) + policies


def upgrade_changes(recorded: GraphIdentity, offered: GraphIdentity) -> list[str]:
    """The same as `identity_changes`, one line per changed policy field ("pay: approvals_required 2 -> 1"): what
    the audit of an upgrade lists."""
    return _other_changes(recorded, offered) + [f"{t}: {what}" for t, what in policy_field_changes(recorded, offered)]


def _other_changes(recorded: GraphIdentity, offered: GraphIdentity) -> list[str]:
    changes = [f"name {recorded.name!r} -> {offered.name!r}"] if recorded.name != offered.name else []
    if recorded.digest != offered.digest:
        changes.append("tools (names, descriptions, argument schemas or annotations)")
    if recorded.policy_digest is None:
        changes.append(NOT_RECORDED)
    elif recorded.policy_digest != offered.policy_digest and not policy_changes(recorded, offered):
        changes.append("policies")  # the digests differ but the summaries read back do not (an edited row)
    return changes


def policy_changes(recorded: GraphIdentity, offered: GraphIdentity) -> dict[str, dict[str, Any]]:
    """tool -> {"from": its policy summary then, "to": now} for each tool whose policy differs (None: the tool is
    not in that graph; every tool's "from" is None when the thread's policies were not recorded)."""
    before, after = recorded.policies or {}, offered.policies or {}
    return {
        tool: {"from": before.get(tool), "to": after.get(tool)}
        for tool in sorted(before.keys() | after.keys())
        if recorded.policies is None or before.get(tool) != after.get(tool)
    }


def policy_field_changes(recorded: GraphIdentity, offered: GraphIdentity) -> list[tuple[str, str]]:
    """(tool, "approvals_required 2 -> 1"), (tool, "added"), ...: `policy_changes` in words, one per field (none
    when the thread's policies were not recorded: there is nothing to compare with)."""
    if recorded.policies is None:
        return []

    def shown(value: Any) -> str:
        return value if isinstance(value, str) else repr(value)

    lines: list[tuple[str, str]] = []
    for tool, change in policy_changes(recorded, offered).items():
        before, after = change["from"], change["to"]
        if before is None or after is None:
            lines.append((tool, "added" if before is None else "removed"))
            continue
        for key in [*before, *(k for k in after if k not in before)]:
            if before.get(key) != after.get(key):
                lines.append((tool, f"{key} {shown(before.get(key))} -> {shown(after.get(key))}"))
    return lines


def claim_thread(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread_id: str,
    *,
    upgrade: bool = False,
    context: Any = None,
) -> None:
    """Invariant 11: a thread is run only by the graph that made it: same name, same tools, same policies
    (`graph_identity`). Another graph raises GraphMismatch, naming what changed, unless `upgrade`, which records
    the new graph and audits `graph_upgraded` in the same transaction: who upgraded (`context`, the run's context
    in the graph's own schema, read as every identity is: `client_context`), both identities, and each changed
    tool's policy before and after.

    Threads from before this rule, decided so that none silently accepts weaker rules and stored files stay as
    they are (no column changed; policies have a table of their own):
    - no graph recorded at all (new, or written before graphs were recorded, as tests/data/threads_2077b07.sqlite):
      this graph's from now on, policies included. For an old thread there is nothing to compare with; refusing
      would strand every thread of such a file (tests/test_stored_formats.py resumes them as they are);
    - a graph recorded without policies (written after graphs were recorded, before policies were, as
      tests/data/threads_1ee2d3b.sqlite): its name and tools are known but not the rules it was made under, which
      may have been stricter than today's. It is another graph until upgraded explicitly (the audit then shows
      every tool's policy from None), rather than adopting today's policies on first resume: that would let a
      weakened graph take over its pending approvals unnoticed, the drift this rule exists to stop."""
    ledger = ledger_of(graph)
    if ledger is None:  # not a gatedloop graph: nothing to check against
        return
    offered, recorded = graph_identity(graph), ledger.thread_graph(thread_id)
    if recorded == offered:
        return
    if recorded is None:
        ledger.record_thread_graph(thread_id, offered)
        return
    if not upgrade:
        raise GraphMismatch(thread_id, recorded, offered)
    detail = {
        "from": [recorded.name, recorded.digest],
        "to": [offered.name, offered.digest],
        "from_policies": recorded.policy_digest,
        "to_policies": offered.policy_digest,
        "changes": upgrade_changes(recorded, offered),
        "policies": policy_changes(recorded, offered),
    }
    # Every upgrade is its own event: the audit keeps one row per (call, event), and a thread may be upgraded to
    # the same graph twice (there and back).
    event = f"graph_upgraded:{offered.digest[:8]}.{(offered.policy_digest or '')[:8]}.{uuid.uuid4().hex[:8]}"
    actor = client_context(context).user_id
    ledger.record_thread_graph(thread_id, offered, replace=True, events=[AuditEvent("", event, detail, actor)])


def check_thread_graph(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> None:
    """Raise GraphMismatch if another graph made this thread; records nothing (for reading and flagging)."""
    ledger = ledger_of(graph)
    recorded = ledger.thread_graph(thread_id) if ledger is not None else None
    if recorded is None:
        return
    offered = graph_identity(graph)
    if recorded != offered:
        raise GraphMismatch(thread_id, recorded, offered)


def made_by(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> bool:
    """Whether `graph` is recorded as the graph that made the thread, so its policies are the thread's. False for
    a thread with none recorded (from before graphs were, which any graph may read) and for a graph gatedloop did
    not build: what is secret in such a thread cannot be known from the graph at hand."""
    ledger = ledger_of(graph)
    return ledger is not None and ledger.thread_graph(thread_id) == graph_identity(graph)


async def aledger_of(graph: CompiledStateGraph[Any, Any, Any, Any]) -> Ledger | None:
    """`ledger_of` from async code: a served graph's ledger is made on its checkpointer's first run (a file or a
    connection opened), so that once on a worker thread, not on the event loop (`langgraph dev` refuses a
    blocking call there); afterwards it is at hand."""
    parts, saver = parts_of(graph), graph.checkpointer
    served = parts.ledger if parts is not None and isinstance(parts.ledger, LedgerOfTheRun) else None
    if served is not None and isinstance(saver, BaseCheckpointSaver) and not served.knows(saver):
        return await asyncio.to_thread(ledger_of, graph)
    return ledger_of(graph)


def ledger_of(graph: CompiledStateGraph[Any, Any, Any, Any]) -> Ledger | None:
    """The ledger a run of `graph` will use, found before the run starts: a served graph's (`LedgerOfTheRun`) is
    its checkpointer's, which the server sets on the graph it runs; None for a graph not from `build_graph`."""
    parts = parts_of(graph)
    if parts is None:
        return None
    if isinstance(parts.ledger, LedgerOfTheRun) and isinstance(graph.checkpointer, BaseCheckpointSaver):
        return parts.ledger.of(graph.checkpointer)
    return parts.ledger
