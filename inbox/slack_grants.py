"""Slack's "Approve + grant": approve a call, and grant its exact arguments ahead of time.

The grant is made by `gatedloop.graph.grants` under the tool's policy, as any grant (`runs.grant`): the clicker must
be a granter the rule admits (an approver role, not the requester unless the policy allows self-approval, the tool
`grantable`), and a tool that needs several approvers gives a pending grant, which a second granter confirms. Its
bounds are the call's arguments, each equal to its value (`exact_bounds`), for the call's requester only, a set
number of uses until an expiry (`GATEDLOOP_SLACK_GRANT_USES`, default 5, and `GATEDLOOP_SLACK_GRANT_EXPIRES`,
default 8h). Every rule is checked before the approval is sent, so a click that may not grant decides nothing;
the grant is made once the gate accepted the approval, and the message says what came of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.review_stats import DURATION, UNIT_S
from gatedloop.graph.display import day_and_clock
from gatedloop.graph.grants import PENDING, check_grant_in, grant_in
from gatedloop.graph.pending import PendingCall
from gatedloop.inbox.identity import Reviewer
from gatedloop.nodes.gate.grants import GrantRefused
from gatedloop.tools.arguments import args_digest
from gatedloop.tools.registry import ToolRegistry

USES_ENV = "GATEDLOOP_SLACK_GRANT_USES"
EXPIRES_ENV = "GATEDLOOP_SLACK_GRANT_EXPIRES"
DEFAULT_USES = 5
DEFAULT_EXPIRES_S = 8 * 3600.0


@dataclass(frozen=True)
class GrantDefaults:
    """What an "Approve + grant" click grants: how many calls, for how long."""

    uses: int = DEFAULT_USES
    expires_s: float = DEFAULT_EXPIRES_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> GrantDefaults:
        """`GATEDLOOP_SLACK_GRANT_USES` (a whole number, at least 1) and `GATEDLOOP_SLACK_GRANT_EXPIRES` (90s, 30m,
        8h, 7d); `ValueError` naming the variable for a value that cannot work."""
        uses_text = env.get(USES_ENV, "").strip() or str(DEFAULT_USES)
        if not uses_text.isdigit() or int(uses_text) < 1:
            raise ValueError(f"{USES_ENV}={uses_text!r}: expected a whole number of at least 1")
        expires_text = env.get(EXPIRES_ENV, "").strip()
        if not expires_text:
            return cls(int(uses_text))
        found = DURATION.fullmatch(expires_text)
        if found is None or not float(found.group(1)) > 0:
            raise ValueError(f"{EXPIRES_ENV}={expires_text!r}: expected a positive duration such as 90s, 30m, 8h or 7d")
        return cls(int(uses_text), float(found.group(1)) * UNIT_S[found.group(2)])


def registry_of(tools: Mapping[str, Any], policy: Any) -> ToolRegistry:
    """The thread's graph's tools and policies (`tools_and_policy` of the inbox's request source, standalone or
    under a server), as the grant rules read them."""
    return ToolRegistry(list(tools.values()), {name: policy(name) for name in tools})


def grant_refusal(
    registry: ToolRegistry, reviewer: Reviewer, call: PendingCall, requester: str | None, defaults: GrantDefaults
) -> str | None:
    """Why this click may not grant this call's arguments (None: it may), by the grant rules themselves, before
    anything is decided. The arguments shown must be the ones that run (a masked secret never bounds a grant)."""
    if args_digest(call.name, call.args) != call.args_digest:
        return f"{call.name} ({call.tool_call_id}): its arguments are not all shown, so no grant can name them"
    try:
        check_grant_in(
            registry,
            call.name,
            context=reviewer.context,
            uses=defaults.uses,
            expires_in_s=defaults.expires_s,
            requester=requester,
            exactly=call.args,
        )
    except GrantRefused as exc:
        return f"{call.name} ({call.tool_call_id}): {exc}"
    return None


def grant_call(
    registry: ToolRegistry,
    ledger: Ledger,
    reviewer: Reviewer,
    call: PendingCall,
    requester: str | None,
    defaults: GrantDefaults,
    thread_id: str,
) -> str:
    """Grant the call's exact arguments as the clicker (after the gate accepted her approval of it); what the
    message says of it: the grant made (pending until a second granter confirms it, for a quorum), or why not."""
    try:
        made = grant_in(
            registry,
            ledger,
            call.name,
            context=reviewer.context,
            uses=defaults.uses,
            expires_in_s=defaults.expires_s,
            requester=requester,
            exactly=call.args,
            note=f"Approve + grant in Slack (thread {thread_id}, call {call.tool_call_id})",
        )
    except GrantRefused as exc:
        return f"No grant for {call.name} ({call.tool_call_id}): {exc}"
    whose = f" by {requester}" if requester else ""
    line = (
        f"Granted {made.grant_id}: {made.tool} calls{whose} where {made.bounds}, {made.uses} uses, until"
        f" {day_and_clock(made.expires_at)}"
    )
    if made.status.startswith(PENDING):
        line += (
            f"; {made.status}: it covers nothing until another granter confirms it"
            f" (gatedloop grant confirm {made.grant_id})"
        )
    return line
