"""Clicks on the approval message's buttons: `POST /slack/actions` of the inbox app (`/inbox/slack/actions` under a
server), Slack's interactivity request URL.

A click counts only when Slack's signature verifies (`SLACK_SIGNING_SECRET`, `slack_sdk`'s verifier: HMAC of
`v0:timestamp:body`, the timestamp within five minutes) and it was not seen before (Slack's `trigger_id`: a captured
request replayed inside the window is dropped). The Slack user is a reviewer only through `GATEDLOOP_SLACK_USERS`
(`{"U123": {"user_id": "ana", "roles": ["finance"]}}`, or under a server's auth `{"U123": {"token": "<ana's API
token>"}}`: the click then acts on the server's API as her); anyone else decides nothing and is told so, privately.
The click must name the request still pending and the exact arguments shown (else it is refused with the current
one). Then the answer takes the inbox's own path (`InboxBackend.send`: `runs.resume` with the reviewer's identity,
or a run through the server), so the gate judges roles, self-approval, quorum, expiry and replaced requests as for
any answer. Slack wants an answer within three seconds: the click is acknowledged at once and decided right after,
and the message is then updated with who answered when and what the gate did with each call, read from its record
(`gatedloop.inbox.slack_outcome`); a click that came after the deadline is also told so, privately. "Approve +
grant" approves the call and then grants its exact arguments ahead of time (`gatedloop.inbox.slack_grants`): every
grant rule is checked before the approval is sent, so a clicker who may not grant decides nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.graph import pending as decide
from gatedloop.graph.auth import AuthConfig
from gatedloop.graph.display import STOP_WORDS
from gatedloop.graph.pending import DecidedCall, PendingCall, PendingRequest
from gatedloop.inbox.identity import Reviewer
from gatedloop.inbox.slack import (
    ACTION_PREFIX,
    DECISIONS,
    GRANT,
    SUBMIT,
    TOKEN_ENV,
    Click,
    call_block,
    choice_action,
    decided_message,
    utc,
    web_client,
)
from gatedloop.inbox.slack_grants import GrantDefaults, grant_call, grant_refusal, registry_of
from gatedloop.inbox.slack_outcome import CallOutcome, call_outcomes, too_late_notice
from gatedloop.nodes.wire.hitl import InvalidDecision

log = logging.getLogger("gatedloop.slack")

SIGNING_SECRET_ENV = "SLACK_SIGNING_SECRET"
USERS_ENV = "GATEDLOOP_SLACK_USERS"
INBOX_URL_ENV = "GATEDLOOP_INBOX_URL"
WINDOW_S = 300
"""Slack's (and `SignatureVerifier`'s) timestamp window; a trigger id is remembered this long."""
UNMAPPED = "You are not a gatedloop reviewer (your Slack id is not in GATEDLOOP_SLACK_USERS): nothing was decided."
FAILED = "This click could not be handled (see the inbox's log); open the request in the inbox to see where it stands."


class SlackConfigError(ValueError):
    """Slack settings that cannot work; one line saying what to fix."""


def parse_users(text: str, auth: AuthConfig | None = None, *, served: bool = False) -> dict[str, Reviewer]:
    """`GATEDLOOP_SLACK_USERS`: Slack user id -> `{"user_id": ..., "roles": [...]}`, or -> `{"token": ...}`, a
    reviewer's API token of the auth configuration (`auth`), which then names the user and her roles and is what
    a click acts with on a server's API. Served under a server with auth (`served`), every entry needs a token:
    the server's auth decides who answers, and the click endpoint holds no other credential."""
    try:
        raw = json.loads(text or "{}")
    except ValueError as exc:
        raise SlackConfigError(f"{USERS_ENV} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SlackConfigError(f'{USERS_ENV} must be a JSON object: {{"U123": {{"user_id": ..., "roles": [...]}}}}')
    users: dict[str, Reviewer] = {}
    for slack_id, entry in raw.items():
        if isinstance(entry, dict) and "token" in entry:
            users[str(slack_id)] = _token_reviewer(str(slack_id), entry, auth)
            continue
        if served and auth is not None:
            raise SlackConfigError(
                f"{USERS_ENV}: {slack_id!r} needs a token: under the server's auth a click acts with the reviewer's "
                'API token ({"token": ...}), which names the user'
            )
        if not isinstance(entry, dict) or not isinstance(entry.get("user_id"), str) or not entry["user_id"]:
            raise SlackConfigError(f"{USERS_ENV}: {slack_id!r} needs a user_id")
        roles = entry.get("roles") or []
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise SlackConfigError(f"{USERS_ENV}: the roles of {slack_id!r} must be a list of strings")
        users[str(slack_id)] = Reviewer(entry["user_id"], frozenset(roles), "slack")
    return users


def _token_reviewer(slack_id: str, entry: dict[str, Any], auth: AuthConfig | None) -> Reviewer:
    token = entry["token"]
    if set(entry) != {"token"}:
        raise SlackConfigError(f"{USERS_ENV}: {slack_id!r} has a token: the token names the user (no user_id, roles)")
    if auth is None:
        raise SlackConfigError(f"{USERS_ENV}: {slack_id!r} has a token but no auth configuration names tokens")
    user = auth.user_for(token) if isinstance(token, str) else None
    if user is None:
        raise SlackConfigError(f"{USERS_ENV}: the token of {slack_id!r} is not one of the auth configuration's")
    return Reviewer(user.user_id, user.roles, "slack", auth.is_supervisor(user.user_id), f"Bearer {token}")


@dataclass
class SlackActions:
    """The click endpoint's settings and the trigger ids it has seen."""

    signing_secret: str
    users: Mapping[str, Reviewer]
    client: Any  # slack_sdk.WebClient
    inbox_url: str | None = None
    grants: GrantDefaults = field(default_factory=GrantDefaults)
    clock: Any = time.time
    _seen: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] = os.environ, auth: AuthConfig | None = None, *, served: bool = False
    ) -> SlackActions | None:
        """None when `SLACK_SIGNING_SECRET` is not set (no click endpoint); `auth` and `served` as `parse_users`."""
        secret = env.get(SIGNING_SECRET_ENV, "").strip()
        if not secret:
            return None
        token = env.get(TOKEN_ENV, "")
        if not token:
            raise SlackConfigError(f"{SIGNING_SECRET_ENV} is set but {TOKEN_ENV} is not: messages are updated with it")
        users = parse_users(env.get(USERS_ENV, ""), auth, served=served)
        try:
            grants = GrantDefaults.from_env(env)
        except ValueError as exc:
            raise SlackConfigError(str(exc)) from None
        return cls(secret, users, web_client(token, env), env.get(INBOX_URL_ENV), grants)

    def first_time(self, trigger: str) -> bool:
        """Whether this trigger id is new (and now seen); ids older than the window are forgotten."""
        now = self.clock()
        with self._lock:
            for old in [t for t, at in self._seen.items() if at < now - WINDOW_S]:
                del self._seen[old]
            if trigger in self._seen:
                return False
            self._seen[trigger] = now
            return True

    async def endpoint(self, request: Request) -> Response:
        # Slack's interactivity request. (A comment, not a docstring: LangGraph Server reads route docstrings as
        # OpenAPI YAML.)
        from slack_sdk.signature import SignatureVerifier

        body = await request.body()
        try:
            valid = SignatureVerifier(self.signing_secret).is_valid_request(body, dict(request.headers))
        except ValueError:  # a timestamp that is not a number
            valid = False
        if not valid:
            return Response("invalid signature", status_code=401)
        try:
            payload = json.loads(parse_qs(body.decode())["payload"][0])
        except (KeyError, ValueError, UnicodeDecodeError):
            return Response("no payload", status_code=400)
        if payload.get("type") != "block_actions" or not self.first_time(str(payload.get("trigger_id") or "")):
            return Response(status_code=200)
        origin = str(request.base_url).rstrip("/")
        task = BackgroundTask(self.decide, request.app.state.backend, payload, origin)
        return Response(status_code=200, background=task)

    def decide(self, backend: Any, payload: dict[str, Any], origin: str) -> None:
        """Decide the click's request as its reviewer, then tell Slack. Slack has had its answer, so a failure (the
        server's API refusing us, Slack unreachable) is logged and, if Slack can still be reached, told privately."""
        slack_user = str((payload.get("user") or {}).get("id") or "")
        channel = str((payload.get("container") or {}).get("channel_id") or (payload.get("channel") or {}).get("id"))
        try:
            self._decide(backend, payload, origin, slack_user, channel)
        except Exception:
            log.exception("slack click could not be handled")
            try:
                self._tell(channel, slack_user, FAILED)
            except Exception:
                log.exception("slack: could not tell %s", slack_user)

    def _decide(self, backend: Any, payload: dict[str, Any], origin: str, slack_user: str, channel: str) -> None:
        action = (payload.get("actions") or [{}])[0]
        decision = str(action.get("action_id") or "").removeprefix(ACTION_PREFIX)
        click = Click.parse(str(action.get("value") or ""))
        if decision not in (*DECISIONS, GRANT, SUBMIT) or click is None:
            return  # a call's choice being set (radio buttons report each change), or not gatedloop's button
        reviewer = self.users.get(slack_user)
        if reviewer is None:
            self._tell(channel, slack_user, UNMAPPED)
            return
        view = backend.requests(reviewer, origin).get(click.thread_id)
        mine = view.request.mine(reviewer.roles, self.clock()) if view is not None else ()
        if view is None or view.request_id != click.request_id or not set(_shown(mine)) <= set(click.calls):
            self._tell(channel, slack_user, self._stale(view, click))
            return
        positions = [call_id for call_id, _ in click.calls]
        choices = [decision] * len(mine) if decision != SUBMIT else _choices(payload, positions, mine)
        unchosen = [f"{c.name} ({c.tool_call_id})" for c, chosen in zip(mine, choices, strict=True) if chosen is None]
        if unchosen:
            self._tell(channel, slack_user, f"Choose Approve or Reject for {', '.join(unchosen)}: nothing was decided.")
            return
        granting = [call for call, chosen in zip(mine, choices, strict=True) if chosen == GRANT]
        registry = registry_of(*backend.requests(reviewer, origin).tools_and_policy(view.graph)) if granting else None
        requester = view.request.requested_by
        for call in granting:
            assert registry is not None
            refusal = grant_refusal(registry, reviewer, call, requester, self.grants)
            if refusal is not None:
                told = f"Not accepted: {refusal}. Nothing was decided (Approve decides the call without a grant)."
                self._tell(channel, slack_user, told)
                return
        answer = _answer(view, mine, [str(c) for c in choices], reviewer)
        try:
            result = backend.send(reviewer, origin, view, answer)
        except InvalidDecision as exc:
            self._tell(channel, slack_user, f"Not accepted: {exc}")
            return
        except ThreadBusy:
            self._tell(channel, slack_user, "Another answer is being applied to this thread; try again in a moment.")
            return
        still_this = bool(result.get("__interrupt__")) and self._still_pending(backend, reviewer, origin, click)
        _, policy = backend.requests(reviewer, origin).tools_and_policy(view.graph)
        outcomes = call_outcomes(backend.ledger, policy, view.thread_id, _in_message_order(view.request, positions))
        answered = {c.tool_call_id for c in mine}
        for late in [o for o in outcomes if o.too_late and o.call_id in answered]:
            self._tell(channel, slack_user, too_late_notice(late))
        late_ids = {o.call_id for o in outcomes if o.too_late}
        granted = [
            f"No grant for {c.name} ({c.tool_call_id}): the approval was not counted"
            if c.tool_call_id in late_ids or registry is None
            else grant_call(registry, backend.ledger, reviewer, c, requester, self.grants, view.thread_id)
            for c in granting
        ]
        line = " ".join([self._report(reviewer, outcomes, result, still_this), *(f"{g}." for g in granted)])
        message = payload.get("message") or {}
        ts = str((payload.get("container") or {}).get("message_ts") or message.get("ts") or "")
        blocks = decided_message(message.get("blocks") or [], line, keep_buttons=still_this)
        self.client.chat_update(channel=channel, ts=ts, text=line, blocks=blocks)

    def _report(self, reviewer: Reviewer, outcomes: list[CallOutcome], result: dict[str, Any], still_this: bool) -> str:
        """The line the message gets: who answered when, what the gate did with each call, then where the thread
        stands (still this request: its calls say what they wait for)."""
        line = f"{reviewer.user_id} answered at {utc(self.clock())}. " + "; ".join(o.line() for o in outcomes) + "."
        if still_this:
            return line
        if result.get("__interrupt__"):
            return line + " The thread now waits on a new request."
        status = str(result.get("status") or "unknown")
        return line + f" The thread ended: {STOP_WORDS.get(status, status)}."

    def _still_pending(self, backend: Any, reviewer: Reviewer, origin: str, click: Click) -> bool:
        view = backend.requests(reviewer, origin).get(click.thread_id)
        return view is not None and view.request_id == click.request_id

    def _stale(self, view: Any, click: Click) -> str:
        if view is None:
            return f"Thread {click.thread_id}: this request was already decided or cancelled; nothing was changed."
        calls = ", ".join(f"{a.name} ({a.tool_call_id})" for a in view.actions)
        link = ""
        if self.inbox_url:
            thread = quote(view.thread_id, safe="")
            link = f" <{self.inbox_url.rstrip('/')}/requests/{quote(view.request_id, safe='')}?thread={thread}>"
        return (
            f"Thread {click.thread_id}: this request changed since it was shown; nothing was changed. The current"
            f" request is {view.request_id}: {calls}.{link}"
        )

    def _tell(self, channel: str, slack_user: str, text: str) -> None:
        self.client.chat_postEphemeral(channel=channel, user=slack_user, text=text)


def _in_message_order(request: PendingRequest, positions: list[str]) -> list[PendingCall | DecidedCall]:
    """Every call of the request in the message's order, those still asked and those decided earlier (held for
    the others), so each click's update tells where every call stands."""
    every: list[PendingCall | DecidedCall] = [*request.calls, *request.decided]
    return sorted(every, key=lambda c: positions.index(c.tool_call_id) if c.tool_call_id in positions else 0)


def _shown(calls: Sequence[PendingCall]) -> list[tuple[str, str]]:
    """(call id, argument digest) of each call, as a button carries the calls it was shown with."""
    return [(c.tool_call_id, c.args_digest) for c in calls]


def _choices(payload: Mapping[str, Any], positions: list[str], calls: Sequence[PendingCall]) -> list[str | None]:
    """Each call's choice as the clicker left it (Slack sends the message's input state with the click), read from
    the call's section of the message (`positions`: the calls in the message's order)."""
    values = (payload.get("state") or {}).get("values") or {}
    chosen: list[str | None] = []
    for call in calls:
        index = positions.index(call.tool_call_id)
        element = (values.get(call_block(index)) or {}).get(choice_action(index)) or {}
        value = (element.get("selected_option") or {}).get("value")
        chosen.append(value if value in (*DECISIONS, GRANT) else None)
    return chosen


def _answer(view: Any, calls: Sequence[PendingCall], chosen: list[str], reviewer: Reviewer) -> dict[str, Any]:
    """The inbox's answer deciding each of the clicker's calls as chosen (Approve + grant approves), bound to each
    call's id and argument digest; the request's other calls are left to their own reviewers."""
    rejected = f"Rejected in Slack by {reviewer.user_id}."
    decisions = [
        decide.approve(call) if choice in ("approve", GRANT) else decide.reject(call, rejected)
        for call, choice in zip(calls, chosen, strict=True)
    ]
    return view.request.answer(decisions, reviewer.user_id, calls=calls)
