"""The inbox's Starlette app: the page (filtered, live-updated), answering, signing in, a request's own page
(`/inbox/requests/<request_id>`, also reachable as `/requests/<request_id>`), and a thread's timeline.

Every action is a plain form POST answered by a redirect (POST/redirect/GET), so the page works without
JavaScript; the script only refreshes the list, counts down expiries and opens the edit form."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote

from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.graph import pending as decide
from gatedloop.graph import runs
from gatedloop.graph.contexts import context_for
from gatedloop.graph.display import DECISION_WORDS, STOP_WORDS, day_and_clock, describe_thread
from gatedloop.graph.grants import PENDING
from gatedloop.graph.parts_of import parts_of
from gatedloop.inbox.filters import ORDERS, Filters, choices
from gatedloop.inbox.forms import FormError, parse_edit
from gatedloop.inbox.grants import EXPIRY_UNITS, OPS, GrantAsk, GrantForm, grant_forms, grant_from_form, grants_page
from gatedloop.inbox.identity import SESSION_COOKIE, Reviewer, Sessions
from gatedloop.inbox.pending import (
    PendingRequests,
    PendingView,
    age_text,
    pending_view,
    proposed_args,
    whole_refusal,
)
from gatedloop.inbox.review import answers_by_call, call_story, find_request, thread_story
from gatedloop.inbox.slack_actions import SlackActions
from gatedloop.inbox.stats import ReviewHistories, stats_context
from gatedloop.nodes.gate.extension import Extended
from gatedloop.nodes.gate.grants import GrantRefused
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.nodes.wire.masking import thread_redactor
from gatedloop.tools.policy import MASK, CallContext, ToolPolicy

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
POLL_MS = 2000
ANSWER_WAIT_S = 10.0
"""How long an answer waits for the thread's lease (another reviewer's answer in flight) before giving up."""
MOVED = (
    "another reviewer decided some of this request's calls since it was shown; nothing was sent: look again and"
    " decide yours"
)
SLACK_PATHS = ("/slack/actions", "/inbox/slack/actions")
GRANTS_ELSEWHERE = (
    "Standing grants of a served graph are managed with the CLI on the server's database: gatedloop --db URL"
    " --graph MODULE:ATTR grant create | list | confirm | revoke, and gatedloop limits."
)
"""What the Grants page says for a backend whose `grants_graph` is None."""
STATS_FOR_SUPERVISORS = (
    "The Stats page is for supervisors: reviewers holding a role of the auth configuration's stats_roles."
)
"""Slack's interactivity URL: the first standalone, the second under a server (which serves the inbox's paths)."""


class RequestSource(Protocol):
    """Where a reviewer's pending requests come from (`PendingRequests`: the database; `ServedRequests`: the API).
    `visible`: the requests she may decide a call of (`visible_to`); `refusals`: the calls of one she may not
    decide, and why (`call_refusals`)."""

    def visible(self, reviewer: CallContext, *, own_threads_only: bool = False) -> list[PendingView]: ...
    def get(self, thread_id: str) -> PendingView | None: ...
    def refusals(self, view: PendingView, reviewer: CallContext) -> dict[str, str]: ...
    def tools_and_policy(self, graph: str) -> tuple[dict[str, BaseTool], Callable[[str], ToolPolicy]]: ...


@dataclass
class InboxBackend:
    """What the inbox reads and answers: a graph with its checkpointer, its ledger, and the pending requests.

    Standalone (`gatedloop inbox --db`), answers run `runs.resume` on the database directly; inside LangGraph
    Server, `gatedloop.inbox.served.ServedBackend` reads and answers through the server's API instead."""

    graph: CompiledStateGraph
    ledger: Ledger
    pending: PendingRequests

    @classmethod
    def over(cls, graph: CompiledStateGraph, saver: Any) -> InboxBackend:
        """The backend of a graph from `build_graph` on a gatedloop saver (`open_sqlite`, `open_postgres`): its
        tools and policies, the saver's ledger and thread list."""
        parts = parts_of(graph)
        if parts is None:
            raise TypeError(f"{type(graph).__name__} is not a graph from gatedloop.graph.build_graph")
        tools, policies = list(parts.registry.tools.values()), parts.registry.policies
        return cls(graph, saver.ledger, PendingRequests(graph, saver.ledger, saver.thread_ids, tools, policies))

    def requests(self, reviewer: Reviewer, origin: str) -> RequestSource:
        """The requests as `reviewer` may see them; `origin` is the URL the page was loaded from."""
        return self.pending

    def send(self, reviewer: Reviewer, origin: str, view: PendingView, answer: dict[str, Any]) -> dict[str, Any]:
        """Apply an answer; the thread's values afterwards (with `__interrupt__` if it waits again)."""
        context = context_for(self.graph.context_schema, reviewer.context, {})  # the request's other fields reused
        return runs.resume(self.graph, view.thread_id, answer, context=context, wait_s=ANSWER_WAIT_S)

    def extend(self, reviewer: Reviewer, origin: str, view: PendingView) -> Extended:
        """Give the waiting request its time to live again, as this reviewer (`runs.extend`); the new deadline."""
        return runs.extend(self.graph, view.thread_id, context=reviewer.context, request_id=view.request_id)

    def grants_graph(self) -> CompiledStateGraph | None:
        """The graph whose policies judge standing grants on this database (`runs.grant`, `runs.grants`); None where
        the inbox cannot make them (`GRANTS_ELSEWHERE` says where they are made instead)."""
        return self.graph


@dataclass(frozen=True)
class Flash:
    kind: str  # "ok" or "error"
    text: str
    thread_id: str | None = None


@dataclass(frozen=True)
class Draft:
    """What a reviewer typed into a card whose answer was refused, shown again instead of a reset form, with why.
    A secret argument's field is never kept (its value is never rendered): it is typed again."""

    request_id: str
    values: dict[str, str]
    error: str


def _clock(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch)) if epoch else "—"


def _left(until: float | None, now: float) -> str:
    """Time left before an expiry, in words ("expired" once past)."""
    if until is None:
        return ""
    return "expired" if until <= now else "expires in " + age_text(now, until)


CHOICE_WORDS = {
    "approve": "Approve as shown",
    "edit": "Approve with my edits",
    "reject": "Reject",
    "respond": "Answer in the tool's place",
    "done": "It happened (done, with its result)",
    "not_done": "It did not happen: run it",
    "abandon": "Abandon it",
}
"""What each decision's radio button says: approving as shown and approving one's edits are different actions."""

TEMPLATES.env.globals.update(
    age=age_text,
    clock=_clock,
    left=_left,
    day_and_clock=day_and_clock,
    orders=ORDERS,
    choice_words=CHOICE_WORDS,
    decision_words=DECISION_WORDS,
    expiry_units=EXPIRY_UNITS,
    bound_ops=OPS,
)


def create_app(
    open_backend: Callable[[], AbstractContextManager[InboxBackend]],
    sessions: Sessions,
    *,
    title: str = "gatedloop inbox",
    slack: SlackActions | None = None,
) -> Starlette:
    """The inbox; `open_backend` is entered once for the app's lifetime (its lifespan). With `slack`, Slack's
    click endpoint is served too."""
    flashes: dict[str, list[Flash]] = {}
    drafts: dict[str, dict[str, Draft]] = {}  # session -> thread -> what she typed into a refused answer

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        with open_backend() as backend:
            app.state.backend = backend
            yield

    def backend_of(request: Request) -> InboxBackend:
        return request.app.state.backend

    def origin(request: Request) -> str:
        return str(request.base_url).rstrip("/")

    def session_of(request: Request) -> str | None:
        """The request's session id, if this process issued it; a planted or made-up id is never adopted. A
        browser may send several (a cookie planted for path "/" beside ours for "/inbox"): a signed-in one wins."""
        sent = [value for name, value in _cookies(request) if name == SESSION_COOKIE and sessions.issued(value)]
        return next((s for s in sent if sessions.signed_in(s)), sent[0] if sent else None)

    def set_session(request: Request, response: Response, session_id: str) -> Response:
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict", secure=secure, path="/inbox")
        return response

    def render(request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
        session_id = session_of(request) or sessions.new_id()
        reviewer = reviewer_of(request)
        shared = {
            "title": title,
            "csrf": sessions.csrf_token(session_id),
            "poll_ms": POLL_MS,
            "sees_stats": reviewer is not None and sessions.may_see_stats(reviewer),
        }
        response = TEMPLATES.TemplateResponse(request, template, {**shared, **context}, status_code=status)
        if (SESSION_COOKIE, session_id) not in _cookies(request):
            set_session(request, response, session_id)
        return response

    def reviewer_of(request: Request) -> Reviewer | None:
        return sessions.reviewer(request, session_of(request))

    def sign_in_page(request: Request, error: str | None = None, status: int = 200) -> Response:
        return render(request, "login.html", {"error": error, "can_sign_in": sessions.can_sign_in}, status)

    def notes_and_drafts(request: Request, views: list[PendingView]) -> tuple[list[Flash], dict[str, Draft]]:
        """This session's notes (shown once) and its drafts of requests still pending (others are dropped)."""
        session_id = session_of(request) or ""
        pending = {v.thread_id: v.request_id for v in views}
        kept = {t: d for t, d in drafts.get(session_id, {}).items() if pending.get(t) == d.request_id}
        if session_id in drafts:
            drafts[session_id] = kept
        return flashes.pop(session_id, []), kept

    async def listing(request: Request, reviewer: Reviewer) -> dict[str, Any]:
        everything = await run_in_threadpool(_visible, backend_of(request), reviewer, origin(request))
        filters = Filters.from_query(request.query_params)
        now = time.time()
        views = filters.apply(everything, now)
        return {
            "reviewer": reviewer,
            "views": views,
            "grant_forms": _grant_forms(backend_of(request), reviewer, origin(request), views),
            "total": len(everything),
            "filters": filters,
            "now": now,
            "choices": choices(everything),
            "back": filters.query(),
        }

    async def page(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        shown = await listing(request, reviewer)
        notes, kept = notes_and_drafts(request, shown["views"])
        return render(request, "inbox.html", {**shown, "flashes": notes, "drafts": kept})

    async def cards(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return HTMLResponse("signed out", status_code=401)
        shown = await listing(request, reviewer)
        kept = drafts.get(session_of(request) or "", {})
        response = render(request, "_cards.html", {**shown, "drafts": kept})
        response.headers["X-Inbox-Count"] = str(len(shown["views"]))  # the page's title, kept current
        return response

    async def signed_form(request: Request, doing: str) -> tuple[FormData, str, Reviewer] | Response:
        """A reviewer's form: its CSRF token checked and its sender signed in, or the page that says why not."""
        form = await request.form()
        session_id = session_of(request)
        if not sessions.csrf_ok(session_id, _field(form, "csrf")):
            return render(request, "message.html", {"message": "This form has expired; reload the inbox."}, 403)
        reviewer = reviewer_of(request)
        if reviewer is None or session_id is None:
            return sign_in_page(request, f"Sign in to {doing}.", 401)
        return form, session_id, reviewer

    async def answer(request: Request) -> Response:
        signed = await signed_form(request, "answer requests")
        if isinstance(signed, Response):
            return signed
        form, session_id, reviewer = signed
        thread_id = _field(form, "thread_id") or ""
        request_id = _field(form, "request_id") or ""
        note, draft = await run_in_threadpool(_answer, backend_of(request), reviewer, origin(request), thread_id, form)
        flashes.setdefault(session_id, []).append(note)
        session_drafts = drafts.setdefault(session_id, {})
        session_drafts.pop(thread_id, None)
        if draft is not None:
            session_drafts[thread_id] = draft
        if _field(form, "return_to") == "request":
            return RedirectResponse(_request_url(request_id, thread_id), status_code=303)
        back = Filters.from_query(dict(parse_qsl(_field(form, "back") or ""))).query()
        return RedirectResponse("/inbox" + (f"?{back}" if back else ""), status_code=303)

    async def extend(request: Request) -> Response:
        signed = await signed_form(request, "extend requests")
        if isinstance(signed, Response):
            return signed
        form, session_id, reviewer = signed
        thread_id, request_id = _field(form, "thread_id") or "", _field(form, "request_id") or ""
        note = await run_in_threadpool(_extend, backend_of(request), reviewer, origin(request), thread_id, request_id)
        flashes.setdefault(session_id, []).append(note)
        return RedirectResponse(_request_url(request_id, thread_id), status_code=303)

    async def login(request: Request) -> Response:
        form = await request.form()
        session_id = session_of(request)
        if not sessions.csrf_ok(session_id, _field(form, "csrf")) or session_id is None:
            return sign_in_page(request, "This form has expired; try again.", 403)
        fresh = sessions.sign_in(session_id, _field(form, "token") or "")
        if fresh is None:
            return sign_in_page(request, "Unknown reviewer token.", 401)
        return set_session(request, RedirectResponse("/inbox", status_code=303), fresh)

    async def logout(request: Request) -> Response:
        form = await request.form()
        session_id = session_of(request)
        response = RedirectResponse("/inbox", status_code=303)
        if session_id and sessions.csrf_ok(session_id, _field(form, "csrf")):
            set_session(request, response, sessions.sign_out(session_id))
        return response

    async def thread(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        thread_id = request.path_params["thread_id"]
        shown = await run_in_threadpool(_audit, backend_of(request), reviewer, origin(request), thread_id)
        if shown is None:
            message = f"No thread {thread_id!r} that you review."
            return render(request, "message.html", {"message": message}, 404)
        return render(request, "thread.html", {"reviewer": reviewer, **shown})

    async def request_page(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        request_id = request.path_params["request_id"]
        hint = request.query_params.get("thread") or None
        shown = await run_in_threadpool(_request_card, backend_of(request), reviewer, origin(request), request_id, hint)
        if shown is None:
            return render(request, "message.html", {"message": f"No request {request_id!r} that you review."}, 404)
        notes, kept = notes_and_drafts(request, [shown["view"]] if shown["pending"] else [])
        context = {"reviewer": reviewer, "flashes": notes, "drafts": kept, "now": time.time(), **shown}
        return render(request, "request.html", context)

    async def grants(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        graph = backend_of(request).grants_graph()
        shown = await run_in_threadpool(grants_page, graph, reviewer.context) if graph is not None else {}
        notes = flashes.pop(session_of(request) or "", [])
        context = {"reviewer": reviewer, "flashes": notes, "elsewhere": GRANTS_ELSEWHERE if graph is None else None}
        return render(request, "grants.html", {**context, **shown})

    async def grant_action(request: Request) -> Response:
        signed = await signed_form(request, "manage grants")
        if isinstance(signed, Response):
            return signed
        form, session_id, reviewer = signed
        doing, grant_id = request.path_params["doing"], _field(form, "grant_id") or ""
        note = await run_in_threadpool(_grant_action, backend_of(request), reviewer, doing, grant_id)
        flashes.setdefault(session_id, []).append(note)
        return RedirectResponse("/inbox/grants", status_code=303)

    async def stats(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        if not sessions.may_see_stats(reviewer):
            message = (
                "The Stats page is for supervisors: reviewers holding a role of the auth configuration's stats_roles."
            )
            return render(request, "message.html", {"message": message}, 403)
        ledger = backend_of(request).ledger
        if not isinstance(ledger, ReviewHistories):
            return render(request, "message.html", {"message": "This ledger keeps no review history."}, 404)
        since = request.query_params.get("since") or ""
        try:
            shown = await run_in_threadpool(stats_context, ledger, since, time.time())
        except ValueError as exc:
            return render(request, "message.html", {"message": str(exc)}, 400)
        return render(request, "stats.html", {"reviewer": reviewer, **shown})

    async def short_request_link(request: Request) -> Response:
        # The short link notifications carry, redirected to the inbox's page under the cookie's path. (A comment, not
        # a docstring: LangGraph Server parses route docstrings as OpenAPI YAML and warns on this one.)
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"/inbox/requests/{quote(request.path_params['request_id'])}{query}", 307)

    slack_routes = [Route(path, slack.endpoint, methods=["POST"]) for path in SLACK_PATHS] if slack else []
    return Starlette(
        routes=[
            *slack_routes,
            Route("/inbox", page, methods=["GET"]),
            Route("/inbox/cards", cards, methods=["GET"]),
            Route("/inbox/answer", answer, methods=["POST"]),
            Route("/inbox/extend", extend, methods=["POST"]),
            Route("/inbox/login", login, methods=["POST"]),
            Route("/inbox/logout", logout, methods=["POST"]),
            Route("/inbox/thread/{thread_id}", thread, methods=["GET"]),
            Route("/inbox/requests/{request_id}", request_page, methods=["GET"]),
            Route("/inbox/grants", grants, methods=["GET"]),
            Route("/inbox/grants/{doing:str}", grant_action, methods=["POST"]),
            Route("/inbox/stats", stats, methods=["GET"]),
            Route("/requests/{request_id}", short_request_link, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def _visible(backend: InboxBackend, reviewer: Reviewer, origin: str) -> list[PendingView]:
    return backend.requests(reviewer, origin).visible(reviewer.context, own_threads_only=not reviewer.sees_all_threads)


def _may_decide(source: RequestSource, reviewer: Reviewer, view: PendingView) -> str | None:
    """Why this reviewer may decide none of this request's calls (None: she may decide some), as the page
    decides what to show."""
    if not reviewer.sees_all_threads and view.requested_by != reviewer.user_id:
        return "only supervisors may decide other people's requests"
    return whole_refusal(view, source.refusals(view, reviewer.context))


def _seen_by(source: RequestSource, reviewer: Reviewer, view: PendingView) -> PendingView:
    """The request as this reviewer is shown it and answers it: the calls she may not decide marked (read-only)."""
    return replace(view, refused=source.refusals(view, reviewer.context))


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _answer(
    backend: InboxBackend, reviewer: Reviewer, origin: str, thread_id: str, form: FormData
) -> tuple[Flash, Draft | None]:
    """Apply the reviewer's answer (the CLI's checked path, or a run through the server): a note for the page, and
    when the answer was refused, what she typed (so the card shows it again with the reason)."""
    source = backend.requests(reviewer, origin)
    view = source.get(thread_id) if thread_id else None
    if view is None or view.request_id != _field(form, "request_id"):
        return Flash("error", f"Thread {thread_id}: this request was already answered or cancelled.", thread_id), None
    refusal = _may_decide(source, reviewer, view)
    if refusal is not None:
        return Flash("error", f"Thread {thread_id}: you may not decide this request: {refusal}.", thread_id), None
    if _moved_since_shown(view, form):
        return Flash("error", f"Thread {thread_id}: {MOVED}", thread_id), None
    seen = _seen_by(source, reviewer, view)
    try:
        granting = _grant_asked(backend, source, reviewer, seen, form)
        answer = answer_from_form(seen, granting[2] if granting else form, reviewer)
        if granting is not None:
            _approves_as_shown(answer, granting[1])
        result = backend.send(reviewer, origin, view, answer)
    except (FormError, GrantRefused) as exc:
        return _refused(view, form, f"Thread {thread_id}: not sent: {exc}")
    except InvalidDecision as exc:
        return _refused(view, form, f"Thread {thread_id}: not accepted: {exc}")
    except ThreadBusy:
        return _refused(view, form, f"Thread {thread_id}: another answer is being applied; look again in a moment.")
    granted = _grant(backend, reviewer, granting[0]) if granting is not None else ""
    if result.get("__interrupt__"):
        text = f"Thread {thread_id}: recorded; {_still_waiting(source, view)}.{granted}"
        return Flash("ok", text, thread_id), None
    status = result.get("status") or "unknown"
    words = STOP_WORDS.get(status, status)
    return Flash("ok", f"Thread {thread_id}: decided; the thread ended: {words}.{granted}", thread_id), None


def _grant_action(backend: InboxBackend, reviewer: Reviewer, doing: str, grant_id: str) -> Flash:
    """Revoke or confirm a grant as this reviewer, under graph/grants.py's rules; a note for the Grants page."""
    graph = backend.grants_graph()
    if graph is None:
        return Flash("error", GRANTS_ELSEWHERE)
    try:
        if doing == "revoke":
            runs.revoke(graph, grant_id, context=reviewer.context)
            return Flash("ok", f"{grant_id}: revoked; it covers no call from now on.")
        if doing == "confirm":
            view = runs.confirm_grant(graph, grant_id, context=reviewer.context)
            return Flash("ok", f"{grant_id}: {view.status} (granted by {', '.join(view.granted_by)}).")
    except GrantRefused as exc:
        return Flash("error", f"{grant_id}: not {doing}d: {exc}")
    return Flash("error", f"no such action on a grant: {doing!r} (revoke or confirm)")


def _grant_forms(
    backend: InboxBackend, reviewer: Reviewer, origin: str, views: list[PendingView]
) -> dict[tuple[str, str], GrantForm]:
    """The grant forms of the calls shown (none where the backend cannot make grants)."""
    if backend.grants_graph() is None:
        return {}
    source = backend.requests(reviewer, origin)
    return grant_forms(views, lambda view: source.tools_and_policy(view.graph)[1], reviewer.context)


def _grant_asked(
    backend: InboxBackend, source: RequestSource, reviewer: Reviewer, view: PendingView, form: FormData
) -> tuple[GrantAsk, str, FormData] | None:
    """With "Approve and grant similar calls": the grant asked for, its call, and the form with that call approved;
    the grant checked by its rules (`runs.check_grant`) before anything is sent. None for a plain answer."""
    index = _field(form, "grant")
    graph = backend.grants_graph()
    if index is None:
        return None
    action = next((a for a in view.actions if str(a.index) == index), None)
    offered = (
        grant_forms([view], lambda v: source.tools_and_policy(v.graph)[1], reviewer.context).get(
            (view.thread_id, action.tool_call_id)
        )
        if action is not None and graph is not None
        else None
    )
    if action is None or graph is None or offered is None:
        raise FormError("you may not grant similar calls of this call here")
    asked = grant_from_form(offered, form, action.index)
    runs.check_grant(graph, asked.tool, context=reviewer.context, **asked.arguments())
    approving = [(k, v) for k, v in form.multi_items() if k != f"decision-{action.index}"]
    return asked, action.tool_call_id, FormData([*approving, (f"decision-{action.index}", "approve")])


def _approves_as_shown(answer: dict[str, Any], call_id: str) -> None:
    decided = next(d for d in answer["decisions"] if d.get("tool_call_id") == call_id)
    if decided["type"] != "approve":
        raise FormError(
            "approve and grant approves the call as shown: undo your changes to its arguments, or approve your"
            " edits without a grant"
        )


def _grant(backend: InboxBackend, reviewer: Reviewer, asked: GrantAsk) -> str:
    """Make the grant asked for with an approval that was accepted; the words the reviewer's note ends with."""
    graph = backend.grants_graph()
    assert graph is not None  # checked before the answer was sent
    try:
        grant_id = runs.grant(graph, asked.tool, context=reviewer.context, note=asked.note, **asked.arguments())
    except GrantRefused as exc:
        return f" The grant was not made: {exc}"
    made = next(v for v in runs.grants(graph) if v.grant_id == grant_id)
    uses = f"{made.uses} use" + ("s" if made.uses != 1 else "")
    until = day_and_clock(made.expires_at)
    text = f" Granted {made.grant_id}: {made.tool} where {made.bounds}; {uses}; until {until}; {made.status}."
    return text + (" Another granter confirms it on the Grants page." if made.status.startswith(PENDING) else "")


def _moved_since_shown(view: PendingView, form: FormData) -> bool:
    """Whether the request's calls are no longer where the form showed them: another reviewer decided some of
    them meanwhile (the request keeps its id while its calls are decided one reviewer at a time), so a field's
    position may now name another call. A form without call ids (a script) is read by position, as before."""
    return any(_field(form, f"call-{a.index}") not in (None, a.tool_call_id) for a in view.actions)


def _still_waiting(source: RequestSource, answered: PendingView) -> str:
    """What the thread waits for after an answer: the same request's calls still undecided, or a new request."""
    now = source.get(answered.thread_id)
    if now is not None and now.request_id == answered.request_id and now.waiting_for:
        return f"the request still waits for {now.waiting_for}"
    return "the thread is waiting again"


def _extend(backend: InboxBackend, reviewer: Reviewer, origin: str, thread_id: str, request_id: str) -> Flash:
    """An approver's extension of the request shown (the gate's rules: she may decide it, it has not expired)."""
    source = backend.requests(reviewer, origin)
    view = source.get(thread_id) if thread_id else None
    if view is None or view.request_id != request_id:
        return Flash("error", f"Thread {thread_id}: this request was already answered or cancelled.", thread_id)
    try:
        extended = backend.extend(reviewer, origin, view)
    except InvalidDecision as exc:
        return Flash("error", f"Thread {thread_id}: not extended: {exc}", thread_id)
    until = day_and_clock(extended.until)
    if not extended.kept:
        return Flash("ok", f"Thread {thread_id}: extended; it may be decided until {until}.", thread_id)
    kept = "; ".join(f"{where} keeps its deadline: {why}" for where, why in extended.kept.items())
    return Flash("ok", f"Thread {thread_id}: extended {', '.join(extended.extended)} until {until}; {kept}.", thread_id)


def _refused(view: PendingView, form: FormData, text: str) -> tuple[Flash, Draft]:
    secret = {f"arg-{a.index}-{f.name}" for a in view.actions for f in a.fields if f.secret}
    kept = {
        name: value.replace("\r\n", "\n")
        for name, value in form.multi_items()
        if isinstance(value, str)
        and name.startswith(("decision-", "message-", "result-", "arg-", "justification-"))
        and name not in secret
    }
    return Flash("error", text, view.thread_id), Draft(view.request_id, kept, text)


def _request_url(request_id: str, thread_id: str) -> str:
    return f"/inbox/requests/{quote(request_id)}?thread={quote(thread_id)}"


def answer_from_form(view: PendingView, form: FormData, reviewer: Reviewer) -> dict[str, Any]:
    """One decision per call this reviewer may decide (the others are not hers: `view.refused`) from the submitted
    form, bound to the request, each call and the exact arguments shown."""
    assert view.request is not None  # every view is parsed by the operator layer
    theirs = [
        (a, c) for a, c in zip(view.actions, view.request.calls, strict=True) if a.tool_call_id not in view.refused
    ]
    decisions: list[dict[str, Any]] = []
    for action, call in theirs:
        choice = _field(form, f"decision-{action.index}") or ""
        message = (_field(form, f"message-{action.index}") or "").strip()
        if choice not in action.allowed:
            raise FormError(f"{action.name}: choose one of {', '.join(action.allowed)}")
        if view.kind == "unknown_outcome":
            if choice == "done":
                try:
                    decisions.append(decide.done(json.loads(_field(form, f"result-{action.index}") or "null")))
                except ValueError as exc:
                    raise FormError(f"{action.name}: the result is not JSON ({exc})") from None
            else:
                decisions.append(decide.not_done() if choice == "not_done" else decide.abandon())
            continue
        typed = {f.name: _field(form, f"arg-{action.index}-{f.name}") for f in action.fields}
        sent = any(value is not None for value in typed.values())
        if choice == "approve" and any(f.changed(typed[f.name], sent) for f in action.fields):
            choice = "edit"  # a reviewer who changed the arguments approves her changes, never the original ones
        if choice == "approve":
            decisions.append(decide.approve(call))
        elif choice == "reject":
            decisions.append(decide.reject(call, message))
        elif choice == "respond":
            if not message:
                raise FormError(f"{action.name}: write the answer the model should get")
            decisions.append(decide.respond(call, message))
        else:
            if "edit" not in action.allowed:
                raise FormError(f"{action.name}: its arguments cannot be edited here; undo your changes to approve")
            kept = {f.name for f in action.fields if f.secret and not typed[f.name]}  # the graph keeps their value
            shown = [f for f in action.fields if f.name not in kept]
            args = parse_edit(shown, {f.name: text for f in shown if (text := typed[f.name]) is not None})
            args.update(dict.fromkeys(kept, MASK))
            decisions.append(decide.edit(call, args))
    for (action, _), decision in zip(theirs, decisions, strict=True):
        justification = (_field(form, f"justification-{action.index}") or "").strip()
        if justification:
            decision["justification"] = justification
    return view.request.answer(decisions, reviewer.user_id, calls=[call for _, call in theirs])


def _may_see(
    backend: InboxBackend, source: RequestSource, reviewer: Reviewer, view: PendingView | None, thread_id: str
) -> tuple[bool, list[dict[str, Any]]]:
    """Whether the reviewer may read this thread's history (she may decide its request, or took part in it), and
    its audit trail."""
    audit = backend.ledger.audit(thread_id)
    may = (view is not None and _may_decide(source, reviewer, view) is None) or any(
        e.get("actor") == reviewer.user_id for e in audit
    )
    return may, audit


def _graph_of(backend: InboxBackend, thread_id: str) -> str:
    """The graph (assistant) id LangGraph Server recorded on the thread's latest checkpoint ("" standalone)."""
    saver = backend.graph.checkpointer
    if saver is None or isinstance(saver, bool):
        return ""
    tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    return str(((tup.metadata if tup else None) or {}).get("graph_id") or "")


def _audit(backend: InboxBackend, reviewer: Reviewer, origin: str, thread_id: str) -> dict[str, Any] | None:
    """A thread's conversation with each call's timeline, for a reviewer who may see it (None: she may not)."""
    source = backend.requests(reviewer, origin)
    view = source.get(thread_id)
    try:
        may, audit = _may_see(backend, source, reviewer, view, thread_id)
    except Exception:
        return None
    if not may:
        return None
    _, policy = source.tools_and_policy(view.graph if view is not None else _graph_of(backend, thread_id))
    messages = runs.output(backend.graph, thread_id).get("messages", [])
    redact = thread_redactor(messages, policy, backend.ledger.edited_args(thread_id, list(answers_by_call(messages))))
    summary = describe_thread(backend.graph, thread_id, backend.ledger)
    return {
        "thread_id": thread_id,
        "entries": thread_story(messages, audit, policy, redact),
        "first_at": audit[0]["at"] if audit else None,
        "status": summary.status,
        "detail": summary.detail,
        "view": view,
    }


def _request_card(
    backend: InboxBackend, reviewer: Reviewer, origin: str, request_id: str, thread_id: str | None
) -> dict[str, Any] | None:
    """One request's card: pending (with its form, if this reviewer may decide it) or decided (with each call's
    outcome and timeline). `thread_id` (from the link) saves searching every thread for it."""
    source = backend.requests(reviewer, origin)
    if thread_id is None:
        thread_id = next((v.thread_id for v in _visible(backend, reviewer, origin) if v.request_id == request_id), None)
    saver = backend.graph.checkpointer
    if saver is None or isinstance(saver, bool):
        return None
    searched = [thread_id] if thread_id is not None else list(reversed(backend.pending.thread_ids()))
    found = find_request(saver, searched, request_id)
    if found is None:
        return None
    current = source.get(found.thread_id)
    tools, policy = source.tools_and_policy(found.graph or (current.graph if current else ""))
    messages = runs.output(backend.graph, found.thread_id).get("messages", [])
    shown = pending_view(found.thread_id, found.interrupt_id, found.request, messages, tools, policy, graph=found.graph)
    may, audit = _may_see(backend, source, reviewer, shown, found.thread_id)
    if not may:
        return None
    pending = (
        current is not None and current.request_id == request_id and _may_decide(source, reviewer, current) is None
    )
    view = _seen_by(source, reviewer, current) if pending and current is not None else shown
    calls = _request_calls(view, messages, policy)
    redact = thread_redactor(messages, policy, backend.ledger.edited_args(found.thread_id, [c[0] for c in calls]))
    answers = answers_by_call(messages)
    stories = [call_story(i, name, args, audit, answers.get(i), redact) for i, name, args in calls]
    summary = describe_thread(backend.graph, found.thread_id, backend.ledger)
    waiting = [
        v for v in _visible(backend, reviewer, origin) if (v.thread_id, v.request_id) != (view.thread_id, request_id)
    ]
    return {
        "view": view,
        "grant_forms": _grant_forms(backend, reviewer, origin, [view]) if pending else {},
        "next": waiting[0] if waiting else None,
        "pending": pending,
        "stories": stories,
        "request_id": request_id,
        "status": summary.status,
        "detail": summary.detail,
    }


def _request_calls(
    view: PendingView, messages: list[Any], policy: Callable[[str], ToolPolicy]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(call id, tool, masked arguments) of every call of the request, in the model's order: those still asked and
    those an earlier answer decided (held, no longer among its actions, but the request's all the same)."""
    proposals = proposed_args(messages)
    calls = [(a.tool_call_id, a.name, a.args) for a in view.actions]
    calls += [(d.tool_call_id, d.name, policy(d.name).masked(proposals.get(d.tool_call_id, {}))) for d in view.decided]
    order = list(proposals)
    return sorted(calls, key=lambda c: order.index(c[0]) if c[0] in order else len(order))


def _cookies(request: Request) -> list[tuple[str, str]]:
    """Every (name, value) of the Cookie header, duplicates kept (`request.cookies` keeps one per name)."""
    pairs = (part.strip().partition("=") for part in request.headers.get("cookie", "").split(";"))
    return [(name, value) for name, _, value in pairs if name]
