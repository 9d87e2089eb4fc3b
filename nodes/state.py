"""The graph's state: the conversation, this turn's call plans, this request's counters, and how it ended.

Whatever grows with the work is a `DeltaChannel` (`messages`, and `seen_reads` for repeat detection), so a
checkpoint stores only what a step added, not everything again; the rest is small and fixed in size. How those
channels fold and snapshot is checkpoints/channels.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from langchain_core.messages import AnyMessage
from typing_extensions import TypedDict  # pydantic (Studio's schemas) needs it on Python 3.11

from gatedloop.checkpoints.channels import DoublingDeltaChannel, fold_messages, merge_seen
from gatedloop.checkpoints.grants import Charge

Status = Literal[
    "completed",
    "step_limit",
    "budget_exhausted",
    "deadline",
    "cancelled",
    "loop_detected",
    "incomplete",
    "invalid_answer",
    "refused",
    "needs_attention",
    "error",
]
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]

Verdict = Literal["run", "ask", "answered"]


class UnreadArgs(TypedDict):
    """Argument text that is not one exact JSON object: as received (escaped so a checkpoint stores it exactly),
    and why. `validate` answers such a call `invalid_arguments`."""

    text: str
    problem: str


class CallPlan(TypedDict):
    """One proposed tool call as it moves through validate -> approve -> execute.

    Its arguments are read once, when the model's response arrives (nodes/gate/call_arguments.py): `args` holds the
    exact values (with `repair` when they were repaired), or `args` is empty and `unread` says why not. `digest`
    is `args_digest` of what the call would run, computed where the arguments enter (model, an edit) and
    recomputed only where a node must check they did not change."""

    id: str
    """The model's tool call id; every call gets exactly one answer under it."""
    name: str
    """The tool's name as the model proposed it (a name that is no tool is answered, never run)."""
    args: dict[str, Any]
    """The exact arguments the call runs with (empty when `unread` says they could not be read)."""
    verdict: Verdict
    """`run`, `ask` (a person must approve) or `answered`; decided again from the evidence before it runs."""
    effect: Literal["read", "write"]
    """The tool's policy's effect: reads may run concurrently, a write runs once under its claim."""
    digest: str
    """`args_digest` of what the call would run; an approval is bound to it."""
    approved_digest: NotRequired[str]
    """The digest a reviewer approved (or edited to)."""
    decided_by: NotRequired[str]
    """Who decided it (the answer's sender, as bound when the answer entered)."""
    decision: NotRequired[str]
    """The reviewer's decision type: `approve`, `edit`, `reject` or `respond`."""
    edited: NotRequired[bool]
    """A reviewer's edit gave it these arguments (a secret one is masked here; the ledger keeps its value)."""
    repair: NotRequired[str]
    """How a read's malformed argument text was repaired (audited)."""
    unread: NotRequired[UnreadArgs]
    """Why the arguments could not be read, and their text: `validate` answers the call `invalid_arguments`."""
    grants: NotRequired[list[str]]
    """The standing grants that approve it in a person's place, in the order its claim tries them (one use of the
    first still open is taken with the claim). Set by admission from the ledger, never read from the state."""
    charges: NotRequired[list[Charge]]
    """What its write is charged against its policy's limits across threads, with its claim (set by admission)."""
    past_limit: NotRequired[bool]
    """A person approved it after a limit sent it back to her: limits that ask may be gone past (set by admission)."""


class RequestCounters(TypedDict):
    """Counters for the current request (reset by each new user message)."""

    started_at: float
    waited_s: float
    paused_at: float | None
    model_calls: int
    tool_calls: int
    tokens: int
    per_tool: dict[str, int]
    retries: int
    reviewed: NotRequired[list[str]]
    """The approval requests a reviewer decided in this request (its end is then told them: a `finished` notice)."""


class SeenRead(TypedDict):
    """The last result of one read (tool + canonical arguments) in this request, for loop detection: a loop is the
    same read returning the same result several times in a row, with no other call run in between."""

    result: str
    """The digest of the result."""
    repeats: int
    """How many times in a row before this one the read returned this result (0: the first)."""
    at: NotRequired[int]
    """The read's place among the calls this request ran (0, 1, ...): "in a row" is `at` following the previous
    entry's. Absent from entries stored by an older version, which therefore never continue a row."""


class ModelView(TypedDict):
    """What a middleware made of the thread's start for the model, kept so the next request starts from it (as
    `create_agent`'s rewritten thread would): the model is sent `head`, then the stored thread after `through`
    (all of it when `through` is None). The stored thread itself stays whole: it is the gate's evidence."""

    head: list[AnyMessage]
    """The messages that stand for the stored thread up to `through` (a summary)."""
    through: str | None
    """The id of the last stored message `head` stands for; None when `head` only comes before the thread."""


class GatedState(TypedDict):
    messages: Annotated[list[AnyMessage], DoublingDeltaChannel(fold_messages)]
    """The conversation; a step stores only the messages it added."""
    calls: NotRequired[list[CallPlan]]
    """This model turn's proposed calls and their verdicts (validate -> approve -> execute)."""
    counters: NotRequired[RequestCounters]
    """This request's budgets used so far; fixed in size, reset by each new user message."""
    seen_reads: Annotated[NotRequired[dict[str, SeenRead]], DoublingDeltaChannel(merge_seen)]
    """Fingerprint of each read run in this request -> its last result and place (loop detection); a step stores
    only the reads it ran, and a new request starts it again with an `Overwrite`."""
    stop: NotRequired[Status | None]
    """The status this request will end with, set early by the node that stops it (`model`, `validate`,
    `execute`; None while the loop goes on); the routers send the graph to `finalize` when it is set. Kept apart
    from `status` so the public `status` is only ever a final one (values streams and mid-request state never
    show it early), and because checkpoints hold `stop` between those nodes and `finalize`."""
    stop_detail: NotRequired[str | None]
    """Why the request stopped, in words: written with `stop`, kept (public) by `finalize`; None for `completed`."""
    status: NotRequired[Status | None]
    """The request's final status, written only by `finalize` (`stop` if set, else `completed` or `error`);
    None from the start of a request until then."""
    answer: NotRequired[str | None]
    """The final answer's text, set by `finalize` only for `completed`."""
    requester: NotRequired[dict[str, Any] | None]
    """Who sent the latest human message (`{"user_id", "roles"}`): the requester of every call the model proposes
    for it, whoever resumes later. Written by `gatedloop.graph.gated` as the message enters; never by a client."""
    review_error: NotRequired[str | None]
    """Why the last answer to the pending approval request was refused (shown with the request again)."""
    model_view: NotRequired[ModelView | None]
    """With a middleware list: the start of the thread as the model is sent it (a summary), set when a
    `before_model` hook rewrote it; None or absent: the model is sent the stored thread."""
    # The validated final answer (JSON) when build_graph(response_format=...) is set; None otherwise.
    structured_response: NotRequired[Any]


class InputState(TypedDict):
    messages: Annotated[list[AnyMessage], DoublingDeltaChannel(fold_messages)]
    requester: NotRequired[dict[str, Any] | None]
    """Set by the graph as a message enters (see `GatedState.requester`); a value sent here is replaced."""


REQUESTER_FIELD = "requester"
PROTECTED_KEYS = frozenset(GatedState.__annotations__) - {"messages"}
"""gatedloop's own state keys, which a middleware hook never writes (nodes/build/middleware.py)."""


class OutputState(TypedDict):
    messages: list[AnyMessage]
    status: NotRequired[Status | None]
    answer: NotRequired[str | None]
    stop_detail: NotRequired[str | None]
    structured_response: NotRequired[Any]


_ALWAYS_WRITTEN = frozenset({"seen_reads", *OutputState.__annotations__})
"""Kept in every update that has them: `seen_reads` has a reducer (a write is never a no-op), and the result
keys are what a caller reads from a paused or finished run (`out["status"]`), present from a request's start."""


def changes(state: Any, update: dict[str, Any]) -> dict[str, Any]:
    """`update` without the gate's other keys when they already hold the value written (absent counts as None):
    LangGraph checkpoints every written key as a new version, changed or not, and a server streams it. A key
    that is not the gate's (`messages`, a middleware's) is always kept."""
    return {k: v for k, v in update.items() if k not in PROTECTED_KEYS or k in _ALWAYS_WRITTEN or state.get(k) != v}
