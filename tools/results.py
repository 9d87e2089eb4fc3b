"""Shaping tool results for the model: strict JSON text, capped in size with an explicit marker.

Rendering never raises: whatever a tool returns (sets, bytes, NaN, objects, tuple keys, deep nesting) becomes
JSON, so a write that succeeded is never reported as failed because its result was awkward to print.

What the model sees from a call, one rule (README "What the model sees from a tool"): the tool's own result as
the tool returned it, as LangGraph's `ToolNode` passes it, when the call ran as the model proposed it; an envelope
`{"ok": ...}` whenever gatedloop has something to add: `{"ok": false, "error": {...}}` for every failure and
refusal (`tools.errors`), and `{"ok": true, "result": ..., ...}` when a person changed what happened: an edit
(`edited_result`: what it ran with) or an answer in the tool's place (`responded_result`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gatedloop.tools.arguments import MAX_DEPTH

DEFAULT_MAX_RESULT_CHARS = 4000
TRUNCATION_MARKER = "…[truncated: {shown} of {total} characters shown]"
MAX_INT_BITS = 10_000  # Python refuses to print integers past about 4,300 digits
TOO_DEEP = f"…[nested deeper than {MAX_DEPTH} levels]"
EDITED_NOTE = "a reviewer edited this call before it ran"


def to_json_text(result: Any) -> str:
    """Results reach the model as JSON (`ensure_ascii=False`); strings pass through as they are."""
    if isinstance(result, str):
        return result
    return json.dumps(jsonable(result), ensure_ascii=False, allow_nan=False)


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: str keys, finite numbers (NaN and infinities as strings), known types rendered."""
    if depth > MAX_DEPTH:
        return TOO_DEEP
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= MAX_INT_BITS else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {_key(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v, depth + 1) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, bytes | bytearray):
        return {"bytes": len(value)}
    if hasattr(value, "model_dump"):
        try:
            return jsonable(value.model_dump(mode="json"), depth + 1)
        except Exception:
            return _text(value)
    return _text(value)


def _text(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _key(key: Any) -> str:
    return key if isinstance(key, str) else _text(jsonable(key) if isinstance(key, int) else key)


def cap(text: str, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> str:
    """Cut an oversized result and say so, with the original size."""
    if len(text) <= max_chars:
        return text
    marker = TRUNCATION_MARKER.format(shown=max_chars, total=len(text))
    return text[:max_chars] + marker


def edited_result(content: str, ran_with: dict[str, Any]) -> str:
    """The answer to a call a reviewer edited: the tool's result (`content`, JSON text) and the arguments it ran
    with (secret arguments already masked), so the model does not assume its own arguments ran."""
    result = _loads(content)
    return json.dumps({"ok": True, "note": EDITED_NOTE, "ran_with": ran_with, "result": result}, ensure_ascii=False)


def responded_result(message: Any) -> str:
    """The answer a reviewer gave in the tool's place (`respond`): the tool did not run."""
    return json.dumps({"ok": True, "answered_by": "reviewer", "result": message}, ensure_ascii=False)


def _loads(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content
