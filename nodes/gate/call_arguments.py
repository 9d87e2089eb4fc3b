"""A call's arguments from the model's reply to `execute`: read once, carried in the plan as one checked value.

The whole path of a call's arguments, in one place:

1. `entry_plan` (model) reads what the model sent (a dict from `tool_calls`, the text of an `invalid_tool_calls`
   entry) with the tool's strictness (`ToolRegistry.read`) and keeps the result in the plan: exact `args` (and
   `repair`), or empty `args` and `unread` (the text and why it cannot be read); its digest is the proposal's.
2. `plan_arguments` (validate) checks the plan's value again, because the state is untrusted (a dict is checked,
   never re-parsed), and `checked_plan` gives the accepted call its arguments and their digest, the evidence.
3. `edited_call` (approve) is the only other entry: a reviewer's edit, read and checked like a model's proposal.
4. Admission (admission.py) recomputes the digest right before a call runs, deliberately, from what will run.

Nothing parses a call's arguments again on the way to the tool.

Checkpoints written before plans had `unread` carry unread text as `args={"__raw__": text}` (`RAW_ARGS`); a thread
stopped between `model` and `validate` still holds such plans, and `plan_arguments` reads them as `validate` did.
"""

from __future__ import annotations

from typing import Any

from gatedloop.nodes.state import CallPlan
from gatedloop.tools.arguments import CallArguments, ParsedArguments, UnreadArguments, args_digest, storable_text
from gatedloop.tools.errors import ToolFailure
from gatedloop.tools.policy import RAW_ARGS, CallContext
from gatedloop.tools.registry import CheckedCall, ToolRegistry


def entry_plan(registry: ToolRegistry, call_id: str, name: Any, raw_args: Any) -> CallPlan:
    """One proposed call as an open plan, its arguments read once; `validate` decides."""
    name = name if isinstance(name, str) else str(name)
    arguments = registry.read(name, raw_args)
    plan: CallPlan = {"id": call_id, "name": name, "args": {}, "verdict": "run", "effect": "write", "digest": ""}
    if isinstance(arguments, ParsedArguments):
        plan["args"] = arguments.args
        if arguments.repair:
            plan["repair"] = arguments.repair
    else:
        plan["unread"] = {"text": arguments.text, "problem": arguments.problem}
    plan["digest"] = proposed_digest(plan)
    return plan


def plan_arguments(registry: ToolRegistry, plan: CallPlan) -> CallArguments:
    """The value `entry_plan` kept, checked again (the state is untrusted; a dict is checked, not re-parsed).
    A plan from an older checkpoint (`{"__raw__": text}`) is read here, once, as `validate` read it then."""
    unread: Any = plan.get("unread")
    if unread is not None:
        if not isinstance(unread, dict):
            return UnreadArguments(storable_text(unread), "the arguments could not be read")
        return UnreadArguments(str(unread.get("text")), str(unread.get("problem") or "the arguments could not be read"))
    args: Any = plan.get("args")
    if not isinstance(args, dict):  # never written by `model`: a changed state, refused as not proposed anyway
        return UnreadArguments(storable_text(args), f"arguments must be a JSON object, got {type(args).__name__}")
    if set(args) == {RAW_ARGS}:
        return registry.read(plan["name"], args[RAW_ARGS])
    arguments = registry.read(plan["name"], args)
    repair = plan.get("repair")
    if isinstance(arguments, ParsedArguments) and isinstance(repair, str) and repair:
        return ParsedArguments(arguments.args, repair)
    return arguments


def stored_form(plan: CallPlan) -> Any:
    """The plan's arguments as the proposal record digests them and the audit trail shows them: unread text as
    `{"__raw__": text}`, so both keep the values they had when plans carried the text that way."""
    unread: Any = plan.get("unread")
    if isinstance(unread, dict):
        return {RAW_ARGS: unread.get("text")}
    return plan.get("args")


def proposed_digest(plan: CallPlan) -> str:
    """`args_digest` of the plan's tool and arguments as `model` built them (never raises)."""
    return args_digest(str(plan.get("name")), stored_form(plan))


def checked_plan(plan: CallPlan, checked: CheckedCall) -> CallPlan:
    """The plan with its checked arguments and their digest, recomputed from them and never taken from the state:
    it becomes the ledger's evidence."""
    accepted: CallPlan = {**plan, "args": checked.args, "digest": args_digest(plan["name"], checked.args)}
    if checked.repair:
        accepted["repair"] = checked.repair
    return accepted


def edited_call(
    registry: ToolRegistry, name: str, edited_args: dict[str, Any], requester: CallContext
) -> CheckedCall | ToolFailure:
    """A reviewer's edit, entering like a model's proposal: read with the tool's strictness, then checked as the
    requester (schema, roles, the tool's validator)."""
    return registry.check_call(name, registry.read(name, edited_args), requester)
