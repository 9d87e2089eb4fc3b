"""Small servers on 127.0.0.1 that speak each provider's wire format, for the real LangChain clients.

One scripted `Turn` (text, tool calls, how it ends) is rendered the way each provider sends it: OpenAI chat
completions, OpenAI Responses, Anthropic Messages, Ollama `/api/chat`, Bedrock Converse; streamed (SSE,
NDJSON, AWS event stream) when the client asks for a stream, one JSON body otherwise. A turn ends:

- `None`: complete, with the provider's own finish status (`tool_calls`, `tool_use`, `completed`, ...);
- `"truncated"`: the provider says it hit its token limit, with every call's arguments complete-looking;
- `"dropped"`: the connection is lost in the middle of the first call's arguments.

The wire shapes follow the providers' API references and what the clients' parsers read. Stdlib only.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from http_stub import StubHandler, StubServer
from openai_stub import Reply, _chunks, _completion

Cut = Literal["truncated", "dropped"] | None
_serial = itertools.count(1)  # each response gets its own id, as the providers' do


@dataclass
class Call:
    id: str
    name: str
    args: dict[str, Any]

    @property
    def arguments(self) -> str:
        return json.dumps(self.args)


@dataclass
class Turn:
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    cut: Cut = None


@dataclass
class Frame:
    """One unit of a streamed body; `in_arguments` marks a piece of a call's argument text."""

    data: bytes
    in_arguments: bool = False


def halves(text: str) -> list[str]:
    middle = max(1, len(text) // 2)
    return [text[:middle], text[middle:]]


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(payload) + "\n\n").encode()


class Wire:
    """A provider's wire format: which requests stream, the JSON body, and the streamed frames."""

    name: str
    stream_content_type = "text/event-stream"

    def wants_stream(self, path: str, request: dict[str, Any]) -> bool:
        return bool(request.get("stream"))

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        raise NotImplementedError


class OpenAIChatWire(Wire):
    """Chat Completions, rendered by `openai_stub` (the tool-call arguments split in halves)."""

    name = "openai-chat"

    def _reply(self, turn: Turn) -> Reply:
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.calls]
        finish = "length" if turn.cut == "truncated" else "auto"
        return Reply(content=turn.text or None, tool_calls=calls, finish_reason=finish)  # type: ignore[arg-type]

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        return _completion(self._reply(turn), request, f"chatcmpl-{next(_serial)}")

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        reply = self._reply(turn)
        reply.arg_chunk_size = max(1, max((len(c.arguments) for c in turn.calls), default=2) // 2)
        for chunk in _chunks(reply, request, f"chatcmpl-{next(_serial)}"):
            delta = (chunk["choices"] or [{}])[0].get("delta", {})
            pieces = [t.get("function", {}).get("arguments") for t in delta.get("tool_calls", [])]
            yield Frame(b"data: " + json.dumps(chunk).encode() + b"\n\n", in_arguments=any(pieces))
        yield Frame(b"data: [DONE]\n\n")


class MistralWire(OpenAIChatWire):
    """Mistral's chat completions: OpenAI's shape, but a streamed call arrives whole, with its id, in one delta.

    (langchain-mistralai gives an id-less delta at index 0 a fresh random id, so OpenAI-style argument pieces
    would not reassemble; the API does not send them.)
    """

    name = "mistral"

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        base = {
            "id": f"cmpl-{next(_serial)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.get("model", "mistral-large-latest"),
        }

        def data(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        yield Frame(data({"role": "assistant", "content": ""}))
        for piece in halves(turn.text) if turn.text else []:
            yield Frame(data({"content": piece}))
        if turn.calls:
            calls = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}, "index": i}
                for i, c in enumerate(turn.calls)
            ]
            line = data({"tool_calls": calls})
            yield Frame(line[: len(line) // 2], in_arguments=True)  # "dropped" cuts inside the calls
            yield Frame(line[len(line) // 2 :])
        finish = self._reply(turn).resolved_finish_reason()
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        yield Frame(data({"content": ""}, finish, usage=usage))
        yield Frame(b"data: [DONE]\n\n")


class OpenAIResponsesWire(Wire):
    """The Responses API (`ChatOpenAI(use_responses_api=True)`): `status` and `incomplete_details`, no finish_reason."""

    name = "openai-responses"

    def _response(self, turn: Turn, request: dict[str, Any], status: str) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if turn.text:
            output.append(self._message_item(turn.text))
        output.extend(self._call_item(i, c, c.arguments) for i, c in enumerate(turn.calls))
        truncated = turn.cut == "truncated" and status != "in_progress"
        return {
            "id": f"resp_{next(_serial)}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if truncated else status,
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "error": None,
            "model": request.get("model", "gpt-4o-mini"),
            "output": output if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 15,
            },
        }

    @staticmethod
    def _message_item(text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": "msg_wire",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    @staticmethod
    def _call_item(index: int, call: Call, arguments: str, status: str = "completed") -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": f"fc_{index}",
            "call_id": call.id,
            "name": call.name,
            "arguments": arguments,
            "status": status,
        }

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        return self._response(turn, request, "completed")

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        seq = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

        yield Frame(event("response.created", response=self._response(turn, request, "in_progress")))
        index = 0
        if turn.text:
            item = self._message_item(turn.text)
            yield Frame(event("response.output_item.added", output_index=0, item={**item, "content": []}))
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": "msg_wire", "output_index": 0, "content_index": 0}
            yield Frame(event("response.content_part.added", **where, part=part))
            for piece in halves(turn.text):
                yield Frame(event("response.output_text.delta", **where, delta=piece))
            yield Frame(event("response.output_text.done", **where, text=turn.text))
            yield Frame(event("response.content_part.done", **where, part={**part, "text": turn.text}))
            yield Frame(event("response.output_item.done", output_index=0, item=item))
            index = 1
        for offset, call in enumerate(turn.calls):
            at = index + offset
            added = self._call_item(offset, call, "", "in_progress")
            yield Frame(event("response.output_item.added", output_index=at, item=added))
            for piece in halves(call.arguments):
                delta = {"item_id": added["id"], "output_index": at, "delta": piece}
                yield Frame(event("response.function_call_arguments.delta", **delta), in_arguments=True)
            done = {"item_id": added["id"], "output_index": at, "arguments": call.arguments}
            yield Frame(event("response.function_call_arguments.done", **done))
            yield Frame(
                event("response.output_item.done", output_index=at, item=self._call_item(offset, call, call.arguments))
            )
        final = self._response(turn, request, "completed")
        yield Frame(event(f"response.{final['status']}", response=final))


class AnthropicWire(Wire):
    """The Messages API: `stop_reason` (`end_turn`, `tool_use`, `max_tokens`) on the message or its delta."""

    name = "anthropic"

    def _stop_reason(self, turn: Turn) -> str:
        if turn.cut == "truncated":
            return "max_tokens"
        return "tool_use" if turn.calls else "end_turn"

    def _message(self, request: dict[str, Any], content: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
        return {
            "id": f"msg_{next(_serial)}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model", "claude-wire"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in turn.calls]
        return self._message(request, content, self._stop_reason(turn))

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        yield Frame(sse({"type": "message_start", "message": self._message(request, [], None)}, "message_start"))
        index = 0
        if turn.text:
            start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            yield Frame(sse(start, "content_block_start"))
            for piece in halves(turn.text):
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                yield Frame(sse(delta, "content_block_delta"))
            yield Frame(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
            index = 1
        for offset, call in enumerate(turn.calls):
            at = index + offset
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            yield Frame(
                sse({"type": "content_block_start", "index": at, "content_block": block}, "content_block_start")
            )
            for piece in halves(call.arguments):
                delta = {"type": "input_json_delta", "partial_json": piece}
                payload = {"type": "content_block_delta", "index": at, "delta": delta}
                yield Frame(sse(payload, "content_block_delta"), in_arguments=True)
            yield Frame(sse({"type": "content_block_stop", "index": at}, "content_block_stop"))
        stop = {"stop_reason": self._stop_reason(turn), "stop_sequence": None}
        delta_event = {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 5}}
        yield Frame(sse(delta_event, "message_delta"))
        yield Frame(sse({"type": "message_stop"}, "message_stop"))


class OllamaWire(Wire):
    """`/api/chat`: NDJSON lines, `done` and `done_reason` on the last; calls arrive whole, arguments as objects."""

    name = "ollama"
    stream_content_type = "application/x-ndjson"

    def wants_stream(self, path: str, request: dict[str, Any]) -> bool:
        return request.get("stream", True) is not False

    def _line(self, request: dict[str, Any], message: dict[str, Any], **done: Any) -> dict[str, Any]:
        return {
            "model": request.get("model", "llama-wire"),
            "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "", **message},
            "done": bool(done),
            **done,
        }

    def _done(self, turn: Turn) -> dict[str, Any]:
        reason = "length" if turn.cut == "truncated" else "stop"
        return {"done_reason": reason, "total_duration": 1000, "prompt_eval_count": 10, "eval_count": 5}

    @staticmethod
    def _calls(turn: Turn) -> list[dict[str, Any]]:
        return [{"function": {"name": c.name, "arguments": c.args}} for c in turn.calls]

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        message = {"content": turn.text, **({"tool_calls": self._calls(turn)} if turn.calls else {})}
        return self._line(request, message, **self._done(turn))

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        for piece in halves(turn.text) if turn.text else []:
            yield Frame(json.dumps(self._line(request, {"content": piece})).encode() + b"\n")
        if turn.calls:
            line = json.dumps(self._line(request, {"tool_calls": self._calls(turn)})).encode() + b"\n"
            # Ollama sends a call whole; "dropped" cuts that line in the middle of its arguments.
            yield Frame(line[: len(line) // 2], in_arguments=True)
            yield Frame(line[len(line) // 2 :])
        yield Frame(json.dumps(self._line(request, {}, **self._done(turn))).encode() + b"\n")


class BedrockConverseWire(Wire):
    """Converse (`/model/{id}/converse`) and ConverseStream (AWS event stream frames): `stopReason`."""

    name = "bedrock-converse"
    stream_content_type = "application/vnd.amazon.eventstream"

    def wants_stream(self, path: str, request: dict[str, Any]) -> bool:
        return path.endswith("/converse-stream")

    def _stop_reason(self, turn: Turn) -> str:
        if turn.cut == "truncated":
            return "max_tokens"
        return "tool_use" if turn.calls else "end_turn"

    def body(self, turn: Turn, request: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"text": turn.text}] if turn.text else []
        content += [{"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.args}} for c in turn.calls]
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": self._stop_reason(turn),
            "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
            "metrics": {"latencyMs": 12},
        }

    def frames(self, turn: Turn, request: dict[str, Any]) -> Iterator[Frame]:
        yield Frame(event_stream_message("messageStart", {"role": "assistant"}))
        index = 0
        if turn.text:
            for piece in halves(turn.text):
                delta = {"contentBlockIndex": 0, "delta": {"text": piece}}
                yield Frame(event_stream_message("contentBlockDelta", delta))
            yield Frame(event_stream_message("contentBlockStop", {"contentBlockIndex": 0}))
            index = 1
        for offset, call in enumerate(turn.calls):
            at = index + offset
            start = {"contentBlockIndex": at, "start": {"toolUse": {"toolUseId": call.id, "name": call.name}}}
            yield Frame(event_stream_message("contentBlockStart", start))
            for piece in halves(call.arguments):
                delta = {"contentBlockIndex": at, "delta": {"toolUse": {"input": piece}}}
                yield Frame(event_stream_message("contentBlockDelta", delta), in_arguments=True)
            yield Frame(event_stream_message("contentBlockStop", {"contentBlockIndex": at}))
        yield Frame(event_stream_message("messageStop", {"stopReason": self._stop_reason(turn)}))
        usage = {"usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}, "metrics": {"latencyMs": 12}}
        yield Frame(event_stream_message("metadata", usage))


def event_stream_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """One `application/vnd.amazon.eventstream` message: prelude, CRCs, string headers, JSON payload."""
    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")):
        raw = value.encode()
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw)) + raw
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + headers + body
    return message + struct.pack(">I", zlib.crc32(message) & 0xFFFFFFFF)


WIRES: dict[str, Wire] = {
    w.name: w
    for w in (
        OpenAIChatWire(),
        MistralWire(),
        OpenAIResponsesWire(),
        AnthropicWire(),
        OllamaWire(),
        BedrockConverseWire(),
    )
}


class _Handler(StubHandler):
    server: Any

    def do_POST(self) -> None:
        body = self.read_body()
        owner = self.server.owner
        try:
            request = json.loads(body or b"{}")
            stream = owner.wire.wants_stream(self.path, request)
            turn = owner.take(self.path, request, stream)
        except Exception as exc:
            owner.errors.append(f"{type(exc).__name__}: {exc}")
            self.send_body(500, "application/json", json.dumps({"error": {"message": str(exc)}}).encode())
            return
        if stream:
            self._stream(owner.wire.frames(turn, request), dropped=turn.cut == "dropped")
        else:
            data = json.dumps(owner.wire.body(turn, request)).encode()
            if turn.cut == "dropped":  # promise the whole body, send half, hang up
                self.send_body(200, "application/json", data[: len(data) // 2], length=len(data))
            else:
                self.send_body(200, "application/json", data)

    def _stream(self, frames: Iterator[Frame], *, dropped: bool) -> None:
        """Chunked transfer; a dropped stream stops after the first argument piece with no terminating chunk."""
        self.send_response(200)
        self.send_header("Content-Type", self.server.owner.wire.stream_content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for frame in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame.data), frame.data))
            self.wfile.flush()
            if dropped and frame.in_arguments:
                return
        self.wfile.write(b"0\r\n\r\n")


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    stream: bool


class ProviderServer(StubServer):
    """Serves `turns` in order in `wire`'s format; records each request; fails the `with` block on a server error."""

    def __init__(self, wire: Wire, turns: list[Turn]) -> None:
        super().__init__(_Handler, label=f"{wire.name} server")
        self.wire, self._turns = wire, list(turns)
        self.requests: list[Received] = []

    def take(self, path: str, request: dict[str, Any], stream: bool) -> Turn:
        with self._lock:
            self.requests.append(Received(path, request, stream))
            if not self._turns:
                raise RuntimeError(f"no turn left for request #{len(self.requests)} to {path}")
            return self._turns.pop(0)
