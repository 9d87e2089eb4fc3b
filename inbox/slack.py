"""Slack as a place to decide: the approval message (Block Kit) and what its buttons carry.

`gatedloop notify --slack-channel C` posts one message per pending request with `chat.postMessage`
(`SLACK_BOT_TOKEN`); its buttons (Approve / Reject, and a choice per call when there are several; "Approve +
grant" where the call's tool is `grantable`) carry the thread, the request id and each call's argument digest,
so a click decides exactly the request and arguments that were shown (`gatedloop.inbox.slack_actions` refuses
anything else). Edits need the form, so the message links the request's inbox card. `GATEDLOOP_SLACK_API_URL`
replaces Slack's API address (a local fake in tests).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatedloop.graph.pending import deciders_of

TOKEN_ENV = "SLACK_BOT_TOKEN"
API_URL_ENV = "GATEDLOOP_SLACK_API_URL"
SLACK_API_URL = "https://slack.com/api/"
ACTION_PREFIX = "gatedloop_"
DECISIONS = ("approve", "reject")
SUBMIT = "submit"
"""The button that sends each call's own choice (a request of several calls)."""
GRANT = "grant"
"""Approve the call and grant calls with exactly its arguments ahead of time (gatedloop.inbox.slack_grants): a
button of a one-call message, a call's choice in a message of several; only where the call's tool is grantable."""
BUTTON_WORDS = {"approve": "Approve", "grant": "Approve + grant", "reject": "Reject"}
MAX_VALUE = 2000
"""Slack's limit on a button's value: a request too large for it gets only the link to its card."""
MAX_ARGS_TEXT = 2500
"""Of a section's 3000 characters, what a call's arguments may take (longer ones are cut, the card has them all)."""


def web_client(token: str, env: Mapping[str, str] = os.environ) -> Any:
    """A `slack_sdk.WebClient` for the bot token, at `GATEDLOOP_SLACK_API_URL` when set."""
    from slack_sdk import WebClient

    base = env.get(API_URL_ENV) or SLACK_API_URL
    return WebClient(token=token, base_url=base.rstrip("/") + "/")


@dataclass(frozen=True)
class Click:
    """What a button carries: the request it was shown for and each call's (id, argument digest)."""

    thread_id: str
    request_id: str
    calls: tuple[tuple[str, str], ...]

    def value(self) -> str:
        return json.dumps({"t": self.thread_id, "r": self.request_id, "c": [list(c) for c in self.calls]})

    @classmethod
    def parse(cls, value: str) -> Click | None:
        """None for a value gatedloop did not make (the click then decides nothing)."""
        try:
            raw = json.loads(value)
            calls = tuple((str(c), str(d)) for c, d in raw["c"])
            return cls(str(raw["t"]), str(raw["r"]), calls)
        except (ValueError, KeyError, TypeError):
            return None


def escape(text: str) -> str:
    """Slack's mrkdwn escapes (&, <, >)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def call_block(index: int) -> str:
    """The block id of the section of call `index`, and (with `choice_action`) where its choice is read back."""
    return f"{ACTION_PREFIX}call_{index}"


def choice_action(index: int) -> str:
    return f"{ACTION_PREFIX}choice_{index}"


def approval_message(payload: Mapping[str, Any], link: str, headline: str = "Approval requested") -> dict[str, Any]:
    """The message for one approval request (an outbox `request` payload, arguments already masked): the thread's
    title as its card shows it, a section per call, then the buttons and a link to its card (for edits and
    justifications); each call says who may decide it (a request that mixes roles is decided by several
    reviewers, each clicking for her own calls). One call: Approve / Reject.
    Several: each call's section has its own Approve / Reject choice, and "Submit choices" sends them in one answer
    (the gate takes one decision per call, in one answer; Slack returns the clicker's choices with the click, so
    no half-made answer is kept anywhere), beside Approve all / Reject all. A call whose tool is grantable (the
    notice's `grantable`) gets "Approve + grant" too: its button, or one of its choices; never another call."""
    actions: Sequence[Mapping[str, Any]] = payload["actions"]
    tools = ", ".join(a["tool"] for a in actions)
    head = [f"*{escape(headline)}: {escape(tools)}*"]
    if payload.get("title"):  # queued by this release on: what the card calls the thread
        head.append(f"“{escape(payload['title'])}”")
    head.append(f"Thread `{escape(payload['thread_id'])}`")
    head.append(f"Requested by {escape(payload.get('requested_by') or 'unknown')}")
    if payload.get("backup_approvers"):
        head.append(f"Now also decided by: {escape(', '.join(payload['backup_approvers']))}")
    if payload.get("expires_at") is not None:
        head.append(f"Expires {utc(payload['expires_at'])}")
    click = Click(
        payload["thread_id"], payload["request_id"], tuple((a["tool_call_id"], a["args_digest"]) for a in actions)
    )
    value = click.value()
    decidable = len(value) <= MAX_VALUE
    several = len(actions) > 1 and decidable
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(head)}}]
    for index, action in enumerate(actions):
        args = json.dumps(action["args"], ensure_ascii=False)
        args = args if len(args) <= MAX_ARGS_TEXT else args[:MAX_ARGS_TEXT] + "… (cut: see the card)"
        quorum = action.get("approvals_required") or 1
        needs = f" (needs {quorum} approvals)" if quorum > 1 else ""
        text = f"`{escape(action['tool'])}`{needs} ```{escape(args)}```"
        if "approvers" in action:  # a notice queued before this release names no approvers
            text += f"\nWho may decide: {escape(deciders_of(action['approvers']))}"
        if action.get("note"):
            text += f"\n_{escape(action['note'])}_"
        if action.get("approving"):
            text += f"\nIf approved: {escape(action['approving'])}"
        section: dict[str, Any] = {
            "type": "section",
            "block_id": call_block(index),
            "text": {"type": "mrkdwn", "text": text},
        }
        if several:
            choices = ("approve", GRANT, "reject") if action.get("grantable") else DECISIONS
            section["accessory"] = {
                "type": "radio_buttons",
                "action_id": choice_action(index),
                "options": [{"text": {"type": "plain_text", "text": BUTTON_WORDS[d]}, "value": d} for d in choices],
            }
        blocks.append(section)
    buttons: list[dict[str, Any]] = []
    if several:
        submit = {"type": "plain_text", "text": "Submit choices"}
        buttons.append({"type": "button", "action_id": ACTION_PREFIX + SUBMIT, "text": submit, "value": value})
    every = " all" if len(actions) > 1 else ""
    grantable = decidable and len(actions) == 1 and bool(actions[0].get("grantable"))
    shown = ("approve", GRANT, "reject") if grantable else DECISIONS
    buttons += [
        {
            "type": "button",
            "action_id": ACTION_PREFIX + decision,
            "text": {"type": "plain_text", "text": BUTTON_WORDS[decision] + every},
            "value": value,
            **({"style": "danger"} if decision == "reject" else {"style": "primary"} if decision == "approve" else {}),
        }
        for decision in shown
        if decidable
    ]
    buttons.append(
        {
            "type": "button",
            "action_id": ACTION_PREFIX + "open",
            "text": {"type": "plain_text", "text": "Edit in inbox"},
            "url": link,
        }
    )
    blocks.append({"type": "actions", "block_id": "gatedloop_decide", "elements": buttons})
    return {"text": f"{headline}: {tools} (thread {payload['thread_id']}): {link}", "blocks": blocks}


def decided_message(blocks: Sequence[Mapping[str, Any]], line: str, *, keep_buttons: bool) -> list[dict[str, Any]]:
    """The message after a decision: its blocks with `line` added (who decided what, when, and what then happened),
    the buttons kept while the request still waits (a quorum), dropped once it is decided."""
    kept = [dict(b) for b in blocks if keep_buttons or b.get("type") != "actions"]
    if not keep_buttons:  # decided: the calls' choices go with the buttons
        kept = [{k: v for k, v in b.items() if k != "accessory"} for b in kept]
    note = {"type": "context", "elements": [{"type": "mrkdwn", "text": escape(line)}]}
    if keep_buttons and kept and kept[-1].get("type") == "actions":
        return [*kept[:-1], note, kept[-1]]
    return [*kept, note]
