"""A scripted OpenAI-compatible Chat Completions server for tests.

Drives the real ``openai``/``langchain-openai`` client stack over real HTTP, so tests see exactly what
those libraries make of complete, truncated, refused and broken responses. The server is stdlib only (on
tests/support/http_stub.py); `chat_openai` is the client the tests point at it.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from http_stub import StubHandler, StubServer
from pydantic import SecretStr

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

FinishReason = Literal["stop", "tool_calls", "length", "content_filter"]
ReplySource = list["Reply"] | Callable[[dict[str, Any]], "Reply"]


def chat_openai(base_url: str, **kwargs: Any) -> ChatOpenAI:
    """The real ChatOpenAI client pointed at a stub: no retries, a short timeout, a dummy key. (Imported here: the
    openai SDK is a second of imports for every test process that only collects the files using it.)"""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="gpt-4o-mini", base_url=base_url, api_key=SecretStr("test"), max_retries=0, timeout=5, **kwargs
    )


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


class _Handler(StubHandler):
    server: Any

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
        body = self.read_body()
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
        self.send_body(status, "application/json", json.dumps(payload).encode())

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


class ScriptedOpenAIServer(StubServer):
    """Serves scripted replies on 127.0.0.1 at a free port, recording every request body.

    ``replies`` is a list consumed in order (an exhausted script answers HTTP 500 and records the error)
    or a callable ``(request_body) -> Reply``. Recorded errors fail the ``with`` block on exit unless
    ``strict=False``, so a test cannot pass while the server was answering 500s.
    """

    def __init__(self, replies: ReplySource, *, strict: bool = True) -> None:
        super().__init__(_Handler, label="ScriptedOpenAIServer", strict=strict)
        self._source = replies if callable(replies) else list(replies)
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def _take(self, request: dict[str, Any]) -> Reply:
        """Record ``request`` and pick its reply; serialized so scripts and callables see a stable order."""
        with self._lock:
            self.requests.append(request)
            if callable(self._source):
                return self._source(request)
            if not self._source:
                raise ScriptExhausted(f"no reply left for request #{len(self.requests)}")
            return self._source.pop(0)
