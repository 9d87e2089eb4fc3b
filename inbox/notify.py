"""Telling reviewers: the deliverer that POSTs the notification outbox (checkpoints/outbox.py) to webhooks.

The graph only inserts outbox rows; this module sends them, so nothing in the graph's path waits on the network.
Run by `gatedloop notify` (alone, or `--once` from cron) or as a thread of `gatedloop inbox` when webhooks are
configured. Each pass:

1. queues an expiry notice (`approval_expiring`) for every request whose expiry is near (`expiry_warning_s`, at
   most half its time to live) and that is still undecided: no graph step is needed for it. One per deadline: a
   request an approver extended is warned again before its new deadline, the notice naming it;
2. gives each configured endpoint a delivery row for every notice it has not seen: `pending` if the request is
   still open, else `skipped` (a webhook configured today is not flooded with requests decided last week; an
   unknown outcome's question is closed once each call it asks about is finished in the ledger; a request a limit
   sent back to a person after its approval is open again, approvals counted as the gate counts them: only those
   after it). A reminder or an
   escalation (queued with an approval request, or with an unknown outcome's question, due at its time) is seen
   once due, like the request it belongs to, and recorded in the audit trail when it is sent. A notice that
   tells what happened (`approval_decided`: who decided what; `request_finished`: how a request a reviewer
   decided ended, and each tool answer) is always `pending`, unless older than `history_s` when first seen; so is
   a standing grant's notice (`grant_created`, `grant_confirmed`, `grant_revoked`, and `grant_used` where the
   deliverer opts in with
   `grant_uses`, else `skipped`);
3. sends every due delivery it can claim (a lease, taken by a conditional UPDATE; the lease of a deliverer that
   died passes on at once, an expired one too), and records the outcome: `delivered` on a 2xx, else another
   attempt after an exponential backoff, `failed` after `max_attempts`. An expiry notice, a reminder or an
   escalation whose request was decided (or question settled) meanwhile is `skipped` instead of sent.

At least once: a deliverer killed after the POST and before recording it leaves the delivery pending, and the next
one posts it again, under the same `webhook-id`, which receivers de-duplicate by. Every body is signed by the
Standard Webhooks specification (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">`, with the `standardwebhooks` package), so the id a receiver de-duplicates by is signed
and receivers verify with a library in their language. The old `X-Gatedloop-*` headers (the id outside the
signature) are still sent in this release only, for receivers moving over. httpx (already installed with
langgraph-sdk) makes the requests; the queue is hand-written because the outbox must live in gatedloop's own
database, in the transaction the graph writes. A Slack channel (`--slack-channel`) is an endpoint like the others,
posted to with `chat.postMessage` (`gatedloop.inbox.slack`: an approval request gets its Approve / Reject buttons;
a grant's notice is one line, asking nobody).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import httpx
from standardwebhooks import Webhook as Webhook_

from gatedloop.checkpoints.evidence import ApprovalRecord
from gatedloop.checkpoints.ledger import SqlLedger
from gatedloop.checkpoints.outbox import Delivery, DeliveryState, Notification, notification_id
from gatedloop.graph.pending import by_decider, deciders_of
from gatedloop.inbox.slack import TOKEN_ENV, approval_message, web_client
from gatedloop.nodes.gate.admission import SENT_BACK, request_deadline_at, shown_deadlines
from gatedloop.nodes.run.notices import UNKNOWN_PREFIX

log = logging.getLogger("gatedloop.notify")

URLS_ENV = "GATEDLOOP_NOTIFY_URLS"
SECRET_ENV = "GATEDLOOP_NOTIFY_SECRET"
INBOX_URL_ENV = "GATEDLOOP_INBOX_URL"
SLACK_PREFIX = "slack+"
DEFAULT_INBOX_URL = "http://127.0.0.1:8765/inbox"

ID_HEADER = "X-Gatedloop-Id"
TIMESTAMP_HEADER = "X-Gatedloop-Timestamp"
SIGNATURE_HEADER = "X-Gatedloop-Signature"
"""The old recipe's headers, deprecated: sent beside the Standard Webhooks headers in this release, then dropped."""
SECRET_PREFIX = "whsec_"

EVENT_TYPES = {
    "request": "approval_requested",
    "expiring": "approval_expiring",
    "unknown": "outcome_unknown",
    "decided": "approval_decided",
    "finished": "request_finished",
    "reminder": "approval_reminder",
    "escalated": "approval_escalated",
    "unknown_reminder": "outcome_unknown_reminder",
    "unknown_escalated": "outcome_unknown_escalated",
    "grant_created": "grant_created",
    "grant_confirmed": "grant_confirmed",
    "grant_revoked": "grant_revoked",
    "grant_used": "grant_used",
}
"""By `shown_kind`, as are the tables below."""
HEADLINES = {
    "request": "Approval requested",
    "expiring": "Approval expiring soon",
    "unknown": "Outcome unknown",
    "decided": "Decided",
    "finished": "Finished",
    "reminder": "Still waiting for approval",
    "escalated": "Escalated to backup approvers",
    "unknown_reminder": "Outcome unknown, still waiting for an answer",
    "unknown_escalated": "Outcome unknown, escalated to backup approvers",
    "grant_created": "Grant created",
    "grant_confirmed": "Grant confirmed",
    "grant_revoked": "Grant revoked",
    "grant_used": "Grant used",
}
AUDIT_STEPS = {
    "reminder": "approval_reminded",
    "escalated": "approval_escalated",
    "unknown_reminder": "unknown_outcome_reminded",
    "unknown_escalated": "unknown_outcome_escalated",
}
"""The audit event of each step sent (`<event>:<request id>`)."""
LADDER = frozenset({"reminder", "escalated"})
"""A request's later steps: queued with it, due at their time, sent only while it is still undecided (or, for an
unknown outcome's question, unsettled)."""
TELLS = frozenset({"decided", "finished"})
"""Notices that tell what happened (nobody is asked anything): never closed, only too old for a new endpoint."""
GRANTS = frozenset({"grant_created", "grant_confirmed", "grant_revoked", "grant_used"})
"""A standing grant's notices: about no request (`request_id` is the grant's id; `thread_id` is "" but for a use,
the thread of the call it approved). They tell, like `TELLS`; `grant_used` only to a deliverer that opts in."""
GRANT_TERMS = ("grant_id", "tool", "bounds", "bounds_text", "requester", "uses", "uses_left", "expires_at")
"""What every notice of a grant made, confirmed or revoked says of it."""
GRANT_KEYS = {
    "grant_created": (*GRANT_TERMS, "granted_by", "created_at", "status", "approvals_required", "note"),
    "grant_confirmed": (
        *GRANT_TERMS,
        "confirmed_by",
        "confirmed_at",
        "granted_by",
        "status",
        "approvals_required",
        "note",
    ),
    "grant_revoked": (*GRANT_TERMS, "revoked_by", "revoked_at", "note"),
    "grant_used": ("grant_id", "tool", "requester", "thread_id", "tool_call_id", "uses", "uses_left", "used_at"),
}
"""The generic body's keys of a grant's notices, beside id, type and url. Bounds are masked by the tool's
`secret_args` when queued (graph/grants.py)."""
GRANT_USES_ENV = "GATEDLOOP_NOTIFY_GRANT_USES"
GRANT_USES_SKIPPED = "grant uses are not sent (opt in: --grant-uses or GATEDLOOP_NOTIFY_GRANT_USES=1)"
TOLD_KEYS = {
    "decided": ("requested_by", "decided_by", "decided_at", "waiting", "actions"),
    "finished": ("request_ids", "status", "detail", "ran"),
}
"""The generic body's keys of the notices that tell, beside id, type, request, thread and url (and a `decided`
notice's `waiting_for`, in words)."""
DECISION_WORDS = {"approve": "approved", "edit": "edited and approved", "reject": "rejected", "respond": "answered"}
APPROVAL_ACTION_KEYS = ("tool", "tool_call_id", "args", "approvals_required", "approvers", "expires_at")
UNKNOWN_ACTION_KEYS = ("tool", "tool_call_id", "args", "idempotency_key", "reason")
"""Each action's keys in the generic body: an approval's, and an unknown outcome's question's (no approvals, no
expiry; why it is unknown and the key its write was started with). `approvers` (the roles that may decide it,
null: any reviewer) is absent from a notice queued before this release."""
ERROR_CHARS = 300

WebhookFormat = Literal["generic", "slack", "slack_channel"]
"""`slack_channel`: posted with `chat.postMessage` (approval requests get Approve / Reject buttons)."""


class NotifyConfigError(ValueError):
    """Webhook configuration that cannot work (a bad URL, no secret); one line saying what to fix."""


@dataclass(frozen=True)
class Webhook:
    url: str
    format: WebhookFormat = "generic"

    @property
    def endpoint(self) -> str:
        """How the outbox names this endpoint: a digest of format and URL (a Slack URL is a credential)."""
        return hashlib.sha256(f"{self.format}:{self.url}".encode()).hexdigest()[:24]

    @property
    def shown(self) -> str:
        """The URL as `--status` shows it: scheme, host and the start of the path (no query, no token)."""
        if self.format == "slack_channel":
            return f"slack channel {self.url}"
        parts = urlsplit(self.url)
        path = parts.path if len(parts.path) <= 16 else parts.path[:16] + "…"
        return f"{SLACK_PREFIX if self.format == 'slack' else ''}{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class NotifyConfig:
    """The deliverer's side of notifications; the graph knows none of it."""

    webhooks: tuple[Webhook, ...]
    secret: bytes
    inbox_url: str = DEFAULT_INBOX_URL
    timeout_s: float = 10.0
    backoff_s: float = 2.0
    max_backoff_s: float = 300.0
    max_attempts: int = 20
    lease_s: float = 60.0
    """Longer than `timeout_s`: a deliverer still waiting on a slow receiver keeps its claim."""
    poll_s: float = 1.0
    expiry_warning_s: float = 600.0
    history_s: float = 3600.0
    """A `decided` or `finished` notice older than this when an endpoint first sees it is skipped (an endpoint
    configured today is not told of last week's decisions)."""
    slack_token: str = field(default="", repr=False)
    """`SLACK_BOT_TOKEN`, for the Slack channels among `webhooks`."""
    grant_uses: bool = False
    """Send `grant_used` (one notice per write a standing grant approved); off unless asked for, since a busy grant
    would fill a channel. Grants made and revoked are always sent."""


def parse_webhook(text: str, *, slack: bool = False) -> Webhook:
    """`https://...` (generic JSON) or `slack+https://...` (Slack's incoming-webhook body)."""
    url = text.strip()
    if url.startswith(SLACK_PREFIX):
        url, slack = url.removeprefix(SLACK_PREFIX), True
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotifyConfigError(
            f"webhook URL {text!r} is not an http(s) URL with a host (slack+https://... for a Slack webhook)"
        )
    return Webhook(url, "slack" if slack else "generic")


def notify_config(
    webhooks: Sequence[str] = (),
    slack_webhooks: Sequence[str] = (),
    slack_channels: Sequence[str] = (),
    *,
    inbox_url: str | None = None,
    default_inbox_url: str = DEFAULT_INBOX_URL,
    env: Mapping[str, str] = os.environ,
    grant_uses: bool | None = None,
    **tuning: Any,
) -> NotifyConfig | None:
    """The configuration from options, else `GATEDLOOP_NOTIFY_URLS` (comma or space separated); None when no
    webhook is configured. The secret is `GATEDLOOP_NOTIFY_SECRET`, never an option (a command line is public); a
    Slack channel is posted to with `SLACK_BOT_TOKEN`. `grant_uses` (None: `GATEDLOOP_NOTIFY_GRANT_USES`, `1`,
    `true` or `yes`) sends `grant_used` notices too."""
    given = [parse_webhook(u) for u in webhooks] + [parse_webhook(u, slack=True) for u in slack_webhooks]
    if not given:
        given = [parse_webhook(u) for u in re.split(r"[\s,]+", env.get(URLS_ENV, "")) if u]
    channels = [Webhook(c.strip(), "slack_channel") for c in slack_channels if c.strip()]
    if not given and not channels:
        return None
    secret = env.get(SECRET_ENV, "")
    if given and not secret:
        raise NotifyConfigError(f"webhooks are configured but {SECRET_ENV} is not set: the bodies are signed with it")
    if secret.startswith(SECRET_PREFIX):
        try:
            signer(secret.encode())
        except ValueError:  # binascii.Error: not base64
            raise NotifyConfigError(f"{SECRET_ENV} starts with {SECRET_PREFIX} but the rest is not base64") from None
    token = env.get(TOKEN_ENV, "")
    if channels and not token:
        raise NotifyConfigError(f"a Slack channel is given but {TOKEN_ENV} is not set: messages are posted with it")
    inbox = inbox_url or env.get(INBOX_URL_ENV) or default_inbox_url
    if urlsplit(inbox).scheme not in ("http", "https") or not urlsplit(inbox).hostname:
        raise NotifyConfigError(f"inbox URL {inbox!r} is not an http(s) URL with a host")
    if grant_uses is None:
        grant_uses = env.get(GRANT_USES_ENV, "").strip().lower() in ("1", "true", "yes")
    webhooks_ = tuple(dict.fromkeys([*given, *channels]))
    return NotifyConfig(
        webhooks_, secret.encode(), inbox.rstrip("/"), slack_token=token, grant_uses=grant_uses, **tuning
    )


def signer(secret: bytes) -> Webhook_:
    """The Standard Webhooks signer of `GATEDLOOP_NOTIFY_SECRET`: a `whsec_<base64>` secret as the specification
    has it, any other text as its UTF-8 bytes (receivers then pass `secret.encode()` to `Webhook`)."""
    text = secret.decode()
    return Webhook_(text) if text.startswith(SECRET_PREFIX) else Webhook_(secret)


def signed_headers(secret: bytes, notice_id: str, body: bytes, now: float) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp`, `webhook-signature` (and, for one release, the old headers)."""
    at = datetime.fromtimestamp(int(now), tz=UTC)
    timestamp = str(int(now))
    return {
        "webhook-id": notice_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": signer(secret).sign(notice_id, at, body.decode()),
        ID_HEADER: notice_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The old signature header's value (deprecated): HMAC-SHA256 over `{timestamp}.{body}`."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def about_unknown(notice: Notification) -> bool:
    """Whether the notice is about an unknown outcome's question (the question, or its reminder or escalation):
    its payload is the question's, which has none of an approval's fields."""
    return notice.request_id.startswith(UNKNOWN_PREFIX)


def shown_kind(notice: Notification) -> str:
    """The notice's kind as the tables above read it: an unknown outcome's reminder and escalation are told apart
    from an approval request's (`unknown_reminder`, `unknown_escalated`)."""
    return f"unknown_{notice.kind}" if notice.kind in LADDER and about_unknown(notice) else notice.kind


def event_type(notice: Notification) -> str:
    return EVENT_TYPES[shown_kind(notice)]


def request_link(config: NotifyConfig, notice: Notification) -> str:
    """The request's page in the inbox; the thread names it exactly (request ids repeat across threads). A question
    about an unknown outcome links its thread's page, which shows the thread's pending request: the inbox names
    that question by its interrupt id, which LangGraph makes only once the question is put, after its notice."""
    thread = quote(notice.thread_id, safe="")
    if notice.kind in GRANTS and not notice.thread_id:  # made or revoked: the grants the inbox lists
        return f"{config.inbox_url}/grants"
    if notice.kind in ("finished", "grant_used") or about_unknown(notice):
        return f"{config.inbox_url}/thread/{thread}"
    return f"{config.inbox_url}/requests/{quote(notice.request_id, safe='')}?thread={thread}"


def generic_body(notice: Notification, link: str) -> dict[str, Any]:
    """The generic JSON body: what was asked, by whom, until when, and where to answer. Arguments are masked. An
    unknown outcome's actions say why it is unknown (`reason`) and the key its write was started with."""
    p = notice.payload
    if notice.kind in GRANTS:
        return {
            "id": notice.id,
            "type": event_type(notice),
            **{k: p.get(k) for k in GRANT_KEYS[notice.kind]},
            "url": link,
        }
    head = {"id": notice.id, "type": event_type(notice), "request_id": notice.request_id}
    if notice.kind in TELLS:
        told = {k: p[k] for k in TOLD_KEYS[notice.kind]}
        return {**head, "thread_id": notice.thread_id, **told, **_told_waiting(notice), "url": link}
    keys = UNKNOWN_ACTION_KEYS if about_unknown(notice) else APPROVAL_ACTION_KEYS
    waiting = None if about_unknown(notice) else waiting_text(p["actions"])
    return {
        **head,
        "thread_id": notice.thread_id,
        "requested_by": p["requested_by"],
        "requested_at": p["requested_at"],
        "expires_at": p["expires_at"],
        "actions": [{k: a[k] for k in keys if k in a} for a in p["actions"]],
        **({"waiting_for": waiting} if waiting else {}),
        **({"backup_approvers": p["backup_approvers"]} if notice.kind == "escalated" else {}),
        "url": link,
    }


def waiting_text(actions: Sequence[Mapping[str, Any]]) -> str:
    """Who these calls wait for, per role, in the operator layer's words ("finance: refund; support: send_email");
    empty for a notice queued before it named each call's `approvers`."""
    if not all("approvers" in a for a in actions):
        return ""
    return by_decider((deciders_of(a["approvers"]), a["tool"]) for a in actions)


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _told_waiting(notice: Notification) -> dict[str, Any]:
    """A `decided` notice's `waiting_for` in words: the calls no one has decided yet, per role ("" if none; a
    notice queued before this release names none)."""
    if notice.kind != "decided":
        return {}
    return {"waiting_for": waiting_text(notice.payload.get("waiting_for") or [])}


def told_lines(notice: Notification) -> list[str]:
    """What a `decided` or `finished` notice says, in words: who decided what, or how the request ended."""
    p = notice.payload
    if notice.kind == "decided":
        each = ", ".join(
            f"{DECISION_WORDS.get(a['decision'] or '', a['decision'])} {a['tool']} ({a['tool_call_id']})"
            for a in p["actions"]
        )
        others = waiting_text(p.get("waiting_for") or [])
        waits = f"; the request still waits for {others}" if others else ""
        waits = waits or ("; the request still waits for more approvals" if p["waiting"] else "")
        return [f"{p['decided_by']} {each} at {_utc(p['decided_at'])}{waits}"]
    ran = ", ".join(f"{r['tool']} ({r['tool_call_id']}): {r['status']}" for r in p["ran"]) or "no tool"
    detail = f" ({p['detail']})" if p["detail"] else ""
    return [f"The request ended: {p['status']}{detail}", f"Tool answers: {ran}"]


def grant_line(notice: Notification) -> str:
    """A grant's notice in one line: what was granted (bounds masked), revoked, or used, and what is left."""
    p = notice.payload
    left = f"{p['uses_left']} of {p['uses']} uses left"
    if notice.kind == "grant_used":
        whose = f"{p['requester']}'s " if p.get("requester") else ""
        call = f"{whose}{p['tool']} ({p['tool_call_id']}) in thread {p['thread_id']}"
        return f"Grant {p['grant_id']} approved {call}; {left}"
    what = f"{p['tool']} where {p.get('bounds_text') or 'any arguments'}"
    whose = f", {p['requester']}'s calls" if p.get("requester") else ""
    if notice.kind == "grant_confirmed":
        by = f"{p['status']} (granted by {', '.join(p['granted_by'])})"
        return f"Grant {p['grant_id']} confirmed by {p['confirmed_by']}: {what}{whose}; {by}"
    if notice.kind == "grant_revoked":
        return f"Grant {p['grant_id']} revoked by {p['revoked_by']}: {what}{whose}; {left}"
    note = f" ({p['note']})" if p.get("note") else ""
    return (
        f"Grant {p['grant_id']} created by {p['granted_by']}: {what}{whose}; {p['uses']} uses; until"
        f" {_utc(p['expires_at'])}; {p.get('status') or 'live'}{note}"
    )


def slack_body(notice: Notification, link: str) -> dict[str, Any]:
    """Slack's incoming-webhook body: `text` (the notification's fallback) and Block Kit blocks. A grant's notice is
    one line with its link (it asks nobody)."""
    p = notice.payload
    if notice.kind in GRANTS:
        told = grant_line(notice)
        section = {"type": "mrkdwn", "text": f"{_slack_escape(told)} <{link}|Open in inbox>"}
        return {"text": told, "blocks": [{"type": "section", "text": section}]}
    if notice.kind in TELLS:
        lines = told_lines(notice)
        text = f"{HEADLINES[notice.kind]} (thread {notice.thread_id}): {lines[0]}"
        shown = [f"*{HEADLINES[notice.kind]}*, thread `{_slack_escape(notice.thread_id)}`"]
        shown += [_slack_escape(line) for line in lines]
        button = {"type": "button", "text": {"type": "plain_text", "text": "Open in inbox"}, "url": link}
        return {
            "text": text,
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(shown)}},
                {"type": "actions", "elements": [button]},
            ],
        }
    tools = ", ".join(a["tool"] for a in p["actions"])
    headline = f"{HEADLINES[shown_kind(notice)]}: {tools}"
    lines = [f"*{_slack_escape(headline)}*", f"Thread `{_slack_escape(notice.thread_id)}`"]
    lines.append(f"Requested by {_slack_escape(p['requested_by'] or 'unknown')}")
    if notice.kind == "escalated":
        lines.append(f"Now also decided by: {_slack_escape(', '.join(p['backup_approvers']))}")
    if p["expires_at"] is not None:
        lines.append(f"Expires {_utc(p['expires_at'])}")
    for action in p["actions"]:
        args = json.dumps(action["args"], ensure_ascii=False)
        lines.append(f"`{_slack_escape(action['tool'])}` ```{_slack_escape(args)}```")
        if "approvers" in action:
            lines.append(f"Who may decide: {_slack_escape(deciders_of(action['approvers']))}")
        if "reason" in action:
            lines.append(f"Why unknown: {_slack_escape(action['reason'])}")
    return {
        "text": f"{headline} (thread {notice.thread_id}): {link}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}},
            {
                "type": "actions",
                "elements": [{"type": "button", "text": {"type": "plain_text", "text": "Open in inbox"}, "url": link}],
            },
        ],
    }


def body_bytes(webhook: Webhook, notice: Notification, config: NotifyConfig) -> bytes:
    link = request_link(config, notice)
    body = slack_body(notice, link) if webhook.format == "slack" else generic_body(notice, link)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def closed_reason(ledger: SqlLedger, notice: Notification, now: float) -> str | None:
    """Why the request needs no reviewer any more (None: it still does), from the ledger's evidence only: it
    expired, its thread was cancelled, or every call in it was decided (answered, started, edited, or approved
    by as many reviewers as it needs; for an unknown outcome's question, settled). An expiry notice is closed too
    once an extension moved the deadline it warns of."""
    if notice.kind in TELLS or notice.kind in GRANTS:
        return None
    if about_unknown(notice):
        return "thread cancelled" if ledger.cancel_requested(notice.thread_id) else _settled_reason(ledger, notice)
    actions = notice.payload["actions"]
    ids = [a["tool_call_id"] for a in actions]
    approvals = ledger.approvals(notice.thread_id, ids)
    deadlines = call_deadlines(notice, approvals)
    deadline = _deadline_at(notice, deadlines, now)
    if deadline is not None and now >= deadline:
        return "expired before delivery"
    if notice.kind == "expiring" and deadline != notice.expires_at:  # deadlines only move later
        return "extended before delivery"  # a later warning names the new deadline
    if ledger.cancel_requested(notice.thread_id):
        return "thread cancelled"
    records = ledger.calls(notice.thread_id, ids)
    asked_at = _asked_at(ledger, notice)
    expired = False
    for action in actions:
        call_id = action["tool_call_id"]
        record = records.get(call_id)
        mine = [a for a in approvals if a.call_id == call_id]
        sent_back = [a.at for a in mine if a.decision == SENT_BACK]
        if any(at > asked_at for at in sent_back):
            continue  # let run after this request, then sent back to a person: a newer request asks her again
        mine = [a for a in mine if a.at > max(sent_back, default=-math.inf)]  # as the gate counts: after it only
        approvers = {a.reviewer for a in mine if a.decision == "approve" and a.args_digest == action["args_digest"]}
        decided = (
            record is None
            or record.answer_digest is not None
            or ledger.get(notice.thread_id, call_id) is not None
            or any(a.decision == "edit" for a in mine)
            or len(approvers) >= action["approvals_required"]
        )
        if not decided and now >= deadlines.get(call_id, math.inf):
            expired = True  # this call is answered expired when the graph next runs; another may still wait
        elif not decided:
            return None
    return "expired before delivery" if expired else "decided before delivery"


def _asked_at(ledger: SqlLedger, notice: Notification) -> float:
    """When the request was put to a person: its `request` notice's time (an expiry notice, a reminder or an
    escalation is queued later, or ahead, under the same request id)."""
    if notice.kind == "request":
        return notice.created_at
    asked = ledger.notification(notification_id(notice.thread_id, notice.request_id, "request"))
    return asked.created_at if asked is not None else notice.created_at


def call_deadlines(notice: Notification, approvals: Sequence[ApprovalRecord]) -> dict[str, float]:
    """Each call's deadline, with the approvers' extensions (`shown_deadlines`)."""
    calls = [(a["tool_call_id"], a.get("requested_at"), a.get("expires_at")) for a in notice.payload["actions"]]
    return shown_deadlines(calls, approvals)


def request_deadline(notice: Notification, approvals: Sequence[ApprovalRecord], now: float) -> float | None:
    """When an approval request expires as seen at `now`: its calls' earliest deadline still ahead, else its last
    (`request_deadline_at`); a notice queued without its calls' deadlines, its own."""
    return _deadline_at(notice, call_deadlines(notice, approvals), now)


def _deadline_at(notice: Notification, deadlines: Mapping[str, float], now: float) -> float | None:
    found = request_deadline_at(deadlines.values(), now)
    return found if found is not None else notice.expires_at


def _settled_reason(ledger: SqlLedger, notice: Notification) -> str | None:
    """An unknown outcome's question is closed once every call it asks about has a finished ledger entry (done,
    failed or abandoned: a person answered, a late finish or `reconcile` told, or it ran again)."""
    for action in notice.payload["actions"]:
        entry = ledger.get(notice.thread_id, action["tool_call_id"])
        if entry is None or entry.state == "claimed":
            return None
    return "settled before delivery"


@dataclass
class PassResult:
    delivered: int = 0
    failed: int = 0
    skipped: int = 0


@dataclass
class Deliverer:
    """Sends the outbox of one database to the configured webhooks; see the module docstring for one pass."""

    ledger: SqlLedger
    config: NotifyConfig
    clock: Callable[[], float] = time.time
    client: httpx.Client = field(default_factory=lambda: httpx.Client())
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _slack: Any = field(default=None, repr=False)

    @property
    def claimant(self) -> str:
        """The process's ledger claimant (whose liveness other deliverers can check) and this deliverer's token."""
        return f"{self.ledger.claimant}#{self.token}"

    def run_once(self) -> PassResult:
        result = PassResult()
        self._warn_expiring(self.clock())
        self._dispatch(self.clock())
        by_endpoint = {w.endpoint: w for w in self.config.webhooks}
        for delivery in self.ledger.due_deliveries(list(by_endpoint), self.clock()):
            state = self._attempt(delivery, by_endpoint[delivery.endpoint])
            if state == "delivered":
                result.delivered += 1
            elif state == "skipped":
                result.skipped += 1
            elif state is not None:
                result.failed += 1
        return result

    def run(self, stop: threading.Event) -> None:
        """Passes every `poll_s` until `stop` is set; a pass that fails (a busy database) is logged and retried."""
        while True:
            try:
                self.run_once()
            except Exception:
                log.exception("notification pass failed; retrying in %.1f s", self.config.poll_s)
            if stop.wait(self.config.poll_s):
                return

    def _warn_expiring(self, now: float) -> None:
        """One expiry notice per deadline of a request still open: before the first one, and again before each
        one an extension gave it. The notice names the deadline it warns of (`expires_at`, in the row and the
        body) and is told apart by it (`part`), so two deliverers queue it once."""
        for notice in self.ledger.unwarned(now):
            ids = [a["tool_call_id"] for a in notice.payload["actions"]]
            deadline = request_deadline(notice, self.ledger.approvals(notice.thread_id, ids), now)
            assert deadline is not None  # `unwarned` selects requests with an expiry
            ttl = notice.payload["expires_at"] - notice.payload["requested_at"]  # as queued: the row's may be extended
            if now < deadline - min(self.config.expiry_warning_s, ttl / 2):
                continue
            if closed_reason(self.ledger, notice, now) is None:
                self.ledger.record_notification(
                    notice.thread_id,
                    notice.request_id,
                    "expiring",
                    {**notice.payload, "expires_at": deadline},
                    created_at=now,
                    expires_at=deadline,
                    part=repr(deadline),
                )

    def _dispatch(self, now: float) -> None:
        reasons: dict[str, str | None] = {}  # a notice's closed reason, read once for all the endpoints
        for webhook in self.config.webhooks:
            rows: list[tuple[str, str, str, DeliveryState, str | None]] = []
            for notice in self.ledger.undispatched(webhook.endpoint, now):
                if notice.id not in reasons:
                    reasons[notice.id] = self._skip_reason(notice, now)
                    if notice.kind in LADDER and reasons[notice.id] is None:
                        self._audit_step(notice, now)
                reason = reasons[notice.id]
                rows.append((notice.id, webhook.endpoint, webhook.shown, "skipped" if reason else "pending", reason))
            self.ledger.dispatch(rows, now)

    def _skip_reason(self, notice: Notification, now: float) -> str | None:
        """Why this notice is not sent to an endpoint that sees it now (None: it is sent)."""
        if notice.kind == "grant_used" and not self.config.grant_uses:
            return GRANT_USES_SKIPPED
        tells = notice.kind in TELLS or notice.kind in GRANTS
        if tells and now - notice.created_at > self.config.history_s:
            return "older than the history window"
        return closed_reason(self.ledger, notice, now)

    def _audit_step(self, notice: Notification, now: float) -> None:
        """A reminder or an escalation is evidence too: the request's (or question's) step, with when it was due,
        kept once."""
        step = AUDIT_STEPS[shown_kind(notice)]
        detail = {"request_id": notice.request_id, "due_at": notice.created_at, "seen_at": now}
        if notice.kind == "escalated":
            detail["backup_approvers"] = notice.payload["backup_approvers"]
        first = notice.payload["actions"][0]["tool_call_id"]
        self.ledger.record(notice.thread_id, first, f"{step}:{notice.request_id}", detail, actor="gatedloop-notify")

    def _attempt(self, delivery: Delivery, webhook: Webhook) -> DeliveryState | None:
        """One attempt at one delivery; the state it was left in, None if another deliverer holds it."""
        now = self.clock()
        dead = None
        if delivery.leased_by and delivery.lease_until is not None and delivery.lease_until > now:
            holder = delivery.leased_by.rpartition("#")[0]
            if holder != self.ledger.claimant and not self.ledger.claimant_alive(holder):
                dead = delivery.leased_by
        lease_until = now + self.config.lease_s
        if not self.ledger.claim_delivery(
            delivery.notification_id, delivery.endpoint, self.claimant, now, lease_until, dead
        ):
            return None
        notice = self.ledger.notification(delivery.notification_id)
        assert notice is not None  # delivery rows are made from outbox rows, which are never deleted
        if notice.kind in ("expiring", *LADDER) and (reason := closed_reason(self.ledger, notice, now)):
            return self._finish(delivery, "skipped", error=reason)
        error = self._post(webhook, notice)
        if error is None:
            return self._finish(delivery, "delivered", error=None)
        attempts = delivery.attempts + 1
        log.warning("notification %s to %s failed (attempt %d): %s", notice.id, webhook.shown, attempts, error)
        state: DeliveryState = "failed" if attempts >= self.config.max_attempts else "pending"
        delay = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** (attempts - 1))
        return self._finish(delivery, state, error=error, delay=delay)

    def _finish(
        self, delivery: Delivery, state: DeliveryState, *, error: str | None, delay: float = 0.0
    ) -> DeliveryState | None:
        now = self.clock()
        kept = self.ledger.finish_delivery(
            delivery.notification_id,
            delivery.endpoint,
            self.claimant,
            state,
            now=now,
            next_attempt_at=now + delay,
            error=error,
        )
        return state if kept else None

    def _post(self, webhook: Webhook, notice: Notification) -> str | None:
        """POST the signed body; None on a 2xx, else what went wrong (one line, no secret)."""
        if webhook.format == "slack_channel":
            return self._post_slack(webhook.url, notice)
        body = body_bytes(webhook, notice, self.config)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "gatedloop-notify",
            **signed_headers(self.config.secret, notice.id, body, time.time()),
        }
        try:
            response = self.client.post(webhook.url, content=body, headers=headers, timeout=self.config.timeout_s)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        if 200 <= response.status_code < 300:
            return None
        text = " ".join(response.text.split())
        return f"HTTP {response.status_code}" + (f": {text}"[:ERROR_CHARS] if text else "")

    def _post_slack(self, channel: str, notice: Notification) -> str | None:
        """`chat.postMessage` to the channel: an approval request with its buttons, other notices as the Slack
        webhook's body; None when Slack said ok, else its error."""
        from slack_sdk.errors import SlackApiError, SlackClientError

        link = request_link(self.config, notice)
        if shown_kind(notice) in ("request", *LADDER):
            body = approval_message(notice.payload, link, headline=HEADLINES[notice.kind])
        else:
            body = slack_body(notice, link)
        if self._slack is None:
            self._slack = web_client(self.config.slack_token)
            self._slack.timeout = int(self.config.timeout_s)
        try:
            self._slack.chat_postMessage(channel=channel, text=body["text"], blocks=body["blocks"])
        except SlackApiError as exc:
            return f"Slack: {exc.response.get('error')}"[:ERROR_CHARS]
        except (SlackClientError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        return None


@contextmanager
def delivering(ledger: SqlLedger, config: NotifyConfig | None) -> Iterator[None]:
    """A deliverer thread for the block (the inbox runs one); nothing when no webhook is configured."""
    if config is None:
        yield
        return
    stop = threading.Event()
    deliverer = Deliverer(ledger, config)
    thread = threading.Thread(target=deliverer.run, args=(stop,), name="gatedloop-notify", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=config.timeout_s + config.poll_s)
        deliverer.client.close()


def delivery_status(ledger: SqlLedger) -> list[dict[str, Any]]:
    """Deliveries not (yet) made, oldest first: what `gatedloop notify --status` lists."""
    return [
        {
            "notification_id": notice.id,
            "type": event_type(notice),
            "thread_id": notice.thread_id,
            "request_id": notice.request_id,
            "url": delivery.shown_url,
            "state": delivery.state,
            "attempts": delivery.attempts,
            "next_attempt_at": delivery.next_attempt_at if delivery.state == "pending" else None,
            "last_error": delivery.last_error,
        }
        for delivery, notice in ledger.deliveries(["pending", "failed"])
    ]


def status_line(row: Mapping[str, Any]) -> str:
    when = f"next try {_utc(row['next_attempt_at'])}" if row["next_attempt_at"] is not None else "given up"
    error = f": {row['last_error']}" if row["last_error"] else ""
    return (
        f"{row['state']:<8} {row['url']}  {row['type']} {row['request_id']} (thread {row['thread_id']}), "
        f"{row['attempts']} attempt(s), {when}{error}"
    )
