"""A scripted OpenAI-compatible Chat Completions server for tests.

Drives the real ``openai``/``langchain-openai`` client stack over real HTTP, so tests see exactly what
those libraries make of complete, truncated, refused and broken responses. Stdlib only.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

FinishReason = Literal["stop", "tool_calls", "length", "content_filter"]
ReplySource = list["Reply"] | Callable[[dict[str, Any]], "Reply"]


def tool_call(name: str, arguments: str | dict[str, Any], id: str = "call_1") -> dict[str, str]:
    """Build a ``Reply.tool_calls`` entry; a dict is JSON-encoded, a str is sent verbatim (may be broken)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id, "name": name, "arguments": raw}


@dataclass
class Usage:
    prompt_tokens: int = 10
    completion_tokens: int = 5

    def to_json(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


@dataclass
class Reply:
    """One scripted assistant response.

    ``finish_reason="auto"`` means "tool_calls" if there are tool calls, else "stop"; ``None`` sends a
    literal null. The streaming controls only apply when the request has ``"stream": true``:
    ``arg_chunk_size`` splits each tool call's arguments (and content/refusal) into pieces of that many
    characters. ``cut_after_chunks`` drops the connection after that many SSE chunks, counting the opening
    role chunk (no finish chunk, no ``[DONE]``): ``cut_mode="abort"`` leaves the chunked HTTP body
    unterminated (what a dropped TCP connection looks like); ``cut_mode="eof"`` ends an unframed body
    cleanly (indistinguishable from a normal end at the HTTP layer). ``omit_finish`` ends cleanly with
    ``[DONE]`` but never sends a finish_reason.
    """

    content: str | None = None
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    finish_reason: FinishReason | Literal["auto"] | None = "auto"
    refusal: str | None = None
    usage: Usage = field(default_factory=Usage)
    arg_chunk_size: int | None = None
    cut_after_chunks: int | None = None
    cut_mode: Literal["abort", "eof"] = "abort"
    omit_finish: bool = False

    def resolved_finish_reason(self) -> str | None:
        if self.finish_reason == "auto":
            return "tool_calls" if self.tool_calls else "stop"
        return self.finish_reason


def _pieces(text: str, size: int | None) -> list[str]:
    if not size or not text:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def _completion(reply: Reply, request: dict[str, Any], completion_id: str) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": reply.refusal}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": tc["id"], "type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"]}}
            for tc in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "stub"),
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.resolved_finish_reason()}
        ],
        "usage": reply.usage.to_json(),
    }


def _chunks(reply: Reply, request: dict[str, Any], completion_id: str) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects in the order the real API sends them."""
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.get("model", "stub"),
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        return {**body, "usage": None} if include_usage else body

    yield chunk({"role": "assistant", "content": "" if reply.content is not None else None, "refusal": None})
    for piece in _pieces(reply.content or "", reply.arg_chunk_size):
        if piece:
            yield chunk({"content": piece})
    for piece in _pieces(reply.refusal or "", reply.arg_chunk_size):
        if piece:
            yield chunk({"refusal": piece})
    for index, tc in enumerate(reply.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": tc["id"],
                        "type": "function",
                        "function": {"name": tc["name"], "arguments": ""},
                    }
                ]
            }
        )
        for piece in _pieces(tc["arguments"], reply.arg_chunk_size):
            if piece:
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, None if reply.omit_finish else reply.resolved_finish_reason())
    if include_usage:
        yield {**base, "choices": [], "usage": reply.usage.to_json()}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging on stderr."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": "gpt-4o-mini", "object": "model", "created": 0, "owned_by": "stub"}],
                },
            )
        else:
            self._send_error(404, f"no route for GET {self.path}")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_error(404, f"no route for POST {self.path}")
            return
        owner = self.server.owner
        try:
            request = json.loads(body or b"{}")
            reply = owner._take(request)
        except Exception as exc:
            message = f"ScriptedOpenAIServer: {type(exc).__name__}: {exc}"
            owner.errors.append(message)
            self._send_error(500, message)
            return
        completion_id = f"chatcmpl-stub-{next(owner._ids)}"
        if request.get("stream"):
            self._send_stream(reply, request, completion_id)
        else:
            self._send_json(200, _completion(reply, request, completion_id))

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _send_error(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": "stub_error", "code": None}})

    def _send_stream(self, reply: Reply, request: dict[str, Any], completion_id: str) -> None:
        chunked = reply.cut_mode == "abort"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

        def write(event: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if chunked else event)
            self.wfile.flush()

        for sent, chunk in enumerate(_chunks(reply, request, completion_id)):
            if reply.cut_after_chunks is not None and sent >= reply.cut_after_chunks:
                return  # drop the connection: no finish chunk, no [DONE], no chunked terminator
            write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        write(b"data: [DONE]\n\n")
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


class ScriptExhausted(RuntimeError):
    """More requests arrived than the script has replies."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedOpenAIServer


class ScriptedOpenAIServer:
    """Serves scripted replies on 127.0.0.1 at a free port, recording every request body.

    ``replies`` is a list consumed in order (an exhausted script answers HTTP 500 and records the error)
    or a callable ``(request_body) -> Reply``. Recorded errors fail the ``with`` block on exit unless
    ``strict=False``, so a test cannot pass while the server was answering 500s.
    """

    def __init__(self, replies: ReplySource, *, strict: bool = True) -> None:
        self._source = replies if callable(replies) else list(replies)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.strict = strict
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name="openai-stub", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def _take(self, request: dict[str, Any]) -> Reply:
        """Record ``request`` and pick its reply; serialized so scripts and callables see a stable order."""
        with self._lock:
            self.requests.append(request)
            if callable(self._source):
                return self._source(request)
            if not self._source:
                raise ScriptExhausted(f"no reply left for request #{len(self.requests)}")
            return self._source.pop(0)

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self.strict and self.errors and exc_type is None:
            raise AssertionError(f"ScriptedOpenAIServer recorded errors: {self.errors}")
