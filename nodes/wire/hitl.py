"""Every interrupt's wire format: the approval request (LangChain v1's batched `HITLRequest`, so existing clients
work unchanged) and the question about a write whose outcome is unknown (`UnknownOutcomeRequest`).

Agent Chat UI and code written for `HumanInTheLoopMiddleware` read `action_requests`/`review_configs` and
answer `{"decisions": [...]}`. We add a `request_id`, and per action `tool_call_id`, `args_digest` and the
approval facts a reviewer needs (requester, expiry, quorum progress). A decision that names its call
(`tool_call_id`, or an `args_digest` only one pending call has) applies to that call, in any order; decisions
that name none apply in order, as in LangChain. An optional `reviewer` string is a note for the audit trail,
never authority: who answers is the answer's sender, bound to it as it entered (nodes/wire/senders.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict, cast

from gatedloop.tools.policy import ALL_DECISIONS, CallContext, DecisionType, ToolPolicy

ANONYMOUS = "anonymous"
"""The audit trail's actor for an answer whose call carried no identity."""

# Mirrors of langchain.agents.middleware.human_in_the_loop's TypedDicts (same keys), declared here so the
# runtime does not need the `langchain` package for five dict shapes.


class ActionRequest(TypedDict):
    name: str
    args: dict[str, Any]
    description: NotRequired[str]


class ReviewConfig(TypedDict):
    action_name: str
    allowed_decisions: list[DecisionType]
    justification_required: NotRequired[list[DecisionType]]
    """The decisions that need a `justification` (the tool's `ToolPolicy.justification`); absent: none."""


class LadderSteps(TypedDict):
    """When a request that waits for a person (an approval, or an unknown outcome's question) is reminded and
    escalated, from when it was asked (`ladder_steps`); each key absent when the tool's policy sets none."""

    remind_at: NotRequired[float]
    """When a reviewer is reminded that it still waits (`ToolPolicy.remind_after_s`)."""
    escalates_at: NotRequired[float]
    """From when a reviewer with one of `backup_approvers` may decide it too (`ToolPolicy.escalate_after_s`)."""
    backup_approvers: NotRequired[list[str]]
    """The roles that may decide it too from `escalates_at` (`ToolPolicy.backup_approvers`)."""


def ladder_steps(policy: ToolPolicy, since: float) -> LadderSteps:
    """The steps of a request asked at `since` under `policy`: the one computation for both kinds of request, so
    an unknown outcome's question escalates as an approval does."""
    steps: LadderSteps = {}
    if policy.remind_after_s is not None:
        steps["remind_at"] = since + policy.remind_after_s
    if policy.escalate_after_s is not None and policy.backup_approvers is not None:
        steps["escalates_at"] = since + policy.escalate_after_s
        steps["backup_approvers"] = sorted(policy.backup_approvers)
    return steps


class GatedActionRequest(ActionRequest, LadderSteps):
    """One gated call as a reviewer is shown it: LangChain's `ActionRequest` (`name`, `args` with `secret_args`
    masked, `description`: everything below in words, for clients that show only it), the facts a decision is
    bound to, and its `LadderSteps` from when the call was proposed."""

    tool_call_id: str
    """The model's id for the call; a decision that names it applies to this call only."""
    args_digest: str
    """The digest of the exact arguments that will run; a decision carrying it is refused if they changed."""
    requested_by: str | None
    """The user whose message the model answered with this call (bound as the message entered)."""
    requested_at: float
    """When the call was proposed (epoch seconds)."""
    expires_at: float | None
    """After this a decision is refused and the call is answered `approval_expired`; None: no expiry."""
    approvals_required: int
    """Distinct authorized reviewers who must approve before it runs."""
    approved_by: list[str]
    """Who has approved these exact arguments so far (a quorum in progress)."""
    approvers: list[str] | None
    """The roles one of which a reviewer needs (None: any reviewer)."""
    review_note: NotRequired[str]
    """The policy's note for reviewers (an MCP tool: its server, and whether it is destructive or idempotent)."""
    preview: NotRequired[str]
    """What approving will do, in one line, from the policy's `preview` of the arguments shown."""
    sent_back: NotRequired[str]
    """Why a call that was to run without a person is now asked: the standing grant that covered it lapsed, or a
    limit across threads would be gone past (which, and by how much)."""


class DecidedAction(TypedDict):
    """A call of the request already decided, held until every call of the request is (so no write runs before
    the last decision): who decided it and how. It is no longer answerable."""

    tool_call_id: str
    name: str
    decision: str
    """`approve`, `edit`, `reject` or `respond`."""
    decided_by: list[str]


class GatedHITLRequest(TypedDict):
    """An approval request: LangChain v1's `HITLRequest` (`action_requests`, `review_configs`) with gatedloop's
    request id, so Agent Chat UI and `HumanInTheLoopMiddleware` clients answer it unchanged."""

    kind: Literal["approval"]
    """Tells it from an unknown outcome's question (`UnknownOutcomeRequest`)."""
    request_id: str
    """Stable while the same calls with the same arguments wait; any change makes a new one."""
    action_requests: list[GatedActionRequest]
    """The gated calls still waiting for a decision, in the model's order. An answer has one decision per call,
    or decides some of them by `tool_call_id` (each call by whoever its own rule admits)."""
    decided: NotRequired[list[DecidedAction]]
    """The request's calls already decided, waiting for the others (absent when none is)."""
    review_configs: list[ReviewConfig]
    """Per call: the decisions its policy allows, and those that need a justification."""
    error: NotRequired[str]
    """Why the previous answer to this request was refused (the request waits again)."""
    replaced: NotRequired[bool]
    """True when this request replaced one a new message left unanswered: an answer must name it (see
    `check_addressed`) until the reviewer has been shown it once."""


class InvalidDecision(ValueError):
    """A reviewer's answer that cannot be applied; nothing was changed and the request is still pending."""


class Decision(TypedDict):
    """One reviewer's checked answer for one gated call (LangChain's `Decision`, as one TypedDict); `type` is one
    of the tool's allowed `DecisionType`s and `note` is the answer's `reviewer` string, never authority."""

    type: DecisionType
    message: NotRequired[str]
    edited_action: NotRequired[dict[str, Any]]
    note: NotRequired[str]
    justification: NotRequired[str]
    """The reviewer's reason, kept as data in the decision's audit row and its receipt."""


def decider(
    policy: ToolPolicy, reviewer: CallContext, requester: str | None, call: str, waited_s: float | None = None
) -> str:
    """The one rule for who may decide a call, for every kind of answer (approval, unknown outcome, any kind
    added later): the answer's sender under the tool's `approvers` (and, once the call has waited `waited_s` past
    `escalate_after_s`, `backup_approvers`), `self_approval` and roles. Returns the name the audit trail records;
    raises InvalidDecision (nothing applied) when this reviewer may not."""
    refusal = policy.reviewer_refusal(reviewer, requester, waited_s)
    if refusal:
        raise InvalidDecision(f"{call}: {refusal}")
    return reviewer.user_id or ANONYMOUS


def pending_summary(actions: Sequence[GatedActionRequest]) -> str:
    return ", ".join(f"{a['name']} (tool_call_id {a['tool_call_id']})" for a in actions) or "nothing"


def check_decisions(request: Any, answer: Any) -> dict[str, Decision]:
    """Exact count and type checks, as LangChain's middleware does, plus addressing: the checked decision for
    each call it decides. An answer whose decisions name their calls may decide some of the pending calls (a
    request that mixes roles is decided call by call); one that names none decides all of them, in order. Raise
    InvalidDecision with the reason; nothing is applied."""
    actions: list[GatedActionRequest] = request.get("action_requests", [])
    configs: list[ReviewConfig] = request.get("review_configs", [])
    if not isinstance(answer, dict):
        raise InvalidDecision(f'the answer must be an object like {{"decisions": [...]}}, not {type(answer).__name__}')
    answered_request = answer.get("request_id")
    if answered_request is not None and answered_request != request.get("request_id"):
        raise InvalidDecision(
            f"the answer is for request {answered_request!r}, which is not the pending one (decided, replaced, or "
            f"never asked); pending now is request {request.get('request_id')!r}: {pending_summary(actions)}"
        )
    decisions = answer.get("decisions")
    if not isinstance(decisions, list):
        raise InvalidDecision('the answer needs a "decisions" list, one decision per action')
    named = any(_names_a_call(d) for d in decisions)
    if len(decisions) != len(actions) and not (named and len(decisions) < len(actions)):
        raise InvalidDecision(f"expected {len(actions)} decision(s), one per action, got {len(decisions)}")
    note = answer.get("reviewer")
    if note is not None and not isinstance(note, str):
        raise InvalidDecision('"reviewer" must be a string')
    checked: dict[str, Decision] = {}
    for index, (decision, position) in enumerate(zip(decisions, _addressed(decisions, actions), strict=True)):
        action = actions[position]
        checked[action["tool_call_id"]] = _check_one(index, decision, action, configs[position], note)
    return checked


REPLACED = (
    "the request changed since it was shown (a new message replaced the one it answered); answer it by request_id "
    "or tool_call_id"
)


def check_addressed(answer: Any, request: GatedHITLRequest) -> None:
    """Invariant 10's second half: an answer that names neither its request nor any of its calls never applies
    to a request that replaced the one its sender may have been shown. Such an answer to a `replaced` request is
    refused with the current request (the node shows it again, no longer `replaced`)."""
    if not request.get("replaced") or not isinstance(answer, dict) or answer.get("request_id") is not None:
        return
    decisions = answer.get("decisions")
    if isinstance(decisions, list) and any(_names_a_call(d) for d in decisions):
        return
    raise InvalidDecision(
        f"{REPLACED}; pending now is request {request['request_id']!r}: {pending_summary(request['action_requests'])}"
    )


def _names_a_call(decision: Any) -> bool:
    return isinstance(decision, dict) and ("tool_call_id" in decision or "args_digest" in decision)


def _addressed(decisions: list[Any], actions: Sequence[GatedActionRequest]) -> list[int]:
    """Which action each decision answers: by the call it names, or in order when none names one."""
    named = [_names_a_call(d) for d in decisions]
    if not any(named):
        return list(range(len(decisions)))
    positions: list[int] = []
    for index, decision in enumerate(decisions):
        if not named[index]:
            raise InvalidDecision(
                f"decision {index} names no call; when one decision names its call (tool_call_id), all must"
            )
        position = _position(index, decision, actions)
        if position in positions:
            raise InvalidDecision(f"two decisions answer {actions[position]['tool_call_id']!r}; give one per call")
        positions.append(position)
    return positions


def _position(index: int, decision: dict[str, Any], actions: Sequence[GatedActionRequest]) -> int:
    call_id = decision.get("tool_call_id")
    if call_id is not None:
        for position, action in enumerate(actions):
            if action["tool_call_id"] == call_id:
                return position
        raise InvalidDecision(
            f"decision {index} answers call {call_id!r}, which is not pending; pending: {pending_summary(actions)}"
        )
    matches = [p for p, a in enumerate(actions) if a["args_digest"] == decision.get("args_digest")]
    if not matches:
        raise InvalidDecision(f"decision {index}: it answers different arguments than the ones now pending")
    if len(matches) > 1:
        raise InvalidDecision(f"decision {index}: its args_digest matches several pending calls; name tool_call_id")
    return matches[0]


def _check_one(
    index: int, decision: Any, action: GatedActionRequest, config: ReviewConfig, note: str | None
) -> Decision:
    where = f"decision {index} ({action['name']})"
    if not isinstance(decision, dict):
        raise InvalidDecision(f"{where} must be an object, not {type(decision).__name__}")
    kind = decision.get("type")
    if kind not in ALL_DECISIONS:
        raise InvalidDecision(f"{where}: unknown type {kind!r}; expected one of {list(ALL_DECISIONS)}")
    if kind not in config["allowed_decisions"]:
        raise InvalidDecision(f"{where}: {kind!r} is not allowed here; allowed: {config['allowed_decisions']}")
    seen_digest = decision.get("args_digest")
    if seen_digest is not None and seen_digest != action["args_digest"]:
        raise InvalidDecision(f"{where}: it answers different arguments than the ones now pending")
    message = decision.get("message")
    if message is not None and not isinstance(message, str):
        raise InvalidDecision(f"{where}: message must be a string")
    if kind == "respond" and not message:
        raise InvalidDecision(f"{where}: respond needs a message")
    justification = _justification(where, decision)
    if kind in config.get("justification_required", ()) and not justification:
        raise InvalidDecision(f'{where}: {kind!r} needs a justification here: add "justification": "why"')
    if kind == "edit":
        edited = decision.get("edited_action")
        if not isinstance(edited, dict) or not isinstance(edited.get("args"), dict):
            raise InvalidDecision(f'{where}: edit needs "edited_action": {{"name", "args": {{...}}}}')
        if edited.get("name", action["name"]) != action["name"]:
            raise InvalidDecision(f"{where}: an edit cannot change the tool ({edited.get('name')!r})")
    result: Decision = {"type": cast(DecisionType, kind)}
    who = decision.get("reviewer", note)
    if isinstance(who, str) and who:
        result["note"] = who
    if message:
        result["message"] = message
    if kind == "edit":
        result["edited_action"] = decision["edited_action"]
    if justification:
        result["justification"] = justification
    return result


JUSTIFICATION_MAX_CHARS = 4000


def _justification(where: str, decision: dict[str, Any]) -> str | None:
    """A decision's `justification`: a string, kept stripped (None when absent or blank)."""
    text = decision.get("justification")
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidDecision(f"{where}: justification must be a string")
    if len(text) > JUSTIFICATION_MAX_CHARS:
        raise InvalidDecision(f"{where}: justification is longer than {JUSTIFICATION_MAX_CHARS} characters")
    return text.strip() or None


# --- a write whose outcome is unknown: the question and its answer (asked by unknown.py) ---------------------

UnknownDecisionType = Literal["done", "not_done", "abandon"]
UNKNOWN_DECISIONS: tuple[UnknownDecisionType, ...] = ("done", "not_done", "abandon")


class UnknownCall(LadderSteps):
    """One call whose outcome is unknown, as a person is asked about it. Its `LadderSteps` (optional, added with
    the expiry ladder) count from the question's first asking: from `escalates_at` a `backup_approvers` role may
    answer it too."""

    tool_call_id: str
    name: str
    args: dict[str, Any]
    idempotency_key: str
    reason: str


class UnknownOutcomeRequest(TypedDict):
    kind: Literal["unknown_outcome"]
    calls: list[UnknownCall]
    allowed_decisions: list[UnknownDecisionType]
    error: NotRequired[str]


def check_unknown_answer(answer: Any, count: int) -> list[dict[str, Any]]:
    if not isinstance(answer, dict) or not isinstance(answer.get("decisions"), list):
        raise InvalidDecision('the answer must be {"decisions": [...]}, one per call of unknown outcome')
    decisions = answer["decisions"]
    if len(decisions) != count:
        raise InvalidDecision(f"expected {count} decision(s), got {len(decisions)}")
    reviewer = answer.get("reviewer")
    checked = []
    for index, decision in enumerate(decisions):
        if not isinstance(decision, dict) or decision.get("type") not in UNKNOWN_DECISIONS:
            raise InvalidDecision(f"decision {index}: type must be one of {list(UNKNOWN_DECISIONS)}")
        if decision["type"] == "done" and "result" not in decision:
            raise InvalidDecision(f'decision {index}: "done" needs the "result" the write produced')
        note = decision.get("reviewer", reviewer)
        justification = _justification(f"decision {index}", decision)
        checked.append(
            {
                **{k: v for k, v in decision.items() if k != "justification"},
                **({"note": note} if isinstance(note, str) and note else {}),
                **({"justification": justification} if justification else {}),
            }
        )
    return checked


def approving_text(action: Mapping[str, Any], effect: str) -> str:
    """What approving this call will do, in one line: it runs (once, for a write) or counts toward the quorum, and
    the policy's preview if it gives one."""
    name = action["name"]
    needed, done = action["approvals_required"], len(action["approved_by"])
    if needed > done + 1:
        line = f"your approval makes {done + 1} of the {needed} needed; {name} runs after the last"
    elif effect == "write":
        line = f"{name} runs once with these arguments (a write: gatedloop cannot undo it)"
    else:
        line = f"{name} runs with these arguments (a read)"
    return f"{line}; it {action['preview']}" if action.get("preview") else line
