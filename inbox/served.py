"""The inbox inside LangGraph Server: every graph the server serves, listed and answered through the server's API.

An answer is a run the server creates (`runs.wait(thread, graph, command={"resume": answer})`) with the signed-in
reviewer's own credentials, so the server's auth decides who may answer, the run goes through the server's queue,
the thread's status is right afterwards, and a second answer to a request already answered finds nothing pending.
The pending requests are the server's interrupted threads, searched as that reviewer (so she sees the threads the
server lets her see). The graphs' tools and policies, loaded from the server's graph list (`LANGSERVE_GRAPHS`, the
graphs of `langgraph.json`), give the edit forms their fields and the page its "may you decide" filter; the graph
itself decides.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.tools import BaseTool
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.schema import Command

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.graph.load import GraphNotFound, load_graph
from gatedloop.graph.parts_of import parts_of
from gatedloop.inbox.app import InboxBackend
from gatedloop.inbox.identity import Reviewer
from gatedloop.inbox.pending import (
    PendingView,
    call_refusals,
    pending_view,
    visible_to,
    with_extensions,
)
from gatedloop.inbox.refusals import refusal_in
from gatedloop.nodes.gate.extension import Extended, extend_request
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools.policy import GATED_WRITE, CallContext, ToolPolicy

log = logging.getLogger("gatedloop.inbox")

GRAPHS_ENV = "LANGSERVE_GRAPHS"
API_URL_ENV = "LANGGRAPH_API_URL"
SEARCH_LIMIT = 200


@dataclass(frozen=True)
class ServedGraph:
    """One graph of the server, as the inbox needs it: its tools (edit forms) and policies (who may decide)."""

    tools: Mapping[str, BaseTool] = field(default_factory=dict)
    policies: Mapping[str, ToolPolicy] = field(default_factory=dict)

    def policy(self, name: str) -> ToolPolicy:
        return self.policies.get(name, GATED_WRITE)


def served_graphs(environ: Mapping[str, str], folder: Path) -> dict[str, ServedGraph]:
    """Each graph of `LANGSERVE_GRAPHS` by id; a graph that does not load is logged and gets no forms."""
    listed = json.loads(environ.get(GRAPHS_ENV) or "{}")
    graphs: dict[str, ServedGraph] = {}
    for graph_id, spec in listed.items():
        reference = spec if isinstance(spec, str) else str(spec.get("path", ""))
        try:
            parts = parts_of(load_graph(reference, folder))
        except GraphNotFound as exc:
            log.warning("inbox: graph %s (%s) is not a gatedloop graph it can show: %s", graph_id, reference, exc)
            graphs[graph_id] = ServedGraph()
            continue
        assert parts is not None  # load_graph returns gatedloop graphs only
        graphs[graph_id] = ServedGraph(parts.registry.tools, parts.registry.policies)
    return graphs


class ServedRequests:
    """The pending requests the server's API shows one reviewer."""

    def __init__(self, client: SyncLangGraphClient, graphs: Mapping[str, ServedGraph], ledger: Ledger | None = None):
        self.client, self.graphs, self.ledger = client, graphs, ledger

    def visible(self, reviewer: CallContext, *, own_threads_only: bool = False) -> list[PendingView]:
        threads = self.client.threads.search(status="interrupted", limit=SEARCH_LIMIT)
        found = (self._view(whole_thread(self.client, thread)) for thread in threads)
        return visible_to([view for view in found if view is not None], reviewer, self.refusals, own_threads_only)

    def get(self, thread_id: str) -> PendingView | None:
        try:
            return self._view(whole_thread(self.client, self.client.threads.get(thread_id)))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in (403, 404):
                return None
            raise

    def refusals(self, view: PendingView, reviewer: CallContext) -> dict[str, str]:
        return call_refusals(view, reviewer, self.graphs.get(view.graph, ServedGraph()).policy)

    def tools_and_policy(self, graph: str) -> tuple[dict[str, BaseTool], Callable[[str], ToolPolicy]]:
        """The tools and policies of the served graph `graph`. For a thread whose graph is not known, a tool's
        policy is the first served graph's that has the tool, so its secret arguments are still masked."""
        if graph in self.graphs:
            return dict(self.graphs[graph].tools), self.graphs[graph].policy

        def any_graph(name: str) -> ToolPolicy:
            return next((g.policies[name] for g in self.graphs.values() if name in g.policies), GATED_WRITE)

        return {}, any_graph

    def _view(self, thread: Mapping[str, Any]) -> PendingView | None:
        if thread.get("status") != "interrupted":
            return None
        pending = [i for found in (thread.get("interrupts") or {}).values() for i in found]
        if not pending or not isinstance(pending[0].get("value"), dict):
            return None
        graph_id = str((thread.get("metadata") or {}).get("graph_id") or "")
        graph = self.graphs.get(graph_id, ServedGraph())
        values = thread.get("values") or {}
        view = pending_view(
            str(thread["thread_id"]),
            str(pending[0].get("id") or ""),
            pending[0]["value"],
            _messages(values.get("messages") if isinstance(values, dict) else None),
            graph.tools,
            graph.policy,
            thread.get("updated_at"),
            graph_id,
        )
        return with_extensions(view, self.ledger) if self.ledger is not None else view


def listed_graphs() -> dict[str, ServedGraph]:
    """LangGraph Server's graphs: `LANGSERVE_GRAPHS`, paths relative to the server's folder."""
    return served_graphs(os.environ, Path.cwd())


@dataclass
class ServedBackend(InboxBackend):
    """`InboxBackend` inside LangGraph Server (or Aegra): requests and answers go through the server's API."""

    list_graphs: Callable[[], dict[str, ServedGraph]] = listed_graphs

    @cached_property
    def graphs(self) -> dict[str, ServedGraph]:
        return self.list_graphs()

    def client(self, reviewer: Reviewer, origin: str) -> SyncLangGraphClient:
        """The server's API as this reviewer: her own bearer token (the server's auth decides), or none."""
        url = os.environ.get(API_URL_ENV) or origin
        headers = {"Authorization": reviewer.authorization} if reviewer.authorization else None
        return get_sync_client(url=url, api_key=None, headers=headers)

    def requests(self, reviewer: Reviewer, origin: str) -> ServedRequests:
        return ServedRequests(self.client(reviewer, origin), self.graphs, self.ledger)

    def grants_graph(self) -> None:
        """None: a grant is judged under one graph's policies, and the server serves several (its `graph` here only
        reads histories), so grants of a served graph are made with the CLI (`GRANTS_ELSEWHERE`)."""
        return None

    def extend(self, reviewer: Reviewer, origin: str, view: PendingView) -> Extended:
        """The extension is the ledger's record (the server's database): no run is needed, none is made."""
        assert view.request is not None
        policy = self.graphs.get(view.graph, ServedGraph()).policy
        return extend_request(self.ledger, policy, view.thread_id, view.request.raw, reviewer.context, time.time())

    def send(self, reviewer: Reviewer, origin: str, view: PendingView, answer: dict[str, Any]) -> dict[str, Any]:
        """A run the server queues; the refusal of an answer the graph did not accept is InvalidDecision."""
        client = self.client(reviewer, origin)
        try:
            # The context names the reviewer for a server without auth (as the API's local user); with auth, the
            # server's authenticated user (her token) overrides it (gatedloop.nodes.wire.identity).
            context: dict[str, Any] = {"user_id": reviewer.user_id, "roles": sorted(reviewer.roles)}
            command: Command = {"resume": {view.interrupt_id: answer}}
            values = client.runs.wait(view.thread_id, view.graph, command=command, context=context, raise_error=False)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 409:
                raise InvalidDecision(
                    "another answer is being applied to this thread; look again in a moment"
                ) from None
            raise InvalidDecision(
                f"the server refused the answer ({exc.response.status_code}: {_detail(exc)})"
            ) from None
        result = dict(values) if isinstance(values, dict) else {}
        if isinstance(result.get("__error__"), dict):  # the refusal as the server reports it (inbox.refusals)
            raise InvalidDecision(str(result["__error__"].get("message") or result["__error__"]))
        thread = whole_thread(client, client.threads.get(view.thread_id))
        if thread.get("status") == "interrupted":
            pending = [i for found in (thread.get("interrupts") or {}).values() for i in found]
            refusal = refusal_in(pending)  # a server whose API runs without inbox.refusals' middleware
            if refusal:
                raise InvalidDecision(refusal)
            result["__interrupt__"] = pending
        return result


def whole_thread(client: SyncLangGraphClient, thread: Mapping[str, Any]) -> Mapping[str, Any]:
    """The thread with its values and interrupts. LangGraph Server's thread records carry them; Aegra's do not, so
    an interrupted one's are read from its state."""
    if thread.get("status") != "interrupted" or ("interrupts" in thread and "values" in thread):
        return thread
    state = client.threads.get_state(str(thread["thread_id"]))
    return {**thread, "values": state.get("values") or {}, "interrupts": {"": state.get("interrupts") or []}}


def _messages(raw: Any) -> list[BaseMessage]:
    try:
        return convert_to_messages(raw or [])
    except (ValueError, TypeError, NotImplementedError):
        return []


def _detail(exc: httpx.HTTPStatusError) -> str:
    try:
        return str(exc.response.json().get("detail") or exc.response.text)[:300]
    except ValueError:
        return exc.response.text[:300]
