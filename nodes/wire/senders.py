"""Who sent an answer, bound to the answer as it enters the graph (invariant 10).

LangGraph stores a `Command(resume=...)` value in the checkpoint before any node runs, and hands it back to an
`interrupt()` later: in another process, after a crash, at the next interrupt of the same task, or in a run that
carried no answer at all (`invoke(None)`). Whoever runs the graph at that moment says nothing about who sent it.
So gatedloop's graph wraps every resume value as it arrives (`gatedloop.graph.gated.GatedGraph`) with the
identity of the call that carried it and a fresh arrival id; LangGraph stores the wrapper with the answer, in
the same write, and the nodes judge the answer as its sender's. An answer that entered without a wrapper (a
value stored by a version before this one, or written some other way than through the graph) has no known
sender: it is judged as anonymous.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from gatedloop.nodes.wire.identity import identity_from_stored, stored_identity
from gatedloop.tools.policy import CallContext

SENT_KEY = "gatedloop_answer"
"""The key that holds the answer itself in a wrapped resume value; `sender` and `arrival` sit beside it."""


class SentAnswer(NamedTuple):
    """An answer as a node receives it: the value the reviewer sent, who sent it, and which arrival it was (the
    same answer sent twice is two arrivals; one arrival handed back twice by LangGraph is one)."""

    value: Any
    sender: CallContext
    arrival: str


def bind_sender(resume: Any, sender: CallContext) -> Any:
    """A `Command.resume` with each answer wrapped with its sender: a single value, or LangGraph's map of
    interrupt id to value. Whatever the client put in the value stays inside it, so a client-made wrapper is
    only an answer's content (and refused as malformed), never its sender."""
    if isinstance(resume, Mapping) and resume and all(_is_interrupt_id(k) for k in resume):
        return {key: _wrapped(value, sender) for key, value in resume.items()}
    return _wrapped(resume, sender)


def received(answer: Any) -> SentAnswer:
    """The answer an `interrupt()` returned, with its sender (anonymous when it carries none)."""
    if isinstance(answer, Mapping) and SENT_KEY in answer and isinstance(answer.get("arrival"), str):
        return SentAnswer(answer[SENT_KEY], identity_from_stored(answer.get("sender")), answer["arrival"])
    return SentAnswer(answer, CallContext(), "")


def answer_value(answer: Any) -> Any:
    """The value a reviewer sent, for code that only shows or checks it."""
    return received(answer).value


def _wrapped(value: Any, sender: CallContext) -> dict[str, Any]:
    return {SENT_KEY: value, "sender": stored_identity(sender), "arrival": uuid.uuid4().hex}


def _is_interrupt_id(key: Any) -> bool:
    """LangGraph's test for a resume map's keys (`pregel._utils.is_xxh3_128_hexdigest`), on public ground."""
    return isinstance(key, str) and len(key) == 32 and all(c in "0123456789abcdef" for c in key)
