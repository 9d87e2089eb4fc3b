"""Shaping tool results for the model: strict JSON text, capped in size with an explicit marker.

Rendering never raises: whatever a tool returns (sets, bytes, NaN, objects, tuple keys, deep nesting) becomes
JSON, so a write that succeeded is never reported as failed because its result was awkward to print.
"""

from __future__ import annotations

import json
import math
from typing import Any

DEFAULT_MAX_RESULT_CHARS = 4000
TRUNCATION_MARKER = "…[truncated: {shown} of {total} characters shown]"
MAX_DEPTH = 64
MAX_INT_BITS = 10_000  # Python refuses to print integers past about 4,300 digits
TOO_DEEP = "…[nested deeper than 64 levels]"


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
