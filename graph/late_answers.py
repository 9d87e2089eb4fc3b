"""What became of an answer that arrived after another answer decided its request: told `AlreadyDecided`, naming who
decided and how, instead of a refusal that reads as its own fault ("not waiting for an answer").

Two answers to one request are often sent at once: two reviewers open the same card, a double click, a retry. The
thread's lease lets one run at a time; the other, once in, finds the request gone. Whether it was decided (and by
whom) is read from the ledger's `decision` audit rows, which carry the request id and the call, never from the
state. So every answer learns its fate: decided (`runs.resume` returns), already decided (`AlreadyDecided`),
refused (`InvalidDecision`, why), or not tried (`ThreadBusy`, when it does not wait for the thread).

An answer that names neither its request nor a call is bound, as it is sent, to the approval request pending then
(`bound_to`), so one that waits for the thread applies to that request or to nothing, never to the next request
the first answer's run asked. A request that replaced an unanswered one is not bound: its sender may never have
been shown it (invariant 10), and the gate refuses such an answer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gatedloop.checkpoints.ledger import Audit
from gatedloop.graph.pending import PendingRequest
from gatedloop.nodes.wire.hitl import InvalidDecision


class AlreadyDecided(InvalidDecision):
    """The request (or the calls) an answer names was decided by another answer first; nothing of this answer was
    applied. `decided_by` lists each decision recorded, as "bo (approve)"."""

    def __init__(self, message: str, request_id: str | None, decided_by: Sequence[str]):
        super().__init__(message)
        self.request_id = request_id
        self.decided_by = list(decided_by)


def _named_calls(answer: Mapping[str, Any]) -> list[str]:
    decisions = answer.get("decisions")
    if not isinstance(decisions, list):
        return []
    return [d["tool_call_id"] for d in decisions if isinstance(d, dict) and isinstance(d.get("tool_call_id"), str)]


def positional(answer: Any) -> bool:
    """An approval answer that names neither its request nor any call: it applies to whatever is pending."""
    return isinstance(answer, dict) and answer.get("request_id") is None and not _named_calls(answer)


def bound_to(answer: Any, pending: Mapping[str, Any] | None) -> Any:
    """A positional answer, addressed to the approval request `pending` as it is sent (see the module's doc)."""
    if not positional(answer) or pending is None or pending.get("kind") != "approval" or pending.get("replaced"):
        return answer
    return {**answer, "request_id": pending["request_id"]}


def _deciders(rows: Sequence[Mapping[str, Any]], matches: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    """ "bo (approve)" for each decision row that `matches`, in the order they were made, once each."""
    found = [
        f"{row['actor']} ({row['detail'].get('decision')})"
        for row in rows
        if (row["event"] == "decision" or row["event"].startswith("decision:")) and matches(row)
    ]
    return list(dict.fromkeys(found))


def too_late(
    ledger: Audit | None, thread_id: str, answer: Any, pending: Mapping[str, Any] | None
) -> AlreadyDecided | None:
    """`AlreadyDecided` when the request `answer` names is not the pending one, or a call it names is no longer
    open, and the ledger records decisions on them; None otherwise (the usual checks then say what is wrong)."""
    if ledger is None or not isinstance(answer, dict):
        return None
    named_request, named_calls = answer.get("request_id"), _named_calls(answer)
    asked = PendingRequest.parse(pending) if pending else None
    pending_id = asked.request_id if asked is not None and asked.named else None
    open_calls = {c.tool_call_id for c in asked.calls} if asked is not None else set()
    closed = [call_id for call_id in named_calls if call_id not in open_calls]
    if named_request is not None and named_request != pending_id:
        where = f"request {named_request!r}"
        deciders = _deciders(ledger.audit(thread_id), lambda row: row["detail"].get("request_id") == named_request)
    elif closed:
        where = f"call {', '.join(repr(c) for c in closed)}"
        deciders = _deciders(ledger.audit(thread_id), lambda row: row["call_id"] in closed)
    else:
        return None
    if not deciders:
        return None
    now = f"pending now is request {pending_id!r}" if pending_id else "the thread is not waiting for an answer"
    message = (
        f"{where} was already decided by another answer: {', '.join(deciders)}; nothing of this one applied; {now}"
    )
    return AlreadyDecided(message, named_request, deciders)
