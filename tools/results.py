"""Shaping tool results for the model: JSON text, capped in size with an explicit marker."""

from __future__ import annotations

import json
from typing import Any

DEFAULT_MAX_RESULT_CHARS = 4000
TRUNCATION_MARKER = "…[truncated: {shown} of {total} characters shown]"


def to_json_text(result: Any) -> str:
    """Results reach the model as JSON (`ensure_ascii=False`); strings pass through as they are."""
    if isinstance(result, str):
        return result
    if isinstance(result, bytes):
        return json.dumps({"ok": True, "bytes": len(result)})
    try:
        return json.dumps(result, ensure_ascii=False, default=_fallback)
    except (TypeError, ValueError):
        return json.dumps({"ok": True, "result": repr(result)[:200]}, ensure_ascii=False)


def _fallback(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def cap(text: str, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> str:
    """Cut an oversized result and say so, with the original size."""
    if len(text) <= max_chars:
        return text
    marker = TRUNCATION_MARKER.format(shown=max_chars, total=len(text))
    return text[:max_chars] + marker
