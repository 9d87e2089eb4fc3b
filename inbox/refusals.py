"""A refused answer reaches the client that sent it as an error: ASGI middleware on a server's own API.

The gate refuses an answer (a reviewer without the role, her own call, a stale request, a malformed decision) by
asking again, with the reason in the re-asked interrupt's `error`: the run ends interrupted, so the request stays
answerable and every inbox still lists it, where a failed run would leave the thread in `error`. A client that
looks only at how its run ended saw a success. This middleware, on the app the server is given as its
`http.app` (LangGraph Server and Aegra put that app's middleware in front of their own routes), adds the error to
the reply to the resume that was refused, and changes nothing else:

- `POST /threads/{id}/runs/wait`: an `__error__` beside the values (`{"error": "AnswerRefused", "message": ...}`),
  which `langgraph-sdk`'s `runs.wait` raises, as it does for a failed run;
- `POST /threads/{id}/runs/stream`: a last `error` event with the same data, which the SDK yields and
  `useStream` (Agent Chat UI) shows.

The thread stays as the gate left it: interrupted and asking again. A resume queued with `runs.create` and read
with `runs.join` is not reported (the join is another request); its thread's interrupt still carries the `error`.
Hand-written: neither server has a hook for a run that ends interrupted by a refusal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gatedloop.graph.pending import refusal_of

REFUSED = "AnswerRefused"
RUN_REPLY = re.compile(r"/threads/[^/]+/runs/(wait|stream)$")
INTERRUPTS = "__interrupt__"


class RefusalsReported:
    """Pure ASGI (not Starlette's BaseHTTPMiddleware, which buffers streams): a stream's events pass on as they
    come; only a wait's final body, which is read whole anyway, is held until it is complete."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = RUN_REPLY.search(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, replayed = await _read_request(receive)
        if not _is_resume(body):
            await self.app(scope, replayed, send)
            return
        reply = _WaitReply(send) if route.group(1) == "wait" else _StreamReply(send)
        await self.app(scope, replayed, reply.send)


async def _read_request(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, and a `receive` that hands it to the app once, then waits as the original does."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left before sending it all
            first: Message = message
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            break
    handed = False

    async def replayed() -> Message:
        nonlocal handed
        if handed:
            return await receive()
        handed = True
        return first

    return b"".join(chunks), replayed


def _is_resume(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except ValueError:
        return False  # the server answers it with its own error
    command = payload.get("command") if isinstance(payload, dict) else None
    return isinstance(command, dict) and command.get("resume") is not None


def refusal_in(interrupts: Any) -> str | None:
    """The refusal a run's interrupts carry: the first of gatedloop's requests that asks again after one."""
    for found in interrupts if isinstance(interrupts, list) else []:
        refusal = refusal_of(found.get("value")) if isinstance(found, Mapping) else None
        if refusal:
            return refusal
    return None


def error_data(refusal: str) -> dict[str, str]:
    """As both servers report a failed run's error: its type and message."""
    return {"error": REFUSED, "message": refusal}


class _WaitReply:
    """`runs/wait`: keep-alive whitespace passes on at once; the JSON after it is held, and sent with the error."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._watching = False
        self._held: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._watching = message["status"] == 200
            if self._watching:  # the body may grow: its length is the server's chunked encoding's business
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"]
                message = {**message, "headers": headers}
            await self._send(message)
            return
        if message["type"] != "http.response.body" or not self._watching:
            await self._send(message)
            return
        body = message.get("body", b"")
        if not self._held and not body.strip() and message.get("more_body"):
            await self._send(message)
            return
        self._held.append(body)
        if message.get("more_body"):
            return
        await self._send({"type": "http.response.body", "body": _with_error(b"".join(self._held)), "more_body": False})


def _with_error(body: bytes) -> bytes:
    try:
        values = json.loads(body)
    except ValueError:
        return body
    if not isinstance(values, dict) or "__error__" in values:
        return body
    refusal = refusal_in(values.get(INTERRUPTS))
    if refusal is None:
        return body
    return json.dumps({**values, "__error__": error_data(refusal)}, ensure_ascii=False).encode()


class _StreamReply:
    """`runs/stream`: every byte passes on as it comes; each complete event that carries interrupts is read, and
    if the last such says the answer was refused, an `error` event is sent before the stream ends."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._watching = False
        self._partial = b""
        self._refusal: str | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._watching = message["status"] == 200
        elif message["type"] == "http.response.body" and self._watching:
            self._read(message.get("body", b""))
            if not message.get("more_body") and self._refusal is not None:
                event = f"event: error\r\ndata: {json.dumps(error_data(self._refusal), ensure_ascii=False)}\r\n\r\n"
                await self._send({"type": "http.response.body", "body": event.encode(), "more_body": True})
        await self._send(message)

    def _read(self, chunk: bytes) -> None:
        *events, self._partial = (self._partial + chunk).replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            if INTERRUPTS.encode() not in event:
                continue
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            if isinstance(payload, dict) and INTERRUPTS in payload:
                self._refusal = refusal_in(payload[INTERRUPTS])
