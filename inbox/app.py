"""The inbox's Starlette app: the page, its live-updated list, answering, signing in, and a thread's audit trail."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
from gatedloop.checkpoints.threads import describe_thread
from gatedloop.graph import runs
from gatedloop.graph.display import STOP_WORDS, Display
from gatedloop.inbox.forms import FormError, parse_edit
from gatedloop.inbox.identity import SESSION_COOKIE, Reviewer, Sessions
from gatedloop.inbox.pending import PendingRequests, PendingView, age_text
from gatedloop.nodes.gate.hitl import InvalidDecision
from gatedloop.tools.policy import MASK, CallContext

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
POLL_MS = 2000
ANSWER_WAIT_S = 10.0
"""How long an answer waits for the thread's lease (another reviewer's answer in flight) before giving up."""


class RequestSource(Protocol):
    """Where a reviewer's pending requests come from (`PendingRequests`: the database; `ServedRequests`: the API)."""

    def visible(self, reviewer: CallContext, *, own_threads_only: bool = False) -> list[PendingView]: ...
    def get(self, thread_id: str) -> PendingView | None: ...
    def refusal(self, view: PendingView, reviewer: CallContext) -> str | None: ...


@dataclass
class InboxBackend:
    """What the inbox reads and answers: a graph with its checkpointer, its ledger, and the pending requests.

    Standalone (`gatedloop inbox --db`), answers run `runs.resume` on the database directly; inside LangGraph
    Server, `gatedloop.inbox.served.ServedBackend` reads and answers through the server's API instead."""

    graph: CompiledStateGraph
    ledger: Ledger
    pending: PendingRequests

    def requests(self, reviewer: Reviewer, origin: str) -> RequestSource:
        """The requests as `reviewer` may see them; `origin` is the URL the page was loaded from."""
        return self.pending

    def send(self, reviewer: Reviewer, origin: str, view: PendingView, answer: dict[str, Any]) -> dict[str, Any]:
        """Apply an answer; the thread's values afterwards (with `__interrupt__` if it waits again)."""
        return runs.resume(self.graph, view.thread_id, answer, context=reviewer.context, wait_s=ANSWER_WAIT_S)


@dataclass(frozen=True)
class Flash:
    kind: str  # "ok" or "error"
    text: str
    thread_id: str | None = None


def _clock(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch)) if epoch else "—"


TEMPLATES.env.globals.update(age=age_text, clock=_clock)


def create_app(
    open_backend: Callable[[], AbstractContextManager[InboxBackend]],
    sessions: Sessions,
    *,
    title: str = "gatedloop inbox",
) -> Starlette:
    """The inbox; `open_backend` is entered once for the app's lifetime (its lifespan)."""
    flashes: dict[str, list[Flash]] = {}

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
        response = TEMPLATES.TemplateResponse(
            request,
            template,
            {"title": title, "csrf": sessions.csrf_token(session_id), "poll_ms": POLL_MS, **context},
            status_code=status,
        )
        if (SESSION_COOKIE, session_id) not in _cookies(request):
            set_session(request, response, session_id)
        return response

    def reviewer_of(request: Request) -> Reviewer | None:
        return sessions.reviewer(request, session_of(request))

    def sign_in_page(request: Request, error: str | None = None, status: int = 200) -> Response:
        return render(request, "login.html", {"error": error, "can_sign_in": sessions.can_sign_in}, status)

    async def page(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return sign_in_page(request)
        views = await run_in_threadpool(_visible, backend_of(request), reviewer, origin(request))
        session_id = session_of(request) or ""
        notes = flashes.pop(session_id, [])
        return render(
            request, "inbox.html", {"reviewer": reviewer, "views": views, "flashes": notes, "now": time.time()}
        )

    async def cards(request: Request) -> Response:
        reviewer = reviewer_of(request)
        if reviewer is None:
            return HTMLResponse("signed out", status_code=401)
        views = await run_in_threadpool(_visible, backend_of(request), reviewer, origin(request))
        return render(request, "_cards.html", {"reviewer": reviewer, "views": views, "now": time.time()})

    async def answer(request: Request) -> Response:
        form = await request.form()
        session_id = session_of(request)
        if not sessions.csrf_ok(session_id, _field(form, "csrf")):
            return render(request, "message.html", {"message": "This form has expired; reload the inbox."}, 403)
        reviewer = reviewer_of(request)
        if reviewer is None or session_id is None:
            return sign_in_page(request, "Sign in to answer requests.", 401)
        thread_id = _field(form, "thread_id") or ""
        note = await run_in_threadpool(_answer, backend_of(request), reviewer, origin(request), thread_id, form)
        flashes.setdefault(session_id, []).append(note)
        return RedirectResponse("/inbox", status_code=303)

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

    return Starlette(
        routes=[
            Route("/inbox", page, methods=["GET"]),
            Route("/inbox/cards", cards, methods=["GET"]),
            Route("/inbox/answer", answer, methods=["POST"]),
            Route("/inbox/login", login, methods=["POST"]),
            Route("/inbox/logout", logout, methods=["POST"]),
            Route("/inbox/thread/{thread_id}", thread, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def _visible(backend: InboxBackend, reviewer: Reviewer, origin: str) -> list[PendingView]:
    return backend.requests(reviewer, origin).visible(reviewer.context, own_threads_only=not reviewer.sees_all_threads)


def _may_decide(source: RequestSource, reviewer: Reviewer, view: PendingView) -> str | None:
    """Why this reviewer may not decide this request (None: she may), as the page decides what to show."""
    if not reviewer.sees_all_threads and view.requested_by != reviewer.user_id:
        return "only approvers may decide other people's requests"
    return source.refusal(view, reviewer.context)


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _answer(backend: InboxBackend, reviewer: Reviewer, origin: str, thread_id: str, form: FormData) -> Flash:
    """Apply the reviewer's answer (the CLI's checked path, or a run through the server); a note for the page."""
    source = backend.requests(reviewer, origin)
    view = source.get(thread_id) if thread_id else None
    if view is None or view.request_id != _field(form, "request_id"):
        return Flash("error", f"Thread {thread_id}: this request was already answered or cancelled.", thread_id)
    refusal = _may_decide(source, reviewer, view)
    if refusal is not None:
        return Flash("error", f"Thread {thread_id}: you may not decide this request: {refusal}.", thread_id)
    try:
        answer = answer_from_form(view, form, reviewer)
        result = backend.send(reviewer, origin, view, answer)
    except FormError as exc:
        return Flash("error", f"Thread {thread_id}: not sent: {exc}", thread_id)
    except InvalidDecision as exc:
        return Flash("error", f"Thread {thread_id}: not accepted: {exc}", thread_id)
    except ThreadBusy:
        return Flash(
            "error", f"Thread {thread_id}: another answer is being applied; look again in a moment.", thread_id
        )
    if result.get("__interrupt__"):
        return Flash("ok", f"Thread {thread_id}: recorded; the thread is waiting again.", thread_id)
    status = result.get("status") or "unknown"
    return Flash("ok", f"Thread {thread_id}: decided; the thread ended: {STOP_WORDS.get(status, status)}.", thread_id)


def answer_from_form(view: PendingView, form: FormData, reviewer: Reviewer) -> dict[str, Any]:
    """One decision per call from the submitted form, bound to the request and the exact arguments shown."""
    decisions: list[dict[str, Any]] = []
    for action in view.actions:
        choice = _field(form, f"decision-{action.index}") or ""
        message = (_field(form, f"message-{action.index}") or "").strip()
        if choice not in action.allowed:
            raise FormError(f"{action.name}: choose one of {', '.join(action.allowed)}")
        if view.kind == "unknown_outcome":
            decision: dict[str, Any] = {"type": choice}
            if choice == "done":
                import json

                try:
                    decision["result"] = json.loads(_field(form, f"result-{action.index}") or "null")
                except ValueError as exc:
                    raise FormError(f"{action.name}: the result is not JSON ({exc})") from None
            decisions.append(decision)
            continue
        bound = {"args_digest": action.args_digest, "tool_call_id": action.tool_call_id}
        typed = {f.name: _field(form, f"arg-{action.index}-{f.name}") for f in action.fields}
        sent = any(value is not None for value in typed.values())
        if choice == "approve" and any(f.changed(typed[f.name], sent) for f in action.fields):
            choice = "edit"  # a reviewer who changed the arguments approves her changes, never the original ones
        if choice == "approve":
            decisions.append({"type": "approve", **bound})
        elif choice == "reject":
            decisions.append({"type": "reject", "message": message or "Rejected by the reviewer.", **bound})
        elif choice == "respond":
            if not message:
                raise FormError(f"{action.name}: write the answer the model should get")
            decisions.append({"type": "respond", "message": message, **bound})
        else:
            if "edit" not in action.allowed:
                raise FormError(f"{action.name}: its arguments cannot be edited here; undo your changes to approve")
            kept = {f.name for f in action.fields if f.secret and not typed[f.name]}  # the graph keeps their value
            shown = [f for f in action.fields if f.name not in kept]
            args = parse_edit(shown, {f.name: text for f in shown if (text := typed[f.name]) is not None})
            args.update(dict.fromkeys(kept, MASK))
            decisions.append({"type": "edit", "edited_action": {"name": action.name, "args": args}, **bound})
    answer: dict[str, Any] = {"decisions": decisions, "reviewer": reviewer.user_id}
    if view.request_id != view.interrupt_id:
        answer["request_id"] = view.request_id
    return answer


def _audit(backend: InboxBackend, reviewer: Reviewer, origin: str, thread_id: str) -> dict[str, Any] | None:
    """A thread's history for a reviewer who has a request in it to decide, or decided something in it."""
    try:
        audit = backend.ledger.audit(thread_id)
    except Exception:
        return None
    source = backend.requests(reviewer, origin)
    view = source.get(thread_id)
    may_see = (view is not None and _may_decide(source, reviewer, view) is None) or any(
        e.get("actor") == reviewer.user_id for e in audit
    )
    if not may_see:
        return None
    values = runs.output(backend.graph, thread_id)
    summary = describe_thread(backend.graph, thread_id, backend.ledger)
    return {
        "thread_id": thread_id,
        "lines": Display.for_graph(backend.graph).history_lines(values.get("messages", []), audit),
        "status": summary.status,
        "detail": summary.detail,
        "view": view,
    }


def _cookies(request: Request) -> list[tuple[str, str]]:
    """Every (name, value) of the Cookie header, duplicates kept (`request.cookies` keeps one per name)."""
    pairs = (part.strip().partition("=") for part in request.headers.get("cookie", "").split(";"))
    return [(name, value) for name, _, value in pairs if name]
