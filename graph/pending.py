"""What a person is asked, and how an answer to it is made: the one reading of gatedloop's interrupts.

Every front end (the CLI's prompt and flags, the inbox, Slack) reads a pending request through `PendingRequest.parse`
and builds its answer with the decision builders here (`approve`, `edit`, `reject`, `respond`, `done`,
`not_done`, `abandon`) and `PendingRequest.answer`, which binds each decision to its call (and, for an approval, to
the exact arguments shown and to the request), so the gate refuses it if anything changed since it was shown. A
new decision type touches this module and the front ends' templates; nothing else reads the wire format
(`gatedloop.nodes.wire.hitl`'s TypedDicts) by its keys (tests/test_imports.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gatedloop.nodes.wire.hitl import approving_text

RequestKind = Literal["approval", "unknown_outcome"]
REJECTED = "Rejected by the reviewer."


@dataclass(frozen=True)
class PendingCall:
    """One call a person is asked about (an approval's action, or a write whose outcome is unknown)."""

    index: int
    name: str
    args: dict[str, Any]
    """As the reviewer may see them: `secret_args` masked."""
    tool_call_id: str
    allowed: tuple[str, ...]
    """The decision types the tool's policy allows for it."""
    description: str = ""
    args_digest: str = ""
    """An approval: the digest of the arguments that will run (a decision carries it back)."""
    approvals_required: int = 1
    approved_by: tuple[str, ...] = ()
    approvers: tuple[str, ...] | None = None
    justification_required: tuple[str, ...] = ()
    review_note: str = ""
    preview: str = ""
    requested_at: float | None = None
    expires_at: float | None = None
    """The deadline when the request was built (an approver's extension renews it: `extended_deadline`)."""
    remind_at: float | None = None
    escalates_at: float | None = None
    """From when `backup_approvers` may decide it too."""
    backup_approvers: tuple[str, ...] = ()
    reason: str = ""
    """An unknown outcome: why it is unknown (`timeout`, `connection_lost`, ...)."""
    idempotency_key: str = ""
    """An unknown outcome: the key its write was started with, to look it up in the other system."""

    def decidable_with(self, roles: Iterable[str], now: float) -> bool:
        """Whether a reviewer holding `roles` may decide it by its roles (the gate checks again, with the
        requester rule): any role of `approvers`, or of `backup_approvers` once it has escalated."""
        held = set(roles)
        if self.approvers is None or held & set(self.approvers):
            return True
        return self.escalates_at is not None and now >= self.escalates_at and bool(held & set(self.backup_approvers))

    def deciders(self) -> str:
        """Who may decide it, in words: its approver roles, or anyone."""
        return deciders_of(self.approvers)

    def approving(self, effect: str) -> str:
        """What approving it does, in one line (see `approving_text`)."""
        facts = {"name": self.name, "approvals_required": self.approvals_required, "approved_by": self.approved_by}
        return approving_text({**facts, **({"preview": self.preview} if self.preview else {})}, effect)


@dataclass(frozen=True)
class DecidedCall:
    """A call of the request already decided, held (not answerable) until every call of the request is decided."""

    name: str
    tool_call_id: str
    decision: str
    decided_by: tuple[str, ...] = ()

    def words(self) -> str:
        """How it was decided and by whom: "approve by bo"."""
        return f"{self.decision} by {', '.join(self.decided_by) or 'a reviewer'}"


@dataclass(frozen=True)
class PendingRequest:
    """A pending request as every front end reads it, parsed once from the interrupt's value."""

    kind: RequestKind
    request_id: str
    """The approval request's id, or the interrupt's id for a question that has none."""
    calls: tuple[PendingCall, ...]
    interrupt_id: str = ""
    named: bool = False
    """Whether the request has an id of its own (an approval): its answer must then name it."""
    requested_by: str | None = None
    requested_at: float | None = None
    expires_at: float | None = None
    error: str | None = None
    """Why the previous answer was refused (the request waits again)."""
    replaced: bool = False
    decided: tuple[DecidedCall, ...] = ()
    """An approval's calls an earlier answer decided, waiting for the others (`calls` are those still undecided)."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, value: Mapping[str, Any] | None, interrupt_id: str = "") -> PendingRequest:
        """Either kind of request, as the interrupt carries it (`GatedHITLRequest`, `UnknownOutcomeRequest`).
        None (what `runs.pending_request` returns for a thread that waits for nothing) is refused with that reason,
        so the docs' `PendingRequest.parse(runs.pending_request(graph, thread_id))` type-checks and fails clearly."""
        if value is None:
            raise ValueError("no pending request: the thread is not waiting for an answer")
        if value.get("kind") == "unknown_outcome":
            allowed = tuple(value.get("allowed_decisions") or ())
            calls = tuple(
                PendingCall(
                    index=i,
                    name=str(c["name"]),
                    args=dict(c.get("args") or {}),
                    tool_call_id=str(c.get("tool_call_id") or ""),
                    allowed=allowed,
                    reason=str(c.get("reason") or ""),
                    idempotency_key=str(c.get("idempotency_key") or ""),
                    remind_at=c.get("remind_at"),
                    escalates_at=c.get("escalates_at"),
                    backup_approvers=tuple(c.get("backup_approvers") or ()),
                )
                for i, c in enumerate(value.get("calls") or [])
            )
            return cls("unknown_outcome", interrupt_id, calls, interrupt_id, error=value.get("error"), raw=value)
        configs = value.get("review_configs") or []
        calls = tuple(
            _approval_call(i, action, configs[i] if i < len(configs) else {})
            for i, action in enumerate(value.get("action_requests") or [])
        )
        first = (value.get("action_requests") or [{}])[0]
        return cls(
            "approval",
            str(value.get("request_id") or interrupt_id),
            calls,
            interrupt_id,
            named=bool(value.get("request_id")),
            requested_by=first.get("requested_by"),
            requested_at=first.get("requested_at"),
            expires_at=first.get("expires_at"),
            error=value.get("error"),
            replaced=bool(value.get("replaced")),
            decided=tuple(_decided_call(held) for held in value.get("decided") or []),
            raw=value,
        )

    def mine(self, roles: Iterable[str], now: float) -> tuple[PendingCall, ...]:
        """The calls a reviewer holding `roles` may decide; all of them when she may decide none (so her answer
        is refused with the gate's own reason) or for an unknown outcome's question (answered whole)."""
        if self.kind != "approval":
            return self.calls
        decidable = tuple(c for c in self.calls if c.decidable_with(roles, now))
        return decidable or self.calls

    def waiting_for(self, calls: Iterable[PendingCall] | None = None) -> str:
        """Who the request (or these of its calls) waits for, per role: "finance: refund; support: send_email"."""
        return by_decider((call.deciders(), call.name) for call in (self.calls if calls is None else calls))

    def answer(
        self,
        decisions: Sequence[dict[str, Any]],
        reviewer: str | None = None,
        *,
        justification: str | None = None,
        request_id: str | None = None,
        calls: Sequence[PendingCall] | None = None,
    ) -> dict[str, Any]:
        """The answer: one decision per call (of `calls`, some of an approval's calls, or all), in order. An
        approval's decisions each name their call and the answer names the request (`request_id`: the one shown,
        unless the caller names the one she saw, as the CLI's `--request`); an unknown outcome's question is
        answered in its calls' order."""
        answered = self.calls if calls is None or self.kind != "approval" else tuple(calls)
        if len(decisions) != len(answered):
            raise ValueError(
                f"{len(answered)} decision(s) needed, one per call, got {len(decisions)}"
                + (
                    "; to decide some of the calls, name them: calls=[...]"
                    if calls is None and len(self.calls) > 1
                    else ""
                )
            )
        reason = {"justification": justification} if justification else {}
        bound = [
            {**d, **reason, **({"tool_call_id": call.tool_call_id} if self.kind == "approval" else {})}
            for d, call in zip(decisions, answered, strict=True)
        ]
        answer: dict[str, Any] = {"decisions": bound, "reviewer": reviewer}
        if request_id is not None or self.named:
            answer["request_id"] = request_id if request_id is not None else self.request_id
        return answer


def deciders_of(approvers: Iterable[str] | None) -> str:
    """Who may decide a call whose policy names these approver roles, in words (None or none: any reviewer)."""
    return " or ".join(approvers) if approvers else "any reviewer"


def by_decider(calls: Iterable[tuple[str, str]]) -> str:
    """(who may decide, call name) pairs grouped by who: "finance: refund; support: send_email"."""
    grouped: dict[str, list[str]] = {}
    for who, name in calls:
        grouped.setdefault(who, []).append(name)
    return "; ".join(f"{who}: {', '.join(names)}" for who, names in grouped.items())


def waiting_words(value: Mapping[str, Any]) -> str:
    """What a pending approval request waits for, as `gatedloop threads` and a thread's page say it."""
    return "waiting for " + (PendingRequest.parse(value).waiting_for() or "approval")


def refusal_of(value: Any) -> str | None:
    """Why the answer just given was refused, when `value` is one of gatedloop's requests asking again after it;
    None for one that waits without a refusal and for any interrupt that is not gatedloop's."""
    if not isinstance(value, Mapping) or value.get("kind") not in ("approval", "unknown_outcome"):
        return None
    return PendingRequest.parse(value).error or None


def _approval_call(index: int, action: Mapping[str, Any], config: Mapping[str, Any]) -> PendingCall:
    approvers = action.get("approvers")
    return PendingCall(
        index=index,
        name=str(action["name"]),
        args=dict(action.get("args") or {}),
        tool_call_id=str(action.get("tool_call_id") or ""),
        allowed=tuple(config.get("allowed_decisions") or ()),
        description=str(action.get("description") or ""),
        args_digest=str(action.get("args_digest") or ""),
        approvals_required=int(action.get("approvals_required") or 1),
        approved_by=tuple(action.get("approved_by") or ()),
        approvers=tuple(approvers) if approvers is not None else None,
        justification_required=tuple(config.get("justification_required") or ()),
        review_note=str(action.get("review_note") or ""),
        preview=str(action.get("preview") or ""),
        requested_at=action.get("requested_at"),
        expires_at=action.get("expires_at"),
        remind_at=action.get("remind_at"),
        escalates_at=action.get("escalates_at"),
        backup_approvers=tuple(action.get("backup_approvers") or ()),
    )


def _decided_call(held: Mapping[str, Any]) -> DecidedCall:
    return DecidedCall(
        name=str(held.get("name") or ""),
        tool_call_id=str(held.get("tool_call_id") or ""),
        decision=str(held.get("decision") or ""),
        decided_by=tuple(held.get("decided_by") or ()),
    )


# The decisions, one builder each: what a call's decision is on the wire.


def approve(call: PendingCall) -> dict[str, Any]:
    """Approve the call as shown (bound to the arguments' digest)."""
    return {"type": "approve", "args_digest": call.args_digest}


def edit(call: PendingCall, args: dict[str, Any]) -> dict[str, Any]:
    """Approve the call with these arguments instead (a secret sent back as `***` keeps its value)."""
    return {"type": "edit", "edited_action": {"name": call.name, "args": args}, "args_digest": call.args_digest}


def reject(call: PendingCall, message: str | None = None) -> dict[str, Any]:
    """Do not run it; the model reads `message` as the call's error."""
    return {"type": "reject", "message": message or REJECTED, "args_digest": call.args_digest}


def respond(call: PendingCall, message: str) -> dict[str, Any]:
    """Do not run it; the model reads `message` as the call's result."""
    return {"type": "respond", "message": message, "args_digest": call.args_digest}


def done(result: Any) -> dict[str, Any]:
    """An unknown outcome: it happened, with this result."""
    return {"type": "done", "result": result}


def not_done() -> dict[str, Any]:
    """An unknown outcome: it did not happen (it runs again, under the same idempotency key)."""
    return {"type": "not_done"}


def abandon() -> dict[str, Any]:
    """An unknown outcome: leave it; the model is told it is not known."""
    return {"type": "abandon"}
