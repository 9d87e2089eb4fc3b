"""What the inbox lists: every pending request across threads, as the reviewer may see it.

Reading a thread's state rebuilds its messages, which costs more the longer the thread; the list is polled
every few seconds, so each thread's view is cached by its latest checkpoint id and pending-write count and
only re-read when one of them changes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints.ledger import Evidence, Ledger
from gatedloop.graph.pending import DecidedCall, PendingRequest
from gatedloop.inbox.forms import FormField, edit_fields
from gatedloop.nodes.gate.admission import EXTEND, request_deadline_at, shown_deadlines
from gatedloop.nodes.wire.masking import Redactor, content_text, thread_redactor, thread_title
from gatedloop.tools.policy import GATED_WRITE, CallContext, ToolPolicy

RECENT_MESSAGES = 6


@dataclass(frozen=True)
class ActionView:
    index: int
    name: str
    args: dict[str, Any]
    description: str
    tool_call_id: str
    args_digest: str
    allowed: list[str]
    approvals_required: int = 1
    approved_by: list[str] = field(default_factory=list)
    approvers: list[str] | None = None
    fields: list[FormField] = field(default_factory=list)
    reason: str = ""  # unknown outcome: why it is unknown
    effect: str = "write"  # the tool's policy: "read" or "write"
    summary: str = ""  # the tool's own description (what it does), without the request's facts
    proposed: dict[str, Any] | None = None  # what the model proposed (masked), when the pending args differ from it
    justification_required: list[str] = field(default_factory=list)  # decisions the policy wants a reason for
    note: str = ""  # the policy's note for reviewers (an MCP tool: its server and hints)
    escalates_at: float | None = None  # from when `backup_approvers` may decide it too
    backup_approvers: list[str] = field(default_factory=list)
    approving: str = ""  # what approving will do, in one line (`PendingCall.approving`)
    deciders: str = "any reviewer"  # who may decide it, in words (`PendingCall.deciders`)

    @property
    def rows(self) -> list[tuple[str, str, str | None]]:
        """(argument, value shown, what the model proposed if a reviewer's edit changed it) per argument."""
        proposed = self.proposed or {}
        names = [*self.args, *(n for n in proposed if n not in self.args)]
        return [
            (
                n,
                shown_value(self.args.get(n)),
                shown_value(proposed.get(n))
                if self.proposed is not None and proposed.get(n) != self.args.get(n)
                else None,
            )
            for n in names
        ]


@dataclass(frozen=True)
class PendingView:
    thread_id: str
    interrupt_id: str
    request_id: str
    kind: str  # "approval" or "unknown_outcome"
    actions: list[ActionView]
    requested_by: str | None
    requested_at: float | None
    expires_at: float | None
    error: str | None
    recent: list[tuple[str, str]]
    graph: str = ""  # under LangGraph Server: the graph (assistant) the thread runs, which answers go to
    title: str = ""  # the thread's first user message, shortened (redacted as the conversation is)
    request: PendingRequest | None = None  # the request as the operator layer parsed it (answers are built on it)
    extended: bool = False  # an approver extended its deadline (`expires_at` is the extended one)
    refused: Mapping[str, str] = field(default_factory=dict)
    """For the reviewer it is shown to (`visible_to`): the calls she may not decide (by call id) and why; shown
    read-only, with who decides them."""

    @property
    def version(self) -> str:
        """Changes whenever what a reviewer sees of this request changes (so the page replaces its card): a call
        approved or decided by someone else (the request keeps its id while its calls are decided one reviewer at
        a time), a refusal."""
        progress = ",".join(f"{a.tool_call_id}:{len(a.approved_by)}" for a in self.actions)
        return f"{self.thread_id}|{self.request_id}|{progress}|{','.join(sorted(self.refused))}|{self.error or ''}"

    @property
    def decided(self) -> tuple[DecidedCall, ...]:
        """The request's calls already decided, waiting for the others (no longer among `actions`)."""
        return self.request.decided if self.request is not None else ()

    @property
    def waiting_for(self) -> str:
        """Who the request waits for, per role ("finance: refund; support: send_email")."""
        return self.request.waiting_for() if self.request is not None else ""

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def waited_s(self, now: float | None = None) -> float | None:
        """How long the request has waited (its escalation to the backup approvers depends on it)."""
        return None if self.requested_at is None else (now or time.time()) - self.requested_at

    @property
    def tool_names(self) -> list[str]:
        return sorted({a.name for a in self.actions})


@dataclass
class _Cached:
    key: tuple[str, int]
    view: PendingView | None


def _text(message: BaseMessage) -> tuple[str, str]:
    content = content_text(message)
    if isinstance(message, HumanMessage):
        return "user", content
    if isinstance(message, AIMessage):
        calls = ", ".join(f"{c['name']}(…)" for c in message.tool_calls)
        return "model", content or (f"proposes {calls}" if calls else "")
    if isinstance(message, ToolMessage):
        return f"tool {message.name}", content
    return message.type, content


def recent_conversation(messages: Sequence[BaseMessage], redact: Redactor) -> list[tuple[str, str]]:
    return [(who, redact(text)) for who, text in (_text(m) for m in messages[-RECENT_MESSAGES:])]


def shown_value(value: Any) -> str:
    """An argument's value as the card shows it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def proposed_args(messages: Sequence[BaseMessage]) -> dict[str, dict[str, Any]]:
    """call id -> the arguments the model proposed for it (unmasked: mask before showing)."""
    return {str(c.get("id")): c.get("args") or {} for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}


class PendingRequests:
    """Pending requests of every thread in one checkpoint store, filtered per reviewer."""

    def __init__(
        self,
        graph: CompiledStateGraph,
        ledger: Ledger,
        thread_ids: Callable[[], list[str]],
        tools: Sequence[BaseTool],
        policies: Mapping[str, ToolPolicy],
    ):
        self.graph, self.ledger, self._thread_ids = graph, ledger, thread_ids
        self.tools = {t.name: t for t in tools}
        self.policies = dict(policies)
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def thread_ids(self) -> list[str]:
        return self._thread_ids()

    def policy(self, name: str) -> ToolPolicy:
        return self.policies.get(name, GATED_WRITE)  # no policy: a gated write (fail closed), as the registry does

    def tools_and_policy(self, graph: str) -> tuple[dict[str, BaseTool], Callable[[str], ToolPolicy]]:
        """The tools and policies of `graph`'s threads: standalone, every thread is this one graph's."""
        return self.tools, self.policy

    def refusals(self, view: PendingView, reviewer: CallContext) -> dict[str, str]:
        return call_refusals(view, reviewer, self.policy)

    def visible(self, reviewer: CallContext, *, own_threads_only: bool = False) -> list[PendingView]:
        return visible_to(self.all(), reviewer, self.refusals, own_threads_only)

    def all(self) -> list[PendingView]:
        views = []
        for thread_id in self._thread_ids():
            view = self.get(thread_id)
            if view is not None:
                views.append(view)
        return views

    def get(self, thread_id: str) -> PendingView | None:
        config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        saver = self.graph.checkpointer
        tup = saver.get_tuple(config) if saver is not None and not isinstance(saver, bool) else None
        if tup is None:
            return None
        key = (str(tup.config["configurable"].get("checkpoint_id")), len(tup.pending_writes or []))
        with self._lock:
            cached = self._cache.get(thread_id)
        if cached is None or cached.key != key:
            cached = _Cached(key, self._read(thread_id, tup.checkpoint.get("ts")))
            with self._lock:
                self._cache[thread_id] = cached
        if cached.view is not None and self.ledger.cancel_requested(thread_id):
            return None  # a cancelled thread's request can no longer be answered
        return with_extensions(cached.view, self.ledger) if cached.view is not None else None

    def _read(self, thread_id: str, checkpoint_ts: Any) -> PendingView | None:
        snapshot = self.graph.get_state({"configurable": {"thread_id": thread_id}})
        if not snapshot.interrupts or not isinstance(snapshot.interrupts[0].value, dict):
            return None
        interrupt = snapshot.interrupts[0]
        messages = (snapshot.values or {}).get("messages", [])
        return pending_view(thread_id, interrupt.id, interrupt.value, messages, self.tools, self.policy, checkpoint_ts)


def call_refusals(view: PendingView, reviewer: CallContext, policy: Callable[[str], ToolPolicy]) -> dict[str, str]:
    """Why this reviewer may not decide each call she may not (by call id), by the gate's own rule (the tool's
    policy: its roles, the backup roles once escalated, never her own call)."""
    waited = view.waited_s()
    found = {a.tool_call_id: policy(a.name).reviewer_refusal(reviewer, view.requested_by, waited) for a in view.actions}
    return {call_id: why for call_id, why in found.items() if why}


def whole_refusal(view: PendingView, refused: Mapping[str, str]) -> str | None:
    """Why this reviewer may not answer the request at all (None: she may decide some of its calls). A request
    that mixes roles is decided call by call, so it is hers if any call is; an unknown outcome's question is
    answered whole, so any call she may not decide refuses it."""
    if not refused or (view.kind == "approval" and len(refused) < len(view.actions)):
        return None
    return next(iter(refused.values()))


def visible_to(
    views: Iterable[PendingView],
    reviewer: CallContext,
    refusals: Callable[[PendingView, CallContext], dict[str, str]],
    own_threads_only: bool,
) -> list[PendingView]:
    """The requests this reviewer may decide a call of, oldest first, each marked with the calls she may not
    decide (`PendingView.refused`); `own_threads_only` (not an approver under the server's auth): only those she
    asked for herself, as the API shows her only her own threads."""
    mine = (v for v in views if not own_threads_only or v.requested_by == reviewer.user_id)
    seen = [replace(v, refused=refusals(v, reviewer)) for v in mine]
    return sorted((v for v in seen if whole_refusal(v, v.refused) is None), key=lambda v: v.requested_at or 0.0)


def pending_view(
    thread_id: str,
    interrupt_id: str,
    request: dict[str, Any],
    messages: Sequence[BaseMessage],
    tools: Mapping[str, BaseTool],
    policy: Callable[[str], ToolPolicy],
    checkpoint_ts: Any = None,
    graph: str = "",
) -> PendingView:
    """A pending request (the interrupt value, as the wire format has it) as the inbox shows it; `tools` give the
    edit forms their fields (a tool not among them gets no edit form)."""
    pending = PendingRequest.parse(request, interrupt_id)
    proposals = proposed_args(messages)
    actions = []
    for call in pending.calls:
        if pending.kind == "unknown_outcome":
            actions.append(
                ActionView(
                    call.index,
                    call.name,
                    call.args,
                    "",
                    call.tool_call_id,
                    "",
                    list(call.allowed),
                    reason=call.reason,
                    escalates_at=call.escalates_at,
                    backup_approvers=list(call.backup_approvers),
                )
            )
            continue
        tool = tools.get(call.name)
        rules = policy(call.name)
        model_args = proposals.get(call.tool_call_id)
        proposed = rules.masked(model_args) if model_args is not None else None
        actions.append(
            ActionView(
                index=call.index,
                name=call.name,
                args=call.args,
                description=call.description,
                tool_call_id=call.tool_call_id,
                args_digest=call.args_digest,
                allowed=list(call.allowed),
                justification_required=list(call.justification_required),
                approvals_required=call.approvals_required,
                approved_by=list(call.approved_by),
                approvers=list(call.approvers) if call.approvers is not None else None,
                fields=edit_fields(tool, call.args, rules.secret_args) if tool is not None else [],
                effect=rules.effect,
                summary=tool.description if tool is not None else "",
                proposed=proposed if proposed is not None and proposed != call.args else None,
                note=call.review_note or rules.review_note or "",
                escalates_at=call.escalates_at,
                backup_approvers=list(call.backup_approvers),
                approving=call.approving(rules.effect),
                deciders=call.deciders(),
            )
        )
    redact = thread_redactor(messages, policy)
    return PendingView(
        thread_id=thread_id,
        interrupt_id=interrupt_id,
        request_id=pending.request_id,
        kind=pending.kind,
        actions=actions,
        requested_by=pending.requested_by,
        requested_at=pending.requested_at or _epoch(checkpoint_ts),
        expires_at=pending.expires_at,
        error=pending.error,
        recent=recent_conversation(messages, redact),
        graph=graph,
        title=thread_title(messages, redact),
        request=pending,
    )


def with_extensions(view: PendingView, ledger: Evidence) -> PendingView:
    """The view with its deadline as approvers' extensions left it (they change no checkpoint, so the cached view
    and the interrupt still hold the first one), and as a call that expired left it (the request's time is then its
    other calls': `request_deadline_at`); read only for a request that expires."""
    if view.expires_at is None or view.request is None or view.kind != "approval":
        return view
    calls = [(c.tool_call_id, c.requested_at, c.expires_at) for c in view.request.calls]
    approvals = ledger.approvals(view.thread_id, [c[0] for c in calls])
    found = request_deadline_at(shown_deadlines(calls, approvals).values(), time.time())
    deadline = found if found is not None else view.expires_at
    extended = any(a.decision == EXTEND for a in approvals)
    return (
        view
        if (deadline, extended) == (view.expires_at, view.extended)
        else replace(view, expires_at=deadline, extended=extended)
    )


def _epoch(ts: Any) -> float | None:
    """A checkpoint's ISO timestamp as epoch seconds (requests without `requested_at`)."""
    if not isinstance(ts, str):
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def age_text(since: float | None, now: float | None = None) -> str:
    if since is None:
        return "unknown"
    seconds = max(0.0, (now or time.time()) - since)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 172800:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 86400:.0f} days"
